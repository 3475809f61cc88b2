"""A case's launch values are resolved once per run (README "Layout": the walk of block_size and
grid_cap): the driver's up-front check of the kill switches, the case itself and the baseline
launch of its shape share one resolution."""

from collections import Counter

import pytest

from moebench.core.cases import expand
from moebench.core.device import detect
from moebench.core.driver import Driver, Finished
from moebench.core.family import FamilySpec
from moebench.core.pipeline import Options
from moebench.core.spec import load_spec


@pytest.mark.parametrize("name", ["count-block", "act-grid"])
def test_each_case_is_resolved_once(monkeypatch, name):
    calls: Counter = Counter()
    real = FamilySpec.resolve

    def counting(self, variant, params, device, environ, origins=None):
        calls[(variant, tuple(sorted(params.items())))] += 1
        return real(self, variant, params, device, environ, origins)

    monkeypatch.setattr(FamilySpec, "resolve", counting)
    spec = load_spec(name)
    cases = [c for c in expand(spec, quick=True, verify=True) if c.variant != "upstream"][:12]
    drv = Driver(spec, detect(True), Options(timing=spec.timing, time_it=False), environ={})
    recs = [ev.record for ev in drv.run(cases) if isinstance(ev, Finished)]
    assert len(recs) == len(cases) and all(r.status == "ok" for r in recs), [r.error for r in recs]
    for c in cases:
        assert calls[(c.variant, tuple(sorted(c.params.items())))] == 1, c.id
    assert max(calls.values()) == 1, [k for k, n in calls.items() if n > 1]

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


def test_the_layer_builds_its_delegates_from_the_cases_one_resolve(monkeypatch):
    """A layer case: its count and act launches come from the case's one resolve (resolve_more), each
    family's resolve runs once for it, and the step built from unresolved parameters is refused
    instead of resolving them again."""
    calls: Counter = Counter()
    real = FamilySpec.resolve

    def counting(self, variant, params, device, environ, origins=None):
        calls[self.name] += 1
        return real(self, variant, params, device, environ, origins)

    monkeypatch.setattr(FamilySpec, "resolve", counting)
    spec = load_spec("layer")
    case = expand(spec, quick=True)[0]
    drv = Driver(spec, detect(True), Options(timing=spec.timing, time_it=False), environ={})
    rec = drv.run_case(case)
    assert rec.status == "ok", rec.error
    assert calls == Counter(layer=2, count=2, act=2)  # the case and its baseline launch, each once
    from moebench.families.layer import kernels as K

    inp = K.build_inputs(dict(case.params), "cpu", 0)
    with pytest.raises(ValueError, match="count launch is not resolved"):
        K._Step(inp, dict(case.params), detect(True))

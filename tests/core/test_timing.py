"""The timing core without a GPU: the group timer's rounds and stopping rules on a scripted clock,
the session's estimate over placement groups, timing overrides, and the untimed fast path (background
inputs, shape-major order) giving the same records."""

import math
import os
import re
from types import SimpleNamespace

import pytest

from clirun import run_cli
from test_pipeline import _runner as _session  # a count-block pipeline under the interpreter
from moebench.core import pipeline as S
from moebench.core import prefetch
from moebench.core.driver import Driver, Finished
from moebench.core.placements import Placements, Timer
from moebench.core import timing as T
from moebench.core.cases import expand
from moebench.core.device import detect
from moebench.core.records import Record
from moebench.core.spec import apply_timing_overrides, load_spec
from moebench.core.stats import between_groups_rel, median, noise_below, t975
from moebench.errors import UsageError


class FakeCuda:
    """torch.cuda as the group timer uses it: events around replays of graphs whose replay time
    is scripted per group (`times[g]` is called with the replay number)."""

    def __init__(self):
        self.now = 0.0

    def Event(self, enable_timing=True):  # noqa: N802 - torch's name
        cuda = self

        class Ev:
            def record(self):
                self.t = cuda.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) / 1e3  # ms

        return Ev()

    def synchronize(self):
        pass


def fake_timer(monkeypatch, times):
    """Patch the timing core onto a scripted clock: group g's graph replays in times[g](i) µs."""
    cuda = FakeCuda()
    monkeypatch.setattr(T, "torch", SimpleNamespace(cuda=cuda))
    made = []

    def capture(fns, launches, warmup, fresh=True):
        g = len(made)
        made.append(fns)
        count = [0]

        def replay():
            count[0] += 1
            cuda.now += times[g](count[0])

        return SimpleNamespace(replay=replay)

    monkeypatch.setattr(T, "capture", capture)
    return made


def test_one_group_is_the_single_graph_timer(monkeypatch):
    fake_timer(monkeypatch, [lambda i: 400.0 + (i % 3)])
    s = T.time_graph([lambda: None], launches_per_graph=200, warmup=2, min_replays=20, stop=noise_below(0.005))
    assert s.stopped_by == "noise" and s.replays == 20 and len(s.groups) == 1
    assert s.per_launch_us == s.groups[0] and abs(median(s.per_launch_us) - 401 / 200) < 1e-9


def test_groups_are_interleaved_and_added_until_they_agree(monkeypatch):
    # groups 0-2 disagree (2.0 / 2.4 / 2.0 µs per launch), later groups sit at 2.2: the spread
    # between groups keeps the interval wide until enough groups are in
    per = [2.0, 2.4, 2.0] + [2.2] * 13
    made = fake_timer(monkeypatch, [lambda i, p=p: 200 * p for p in per])

    def enough(groups):
        return between_groups_rel([median(g) for g in groups]) < 0.05

    s = T.time_groups(lambda g: [lambda: None], min_groups=3, max_groups=16, warmup=1, min_replays=20, batch=20,
                      stop=noise_below(0.005), enough=enough)
    assert s.stopped_by == "noise" and 3 < len(made) <= 16 and len(s.groups) == len(made)
    meds = [median(g) for g in s.groups]
    assert between_groups_rel(meds) < 0.05 <= between_groups_rel(meds[:-1])
    assert all(len(g) >= 20 for g in s.groups)
    # one round = a batch of every group in turn: the flat samples run group 0, 1, 2, 0, ...
    assert s.per_launch_us[:20] == s.groups[0][:20] and s.per_launch_us[20:40] == s.groups[1][:20]


def test_only_groups_that_need_samples_replay_and_growth_stops_at_the_time_cap(monkeypatch):
    # group 0 is quiet, group 1 noisy for its first 60 replays: group 0 stops at min_replays while
    # group 1 goes on; groups that never agree are added only while max_seconds lasts
    fake_timer(monkeypatch, [lambda i: 400.0, lambda i: 400.0 * (1 + (i % 2) * (i < 60))] + [lambda i: 400.0] * 14)
    s = T.time_groups(lambda g: [lambda: None], min_groups=2, max_groups=2, warmup=1, min_replays=20, batch=20,
                      stop=noise_below(0.005))
    assert s.stopped_by == "noise" and len(s.groups[0]) == 20 and len(s.groups[1]) > 20
    fake_timer(monkeypatch, [lambda i, g=g: 200.0 * (1 + g % 2) for g in range(16)])
    clock = iter(range(0, 10**6))
    monkeypatch.setattr(T.time, "perf_counter", lambda: float(next(clock)))
    s = T.time_groups(lambda g: [lambda: None], min_groups=2, max_groups=16, warmup=1, min_replays=20,
                      max_seconds=5.5, stop=noise_below(0.005), enough=lambda gs: False)
    assert s.stopped_by == "max_seconds" and 2 < len(s.groups) < 16


def test_group_cap_and_time_cap(monkeypatch):
    fake_timer(monkeypatch, [lambda i, p=p: 200 * p for p in (1.0, 2.0, 1.0, 2.0)])
    s = T.time_groups(lambda g: [lambda: None], min_groups=2, max_groups=4, warmup=1, stop=noise_below(0.005),
                      enough=lambda gs: False)
    assert s.stopped_by == "max_groups" and len(s.groups) == 4
    fake_timer(monkeypatch, [lambda i: 100.0 * (1 + (i % 2))])  # noisy: never under 0.5%
    clock = iter(range(0, 10**6))
    monkeypatch.setattr(T.time, "perf_counter", lambda: float(next(clock)))
    s = T.time_groups(lambda g: [lambda: None], warmup=1, min_replays=20, max_seconds=3.5, stop=noise_below(0.005))
    assert s.stopped_by == "max_seconds" and s.replays < 4000


def test_t_quantiles_and_the_between_group_interval():
    assert t975(1) == pytest.approx(12.706, abs=1e-3) and t975(9) == pytest.approx(2.262, abs=2e-3)
    assert t975(1000) == pytest.approx(1.962, abs=1e-3) and math.isinf(t975(0))
    assert math.isinf(between_groups_rel([2.0]))
    # 4 groups, sd 0.1 around 2.0: t(3) * 0.1 / 2 / 2.0
    meds = [1.9, 2.0, 2.0, 2.1]
    sd = (0.02 / 3) ** 0.5
    assert between_groups_rel(meds) == pytest.approx(3.1824 * sd / 2 / 2.0, rel=1e-4)


def test_the_timer_reports_the_mean_of_group_medians_with_their_interval():
    spec, run = _session(groups=3)
    groups = [[2.0] * 30, [2.2] * 30, [2.1] * 30]
    made = []

    def fake_time_groups(make_group, **kw):
        for g in range(kw["min_groups"]):
            made.append(make_group(g))
        assert kw["max_groups"] == 16 and kw["enough"] is not None  # a case whose groups disagree adds groups
        assert kw["enough"]([[2.0] * 30] * 3) and not kw["enough"]([[2.0] * 30, [2.2] * 30, [2.1] * 30])
        return T.Samples([x for g in groups for x in g], kw["launches_per_graph"], 90, 0.01, "noise", groups)

    timer = Timer(spec.timing, run.placements, time_groups=fake_time_groups,
                  clocks=lambda i: {"sm_mhz": None, "sm_max_mhz": None})
    case = expand(spec, quick=True)[-1]
    params, _ = spec.family.resolve(case.variant, case.params, run.device, {}, case.origins)
    sets = run.inputs(case)
    builder = spec.family.builder(case.variant)
    rebuilt = []

    def rebuild(inp):
        rebuilt.append(inp)
        return builder(inp, params, run.device)

    rec = Record("s", "count", case.id, case.variant, case.label, "ok", params=dict(case.params))
    timer.time(case, rec, [builder(s, params, run.device) for s in sets], launches_per_graph=200, rebuild=rebuild,
               sets=sets)
    t = rec.timing
    assert t["median_us"] == pytest.approx(2.1) and t["groups"] == 3 and t["estimator"] == "mean of group medians"
    assert t["group_medians_us"] == [2.0, 2.2, 2.1]
    within = between_groups_rel([2.0, 2.2, 2.1])
    assert t["rel_noise_within"] == pytest.approx(within, abs=1e-5)
    # the stated half-width: the within-run interval and the run-to-run component in quadrature
    assert t["rerun_rel"] == 0.005 and t["rel_noise"] == pytest.approx(math.hypot(within, 0.005), abs=1e-5)
    assert "x 3 groups" in t["l2"]
    # groups past the first time fresh copies of the same inputs: equal data, other memory
    assert len(made) == 3 and len(rebuilt) == 2 * len(sets)
    import torch

    assert torch.equal(rebuilt[0].routing_map, sets[0].routing_map)
    assert rebuilt[0].routing_map.data_ptr() != sets[0].routing_map.data_ptr()
    assert rebuilt[0].counts.data_ptr() - rebuilt[0].counts_buf.data_ptr() == \
        sets[0].counts.data_ptr() - sets[0].counts_buf.data_ptr()  # the view stays a view


def test_timing_overrides_and_their_errors(tmp_path, capsys):
    spec = load_spec("count-block")
    assert apply_timing_overrides(spec.timing, "groups=4, max_groups=8,placement_memory=private,max_seconds=0.5") == \
        ["groups", "max_groups", "placement_memory", "max_seconds"]
    assert (spec.timing.groups, spec.timing.max_groups, spec.timing.placement_memory) == (4, 8, "private")
    apply_timing_overrides(spec.timing, "groups=20")  # above the cap, which was not given: the cap follows
    assert (spec.timing.groups, spec.timing.max_groups) == (20, 20)
    for bad, says in [("groups=0", "between 1 and 64"), ("placement_memory=shared", "caching, private"),
                      ("grups=2", "did you mean 'groups'"), ("groups=4,max_groups=2", "max_groups"),
                      ("groups", "expected KEY=VALUE")]:
        with pytest.raises(UsageError, match=says):
            apply_timing_overrides(load_spec("count-block").timing, bad)
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--timing", "groups=x", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--timing groups: expected an integer" in err and "Traceback" not in err
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text((load_spec("count-block").path.read_text()) + "timing: {placement_memory: pooled}\n")
    code, _, err = run_cli(["validate", str(spec_file)], capsys)
    assert code == 2 and "timing.placement_memory: expected one of caching, private" in err


def test_a_timing_key_given_twice_is_refused():
    """Which of two values was meant is a guess: the spec's timing: block refuses a key twice too."""
    for twice in ("groups=4,groups=8", "groups=4, max_groups=8, groups = 4"):
        with pytest.raises(UsageError, match="^--timing groups: given more than once; give each key once$"):
            apply_timing_overrides(load_spec("count-block").timing, twice)


@pytest.mark.parametrize("value", ["abc", "-1", "2.5", "1000000"])
def test_a_bad_moebench_prefetch_is_a_usage_error_naming_it(value, tmp_path, capsys, monkeypatch):
    """Before: a million threads was an internal error (none could start), and a word or a negative
    number quietly meant the default."""
    most = max(prefetch.PREFETCH_MAX_WORKERS, os.cpu_count() or 1)
    with pytest.raises(UsageError, match=rf"^\$MOEBENCH_PREFETCH='{re.escape(value)}': expected a number of threads "
                       rf"from 0 \(none\) to {most} "):
        prefetch.prefetch_workers({"MOEBENCH_PREFETCH": value})
    assert [prefetch.prefetch_workers({"MOEBENCH_PREFETCH": v}) for v in ("0", " 2 ", str(most))] == [0, 2, most]
    if value == "abc":  # the run stops before its first case, exit 2 in one line (a million is not started here)
        monkeypatch.setenv("MOEBENCH_PREFETCH", value)
        code, _, err = run_cli(["verify", "count-block", "--quick", "--out", str(tmp_path)], capsys)
        assert code == 2 and "$MOEBENCH_PREFETCH='abc': expected a number of threads" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_untimed_runs_give_the_same_records_with_inputs_built_ahead(monkeypatch):
    spec = load_spec("count-block")
    cases = expand(spec, quick=True, verify=True)[::4]  # 10 cases, 10 shapes
    out = {}
    for workers in ("0", "2"):
        monkeypatch.setenv("MOEBENCH_PREFETCH", workers)
        drv = Driver(spec, detect(True), S.Options(timing=spec.timing, time_it=False))
        sess = drv.pipeline
        recs = [ev.record for ev in drv.run(cases) if isinstance(ev, Finished)]
        assert not sess._inputs and not sess._ref and not sess._base and not sess._ahead  # all forgotten
        out[workers] = {r.case_id: (r.status, r.checks) for r in recs}
    assert out["0"] == out["2"] and len(out["0"]) == len(cases)
    assert all(s == "ok" for s, _ in out["0"].values())
    # every shape built up front (what a timed run does before its first case): the same records
    sess = S.CasePipeline(spec, detect(True), S.Options(timing=spec.timing, time_it=False))
    ahead = prefetch._Ahead(sess, cases)
    ahead.build_all()
    assert len(sess._ahead) == len(cases) and all(f.done() for f in sess._ahead.values())
    assert {c.id: (r.status, r.checks) for c in cases for r in [sess.run_case(c)]} == out["0"]
    ahead.close()


def test_shape_major_keeps_first_appearance_order():
    spec = load_spec("act-grid")
    cases = expand(spec, verify=True)
    ordered = prefetch.shape_major(cases, spec.family.shape_params)
    assert sorted(c.id for c in ordered) == sorted(c.id for c in cases)
    keys = [tuple(c.params[k] for k in spec.family.shape_params) for c in ordered]
    runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
    assert len(runs) == len(set(keys))  # every shape's cases are contiguous


def test_the_interpreter_skips_overflow_checks_it_would_discard():
    from triton.runtime import interpreter

    from moebench.tritonpatch import skip_overflow_checks

    skip_overflow_checks()  # the CLI's backend and a family's load apply it (interpret.compat)
    opts = interpreter.interpreter_builder.options
    assert opts.sanitize_overflow is False and opts.debug is False
    assert skip_overflow_checks() is False  # already off: nothing to change


def test_placement_copies_fill_the_warm_budget_with_the_same_data():
    import torch

    spec, run = _session(placement_copies=8)
    case = expand(spec, quick=True)[-1]
    sets = run.inputs(case)
    touched = run.impl.touched_bytes(case.params)
    device = SimpleNamespace(l2_bytes=2 * touched * 20, sm_count=132, max_threads_per_sm=2048,
                             backend="interpret")  # room for 20
    place = Placements(spec.timing, device, time_it=True, impl=run.impl)
    copies = place.copies(case.params, sets)
    per_set = min(8, 20 // len(sets))
    assert len(copies) == len(sets) * (per_set - 1)
    c, pool = copies[0]
    assert pool is None and torch.equal(c.routing_map, sets[0].routing_map)
    assert c.routing_map.data_ptr() != sets[0].routing_map.data_ptr()
    spec.timing.l2 = "cold"
    assert place.copies(case.params, sets) == []

"""The case pipeline, the timer and the floors without a GPU: the clock-drop re-time on a scripted
clock, floors, a whole timed case through an injected timer, a missing triton."""

from types import SimpleNamespace

from clirun import run_cli
from moebench.core import pipeline as P
from moebench.core.cases import expand
from moebench.core.device import detect
from moebench.core.placements import Placements, Timer, floors
from moebench.core.records import Record
from moebench.core.spec import load_spec
from moebench.core.timing import Samples


def _runner(**timing):
    """A count-block pipeline under the interpreter."""
    spec = load_spec("count-block")
    for k, v in timing.items():
        setattr(spec.timing, k, v)
    return spec, P.CasePipeline(spec, detect(True), P.Options(timing=spec.timing), environ={})


def _fake_time_groups(calls, us=2.0):
    """time_groups as a GPU would answer: every sample `us` (+0.01 per call), one group."""

    def time_groups(make_group, **kw):
        calls.append(kw)
        make_group(0)
        xs = [us + 0.01 * len(calls)] * 40
        return Samples(xs, kw["launches_per_graph"], 40, 0.01, "noise", [xs])

    return time_groups


def test_a_case_whose_clock_dropped_is_timed_again():
    spec = load_spec("count-block")
    spec.timing.clock_retries, spec.timing.clock_drop = 2, 0.9
    clocks = iter([{"sm_mhz": 1980, "sm_max_mhz": 1980}, {"sm_mhz": 1200, "sm_max_mhz": 1980},  # dropped
                   {"sm_mhz": 1980, "sm_max_mhz": 1980}, {"sm_mhz": 1975, "sm_max_mhz": 1980}])  # recovered
    calls, slept, retimed = [], [], []
    placements = Placements(spec.timing, detect(True), time_it=True)
    timer = Timer(spec.timing, placements, time_groups=_fake_time_groups(calls), clocks=lambda i: next(clocks),
                  sleep=slept.append)
    case = expand(spec, quick=True)[0]
    rec = Record("s", "count", case.id, case.variant, case.label, "ok", params=dict(case.params))
    timed = timer.time(case, rec, [SimpleNamespace(launch=lambda: None)], launches_per_graph=200,
                       on_retime=retimed.append)
    assert len(calls) == 2 and rec.timing["clock_retimed"] == 1 and slept == [1.0]
    assert [(r.attempt, r.sm_mhz) for r in retimed] == [(1, 1200)]
    assert rec.timing["median_us"] == 2.02 and rec.timing["clock_ok"] is True
    assert timed.estimate_us == 2.02 and not timed.graphs and not calls[0]["keep"]


def test_floors_read_against_l2_or_dram_and_explain_below_one():
    spec = load_spec("count-block")
    device = SimpleNamespace(l2_bytes=60 << 20, sm_count=132, max_threads_per_sm=2048)
    ceilings = {"copy_l2_gbps": 6000.0, "copy_dram_gbps": 4000.0, "empty_us": 0.7, "empty_sms_us": 0.75}
    rec = Record("s", "act", "x", "v", "v", "ok", work={"bytes": 40_000_000, "ctas": 512})
    floors(rec, 6.0, 1, ceilings, device, spec.timing)  # one set of 40 MB: fits in 60 MB of L2
    w = rec.work
    assert w["floor_level"] == "l2" and abs(w["floor_us"] - 6.6667) < 1e-3 and w["x_floor"] == 0.9
    assert "below the L2 copy floor" in w["floor_note"]
    assert w["floor_plus_empty_us"] == round(w["floor_us"] + 0.75, 4)
    rec = Record("s", "act", "x", "v", "v", "ok", work={"bytes": 40_000_000, "ctas": 512})
    floors(rec, 12.0, 2, ceilings, device, spec.timing)  # two sets: 80 MB, past L2
    assert rec.work["floor_level"] == "dram" and rec.work["x_floor"] == 1.2 and "floor_note" not in rec.work


def test_a_timed_case_runs_through_an_injected_timer_and_clock(monkeypatch):
    """The whole pipeline of a timed case on the CPU: the kernel is checked for real, the timer is
    handed a scripted group timer and clock, and the compile accounting reads the injected clock."""
    from triton.runtime.interpreter import InterpretedFunction

    # under the interpreter a specialization is a function prepared for the first time in the
    # process (moebench.tritonpatch): start from none prepared, whatever ran before here
    monkeypatch.setattr(InterpretedFunction, "rewritten_fn", {}, raising=False)
    spec = load_spec("count-block")
    calls = []
    ticks = iter(range(1000))
    opts = P.Options(timing=spec.timing, time_it=True)
    dev = detect(True)
    placements = Placements(spec.timing, dev, time_it=True)
    timer = Timer(spec.timing, placements, time_groups=_fake_time_groups(calls, us=3.0),
                  clocks=lambda i: {"sm_mhz": None, "sm_max_mhz": None}, sleep=lambda s: None)
    run = P.CasePipeline(spec, dev, opts, environ={}, timer=timer, clock=lambda: float(next(ticks)))
    case = expand(spec, quick=True)[0]
    rec = run.run_case(case)
    assert rec.status == "ok" and rec.checks["ref_check"] == "exact", rec.error
    assert rec.timing["median_us"] == 3.01 and rec.timing["timer"] == "graph-replay"
    assert len(calls) == 1 and calls[0]["launches_per_graph"] == spec.timing.launches_per_graph
    assert rec.timing["compile_s"] == 1.0  # one tick of the injected clock around the compiling launch
    assert run.jit_specializations == 2 and run.phases["timing"] > 0  # the case's launch and the baseline's


def test_missing_triton_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("moebench.core.device.triton_version", lambda: None)
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 2 and "triton is not importable" in err and "Traceback" not in err


NO_GRID = '''
from moebench.families import Built, get_family

COUNT = get_family("count")
persistent = COUNT.builder("persistent")


@COUNT.variant("nogrid", params=("block_size", "num_warps", "grid"), doc="counts right; its geometry lacks grid")
def build_nogrid(inp, params, device):
    b = persistent(inp, params, device)
    return Built(b.launch, b.output, b.reset, {k: v for k, v in b.geometry.items() if k != "grid"})


@COUNT.variant("notbuilt", params=("block_size",), doc="returns the closure alone")
def build_notbuilt(inp, params, device):
    return persistent(inp, params, device).launch
'''


def test_a_built_without_a_geometry_key_fails_its_case_naming_the_key_and_the_variant(tmp_path, monkeypatch):
    from clirun import load_plugin

    load_plugin(monkeypatch, tmp_path / "nogrid.py", NO_GRID)
    spec, run = _runner()
    case = expand(spec, quick=True)[0]
    for variant, says in (("nogrid", "variant 'nogrid' of 'count': its Built's geometry has no 'grid', which the "
                                     "family's work model reads (it gives block_size, num_warps"),
                          ("notbuilt", "TypeError: variant 'notbuilt' of 'count': its builder returned ")):
        rec = run.run_case(type(case)(case.family, variant, variant, dict(case.params), f"{variant}-case"))
        assert rec.status == "error" and says in rec.error and "\n" not in rec.error, rec.error

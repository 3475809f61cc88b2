"""Session paths that need no GPU: the clock-drop re-time, floors, a missing triton."""

from types import SimpleNamespace

from clirun import run_cli
from moebench.core import session as S
from moebench.core.cases import expand
from moebench.core.device import detect
from moebench.core.records import Record
from moebench.core.spec import load_spec
from moebench.core.timing import Samples


def _runner(**timing):
    spec = load_spec("count-block")
    for k, v in timing.items():
        setattr(spec.timing, k, v)
    return spec, S.Session(spec, detect(True), S.Options(timing=spec.timing))


def test_a_case_whose_clock_dropped_is_timed_again(monkeypatch):
    spec, run = _runner(clock_retries=2, clock_drop=0.9)
    clocks = iter([{"sm_mhz": 1980, "sm_max_mhz": 1980}, {"sm_mhz": 1200, "sm_max_mhz": 1980},  # dropped
                   {"sm_mhz": 1980, "sm_max_mhz": 1980}, {"sm_mhz": 1975, "sm_max_mhz": 1980}])  # recovered
    monkeypatch.setattr(S, "nvml_clocks", lambda *a: next(clocks))
    calls = []

    def fake_time_groups(make_group, **kw):
        calls.append(1)
        make_group(0)
        xs = [2.0 + 0.01 * len(calls)] * 40
        return Samples(xs, kw["launches_per_graph"], 40, 0.01, "noise", [xs])

    monkeypatch.setattr("moebench.core.timing.time_groups", fake_time_groups)
    monkeypatch.setattr(S.time, "sleep", lambda s: None)
    case = expand(spec, quick=True)[0]
    rec = Record("s", "count", case.id, case.variant, case.label, "ok", params=dict(case.params))
    run._time(case, rec, [SimpleNamespace(launch=lambda: None)])
    assert len(calls) == 2 and rec.timing["clock_retimed"] == 1
    assert rec.timing["median_us"] == 2.02 and rec.timing["clock_ok"] is True


def test_floors_read_against_l2_or_dram_and_explain_below_one():
    spec, run = _runner()
    run.device = SimpleNamespace(l2_bytes=60 << 20, sm_count=132, max_threads_per_sm=2048)
    run.opts.ceilings = {"copy_l2_gbps": 6000.0, "copy_dram_gbps": 4000.0, "empty_us": 0.7, "empty_sms_us": 0.75}
    rec = Record("s", "act", "x", "v", "v", "ok", work={"bytes": 40_000_000, "ctas": 512})
    run._floors(rec, 6.0, [object()])  # one set of 40 MB: fits in 60 MB of L2
    w = rec.work
    assert w["floor_level"] == "l2" and abs(w["floor_us"] - 6.6667) < 1e-3 and w["x_floor"] == 0.9
    assert "below the L2 copy floor" in w["floor_note"]
    assert w["floor_plus_empty_us"] == round(w["floor_us"] + 0.75, 4)
    rec = Record("s", "act", "x", "v", "v", "ok", work={"bytes": 40_000_000, "ctas": 512})
    run._floors(rec, 12.0, [object(), object()])  # two sets: 80 MB, past L2
    assert rec.work["floor_level"] == "dram" and rec.work["x_floor"] == 1.2 and "floor_note" not in rec.work


def test_missing_triton_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("moebench.core.device.triton_version", lambda: None)
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 2 and "triton is not importable" in err and "Traceback" not in err

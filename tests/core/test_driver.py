"""The run driver's passes without a GPU: a pass runs where the cases run or the run is refused
before its first case, and the provenance lists only the passes that ran."""

import json
from types import SimpleNamespace

import pytest

from clirun import EchoPass, TallyPass, run_cli, small_count_spec
from moebench.core import passes as P
from moebench.core.cases import expand
from moebench.core.device import detect
from moebench.core.driver import Driver, Finished, Profiling, Summary
from moebench.core.pipeline import CasePipeline, Options
from moebench.core.spec import load_spec
from moebench.errors import UsageError
from moebench.passes.crosscheck import Nvbench

CUDA = SimpleNamespace(backend="cuda", name="NVIDIA H200")


@pytest.fixture
def cpu_passes(monkeypatch):
    monkeypatch.setitem(P.catalogue(), "echo", EchoPass)  # after the built-in ones
    monkeypatch.setitem(P.PASSES, "tally", TallyPass)


def test_each_built_in_pass_declares_where_it_runs():
    known = P.catalogue()
    assert list(known) == ["dobench", "nvbench", "profiler", "counters"]  # the order after_all hooks run in
    assert known["dobench"].in_workers and not known["dobench"].has_after_all()
    for name in ("nvbench", "profiler"):  # they need every case's graphs in one process
        assert not known[name].in_workers and known[name].has_after_all()


@pytest.mark.parametrize("name", ["dobench", "nvbench", "profiler"])
def test_a_pass_is_refused_where_it_cannot_run(name, monkeypatch):
    monkeypatch.setattr(Nvbench, "unavailable", lambda self: None)  # as where cuda.bench is installed
    with pytest.raises(UsageError, match=f"--cross-check {name}: needs timings on a CUDA device"):
        P.select((name,), backend="interpret", timed=False, workers=False)
    with pytest.raises(UsageError, match="untimed run"):
        P.select((name,), backend="cuda", timed=False, workers=False)
    assert [p.name for p in P.select((name,), backend="cuda", timed=True, workers=False)] == [name]
    if name == "dobench":  # per case: it runs inside each GPU's worker
        assert [p.name for p in P.select((name,), backend="cuda", timed=True, workers=True)] == [name]
    else:
        with pytest.raises(UsageError, match="cannot run with --devices"):
            P.select((name,), backend="cuda", timed=True, workers=True)


def test_the_driver_refuses_before_any_worker_starts(monkeypatch):
    monkeypatch.setattr(Nvbench, "unavailable", lambda self: None)
    spec = load_spec("count-block")
    spawned = []
    with pytest.raises(UsageError, match="--cross-check nvbench: cannot run with --devices"):
        Driver(spec, CUDA, Options(timing=spec.timing, time_it=True, cross=("dobench", "nvbench")),
               workers=lambda *a: spawned.append(a) or iter(()))
    assert not spawned


def test_passes_run_in_this_process_in_order_and_are_released(cpu_passes):
    spec = load_spec("count-block")
    cases = expand(spec, quick=True)[:3]
    drv = Driver(spec, detect(True), Options(timing=spec.timing, time_it=False, cross=("tally", "echo")), environ={})
    assert [p.name for p in drv.passes] == ["echo", "tally"]  # registration order, whatever the order asked
    events = list(drv.run(cases))
    summary = events[-1]
    assert isinstance(summary, Summary) and summary.passes == ["echo", "tally"]
    assert [e.what for e in events if isinstance(e, Profiling)] == ["tally pass"]
    assert "tally pass" in summary.phases
    for r in summary.records:
        assert r.cross["echo_builts"] == 1 and r.cross["tally"] == 3 and r.cross["tally_here"] is True


def test_the_provenance_lists_exactly_the_passes_that_ran(tmp_path, capsys, cpu_passes):
    spec = tmp_path / "small.yaml"
    spec.write_text(small_count_spec("small"))
    code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r"), "--cross-check", "echo"], capsys)
    assert code == 0, err
    doc = json.loads((tmp_path / "r" / "cpu-interpreter" / "small.json").read_text())
    assert doc["provenance"]["cross_checks"] == ["echo"]
    assert all("echo_pid" in r["cross"] and "tally" not in r["cross"] for r in doc["records"])
    code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "s")], capsys)
    doc = json.loads((tmp_path / "s" / "cpu-interpreter" / "small.json").read_text())
    assert code == 0 and doc["provenance"]["cross_checks"] == [] and all(not r["cross"] for r in doc["records"])


def test_a_case_keeps_nothing_for_a_pass_that_did_not_ask():
    """Without a pass that keeps graphs the timer is told not to keep them; nvbench keeps each
    case's graphs until its after-all hook, then lets them go."""
    spec = load_spec("count-block")
    asked = []

    def time_groups(make_group, **kw):
        from moebench.core.timing import Samples

        asked.append(kw["keep"])
        make_group(0)
        return Samples([2.0] * 30, kw["launches_per_graph"], 30, 0.01, "noise", [[2.0] * 30],
                       graphs=["graph"] if kw["keep"] else [])

    from moebench.core.placements import Placements, Timer

    dev = detect(True)
    nv = Nvbench()
    for passes in ([], [nv]):
        timer = Timer(spec.timing, Placements(spec.timing, dev, time_it=True), time_groups=time_groups,
                      clocks=lambda i: {"sm_mhz": None, "sm_max_mhz": None})
        run = CasePipeline(spec, dev, Options(timing=spec.timing, time_it=True), environ={}, timer=timer,
                           passes=passes)
        rec = run.run_case(expand(spec, quick=True)[0])
        assert rec.status == "ok", rec.error
    assert asked == [False, True]
    assert list(nv.kept.values())[0]["graphs"] == ["graph"]
    nv.release()
    assert not nv.kept


def test_record_identity_script_finds_a_changed_launch_and_a_missing_case(tmp_path, capsys):
    """scripts/record_identity.py: what a refactor of the driver is checked with (ids, statuses,
    checks, launch, work per record)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import record_identity

    recs = [{"case_id": "a", "status": "ok", "checks": {"ref_check": "exact"}, "launch": {"block_size": 64},
             "work": {"bytes": 10}, "timing": {"median_us": 1.0}},
            {"case_id": "b", "status": "ok", "checks": {}, "launch": {}, "work": {}, "timing": {}}]
    before, same, other = tmp_path / "b.json", tmp_path / "s.json", tmp_path / "o.json"
    before.write_text(json.dumps({"provenance": {}, "records": recs}))
    same.write_text(json.dumps({"provenance": {}, "records": [{**recs[0], "timing": {"median_us": 2.0}}, recs[1]]}))
    other.write_text(json.dumps({"provenance": {}, "records": [{**recs[0], "launch": {"block_size": 128}}]}))
    assert record_identity.main([str(before), str(same)]) == 0  # timings are not compared
    assert record_identity.main([str(before), str(other)]) == 1
    out = capsys.readouterr().out
    assert "b: only in the first file" in out and "a: launch differs" in out and "2 differences" in out


def test_an_interrupted_run_lists_no_after_all_pass_it_did_not_reach(cpu_passes):
    spec = load_spec("count-block")
    cases = expand(spec, quick=True)[:3]
    drv = Driver(spec, detect(True), Options(timing=spec.timing, time_it=False, cross=("echo", "tally")), environ={})
    events = drv.run(cases)
    first = next(e for e in events if isinstance(e, Finished))
    summary = events.throw(KeyboardInterrupt())  # Ctrl-C between cases: the driver sums up
    assert isinstance(summary, Summary) and not summary.complete
    assert summary.passes == ["echo"] and [r.case_id for r in summary.records] == [first.record.case_id]
    assert "tally" not in first.record.cross

"""The cross-check passes without a GPU: the nvbench pass's one-line refusal where cuda.bench is
missing, and its plumbing from nvbench's JSON to per-launch times on the records."""

import json
from types import SimpleNamespace

import pytest

from clirun import run_cli
from moebench.core.records import Record
from moebench.core.passes import AfterAll, CaseDone
from moebench.passes import timers as T
from moebench.passes.crosscheck import Nvbench


def test_nvbench_missing_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cuda.bench", None)
    code, out, err = run_cli(["sweep", "count-block", "--quick", "--cross-check", "nvbench", "--out", str(tmp_path)],
                             capsys)
    assert code == 2 and "Traceback" not in err
    line = [x for x in err.splitlines() if x.strip()]
    assert len(line) == 1 and "--cross-check nvbench: cuda.bench is not importable here" in line[0]
    assert "moebench[nvbench]" in line[0] and not any(tmp_path.iterdir())


def test_nvbench_results_become_per_launch_times_on_the_records(monkeypatch):
    doc = {"benchmarks": [{"name": "moebench_graph", "states": [
        {"axis_values": [{"name": "graph", "type": "int64", "value": "1"}], "is_skipped": False, "summaries": [
            {"tag": "nv/cold/time/gpu/mean", "data": [{"name": "value", "type": "float64", "value": "0.0004"}]},
            {"tag": "nv/cold/time/gpu/stdev/relative", "data": [{"name": "value", "value": "0.003"}]},
            {"tag": "nv/cold/sample_size", "data": [{"name": "value", "value": "250"}]},
            {"tag": "nv/batch/time/gpu/mean", "data": [{"name": "value", "value": "0.00039"}]}]},
        {"axis_values": [{"name": "graph", "value": "0"}], "is_skipped": True, "summaries": []}]}]}
    items = [T.NvbenchItem(lambda: None, 200), T.NvbenchItem(lambda: None, 200)]
    got = T._nvbench_results(json.loads(json.dumps(doc)), items)
    assert got[0] == {} and got[1]["cold_us"] == pytest.approx(2.0) and got[1]["batch_us"] == pytest.approx(1.95)
    assert got[1]["cold_noise_pct"] == pytest.approx(0.3) and got[1]["cold_samples"] == 250

    nv = Nvbench()
    recs = []
    for i, m in enumerate((2.0, 1.96)):
        r = Record("s", "count", f"c{i}", "persistent", "persistent", "ok", timing={"median_us": m})
        nv.after_case(CaseDone(SimpleNamespace(id=r.case_id), r, [], True, [object(), object()], [], None, 100))
        recs.append(r)
    seen = []

    def fake_graphs(items, device_index=0, log_dir=None):
        seen.extend(it.launches for it in items)
        return [{}, got[1]]

    monkeypatch.setattr(T, "nvbench_graphs", fake_graphs)
    monkeypatch.setattr("torch.cuda.current_device", lambda: 0)
    nv.after_all(AfterAll(None, None, None, [], recs))
    assert seen == [200, 200]  # two graphs of 100 launches per item
    nv.release()
    assert not nv.kept  # the graphs go once the pass is done
    assert "no measurement" in recs[0].cross["cross_error"]
    c = recs[1].cross
    assert c["nvbench_batch_us"] == 1.95 and c["nvbench_delta_pct"] == pytest.approx(100 * (1.96 - 1.95) / 1.95, abs=0.01)
    assert c["nvbench_cold_us"] == 2.0 and c["nvbench_noise_pct"] == 0.3 and c["nvbench_cold_samples"] == 250

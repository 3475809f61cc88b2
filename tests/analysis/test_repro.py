"""scripts/repro.py on synthetic runs: copies of results/h200/count-block.json with perturbed
medians, as two device calls. Calibrate's model, the pair coverage arithmetic (as stated and
re-stated with the model), the real `moebench compare --fail-on-regression` between every pair, the
spread between calls, which runs calibrated and which validate."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from moebench.core import noise as N
from moebench.core.records import Record
from moebench.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "results" / "h200" / "count-block.json"


@pytest.fixture(scope="module")
def repro():
    spec = importlib.util.spec_from_file_location("repro", ROOT / "scripts" / "repro.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["repro"] = mod  # a dataclass looks its module up there
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("repro", None)


def _base():
    doc = json.loads(SRC.read_text())
    for r in doc["records"]:
        t = r["timing"]
        t["rel_noise"], t["rel_noise_within"], t["rerun_rel"] = round(math.hypot(0.002, 0.005), 5), 0.002, 0.005
        t["timing_wall_s"] = 0.1
    doc["provenance"]["noise_model"] = {"setting": "auto", "path": None}
    return doc


def _write_call(folder: Path, factors: list[dict], wall=12.0, host="h1", gpu=None):
    """One device call: a run per entry of `factors` ({case_id: factor on the median}); the first
    case id of the file is the 'jumpy' one a test perturbs. `gpu`: the UUID the runs' provenance names."""
    folder.mkdir(parents=True)
    runs = []
    for k, f in enumerate(factors, 1):
        doc = _base()
        if gpu:
            doc["provenance"]["device"]["uuid"] = gpu
        else:
            doc["provenance"]["device"].pop("uuid", None)
        for r in doc["records"]:
            r["timing"]["median_us"] = round(r["timing"]["median_us"] * f.get(r["case_id"], 1.0), 4)
        doc["provenance"]["timestamp"] = f"{folder.name} run {k}"  # real runs' files never coincide
        name = f"count-block-run{k}.json"
        (folder / name).write_text(json.dumps(doc))
        runs.append({"sweep": "count-block", "run": k, "file": name, "wall_s": wall, "exit_code": 0})
    (folder / "repro.json").write_text(json.dumps({"host": host, "gpus": [], "runs": runs}))


def _compare_in_process(a, b, gate_line):
    """`moebench compare A B --fail-on-regression` through the CLI's own main() in this process: the
    same verdicts as repro.compare_exit's subprocess (whose own test is below), without 20 starts."""
    import contextlib
    import io

    from moebench.cli import main

    argv, sys.argv = sys.argv, ["moebench", "compare", str(a), str(b), "--fail-on-regression"]
    text = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
    return code, gate_line(text.getvalue())


def _jumpy():
    return json.loads(SRC.read_text())["records"][0]["case_id"]


def test_calibrate_writes_the_model_and_report_tells_calibration_from_validation(tmp_path, repro):
    j = _jumpy()
    # call 1: the jumpy case at 1.00, 1.10, 1.00 (a ~10% bimodal jump); call 2: 1.10 and 1.00
    _write_call(tmp_path / "call1", [{}, {j: 1.10}, {}])
    _write_call(tmp_path / "call2", [{j: 1.10}, {}], host="h2")
    [model_path] = repro.calibrate([tmp_path / "call1"], tmp_path / "noise")
    doc = json.loads(model_path.read_text())
    assert model_path.name == "count-block.json" and doc["runs"] == 3 and doc["device"] == "NVIDIA H200"
    base = {r["case_id"]: r["timing"]["median_us"] for r in _base()["records"]}
    vals = [round(base[j] * f, 4) for f in (1.0, 1.1, 1.0)]
    assert doc["cases"][j]["rerun_rel"] == pytest.approx((max(vals) - min(vals)) / min(vals) / math.sqrt(2), abs=1e-5)
    others = [v["rerun_rel"] for c, v in doc["cases"].items() if c != j]
    assert others and all(x == 0.005 for x in others)  # identical medians: the floor
    N.load(model_path)  # the file reads back as a model

    text = repro.report([tmp_path / "call1", tmp_path / "call2"], tmp_path / "noise",
                        compare=lambda a, b: _compare_in_process(a, b, repro.gate_line))
    # 5 runs, 10 pairs: the jumpy case disagrees in the 6 pairs of a 1.00 run with a 1.10 run
    n_cases = len(base)
    assert f"{10 * n_cases - 6}/{10 * n_cases} case pairs" in text
    # re-stated with the model every pair agrees
    assert f"{10 * n_cases}/{10 * n_cases} (100.0%)" in text
    assert text.count("calibration (in-sample)") == 3 and text.count("| validation |") == 2
    assert "3 of these 5 runs calibrated the model" in text
    # `compare --fail-on-regression` (the CLI's main, in this process): 3 of the 10 pairs go
    # 1.00 -> 1.10 at ±0.5% (SLOWER, false alarms); with the model's term none is called SLOWER
    assert "files as written**: 7 of 10 exit 0; 3 false alarms" in text
    # ... and the gate passes every pair: the jumpy case's difference is inside its measured ±10%
    # run-to-run term, which cannot resolve 5%, so it is NOISY (named, not vouched for), never SLOWER
    assert "files re-stated with the model**: 10 of 10 exit 0; 0 false alarms" in text
    # the spread and the targets
    assert f"1 of {n_cases} cases over 3% (target: none) -> **NOT met**" in text
    # between calls: call 1's mean of the jumpy case is 1.033x, call 2's 1.05x: 1.6% apart
    assert "**Between device calls** (call1, call2; hosts h1, h2)" in text and "-> **met**" in text
    # wall and replay share (20 records x 0.1 s of 12 s)
    assert f"| 12.0 | {0.1 * n_cases:.1f} ({100 * 0.1 * n_cases / 12:.0f}%) |" in text


def test_two_folders_of_one_call_are_one_gpu_and_folders_of_one_name_are_told_apart(tmp_path, repro):
    j = _jumpy()
    # call 5 ran a 'fresh' and a 'cached' folder on one GPU, call 6 the same on another GPU 2% slower at j
    _write_call(tmp_path / "call5" / "fresh", [{}, {}], gpu="GPU-aaaaaaaa-1111")
    _write_call(tmp_path / "call5" / "cached", [{}, {}], gpu="GPU-aaaaaaaa-1111")
    _write_call(tmp_path / "call6" / "fresh", [{j: 1.02}, {j: 1.02}], gpu="GPU-bbbbbbbb-2222")
    _write_call(tmp_path / "call6" / "cached", [{j: 1.02}, {j: 1.02}], gpu="GPU-bbbbbbbb-2222")
    dirs = [tmp_path / c / a for c in ("call5", "call6") for a in ("fresh", "cached")]
    text = repro.report(dirs, None, compare=lambda a, b: (0, "no regression"))
    assert "| count-block-run1.json | call6/cached | GPU-bbbbbbbb |" in text
    assert ("**Between GPUs** (GPU-aaaaaaaa, GPU-bbbbbbbb; calls call5/fresh, call5/cached, call6/fresh, "
            "call6/cached): spread of the GPUs' mean per case max 2.00%") in text


def test_holdout_says_what_a_model_of_the_other_gpus_covers(tmp_path, repro):
    j = _jumpy()
    n = len(_base()["records"])
    # GPUs a and b agree everywhere; GPU c reads the jumpy case 10% slower, every time
    _write_call(tmp_path / "a", [{}, {}], gpu="GPU-aaaaaaaa-1")
    _write_call(tmp_path / "b", [{}, {}], gpu="GPU-bbbbbbbb-2")
    _write_call(tmp_path / "c", [{j: 1.10}, {j: 1.10}], gpu="GPU-cccccccc-3")
    text = repro.holdout([tmp_path / "a", tmp_path / "b", tmp_path / "c"], made_by="`a test`")
    assert "Made by `a test`." in text and "6 runs on 3 GPUs." in text
    # c held out: a model of a and b (the 0.5% floor) misses c's level in its 8 pairs with them
    assert f"| GPU-cccccccc | 2 | 4 (2) | {8 * (n - 1)}/{8 * n} (" in text
    # a held out: the model of b and c carries c's 10% as a term, and covers a against both
    assert f"| GPU-aaaaaaaa | 2 | 4 (2) | {8 * n}/{8 * n} (100.0%) | {n}/{n} |" in text
    assert f"All held-out pairs: {24 * n - 8}/{24 * n} (" in text


def test_the_real_compare_gate_between_every_pair_counts_false_alarms(tmp_path, repro):
    j = _jumpy()
    _write_call(tmp_path / "c", [{}, {j: 1.10}, {}])
    text = repro.report([tmp_path / "c"], None)
    # 1.00 vs 1.10 with ±0.5% each: SLOWER by the real CLI (exit 1), a false alarm; 1.10 -> 1.00 is FASTER
    assert "2 of 3 exit 0; 1 false alarms" in text
    assert "count-block-run1.json -> c/count-block-run2.json: exit 1:" in text and "SLOWER" in text


def test_the_gate_on_files_restated_with_the_model(tmp_path, repro):
    j = _jumpy()
    _write_call(tmp_path / "c", [{}, {j: 1.10}, {}])
    repro.calibrate([tmp_path / "c"], tmp_path / "noise")
    calls = []

    def fake_compare(a, b):  # records what the gate was given; the real CLI is the previous test's
        calls.append((json.loads(Path(a).read_text()), json.loads(Path(b).read_text())))
        return 0, "no regression"

    text = repro.report([tmp_path / "c"], tmp_path / "noise", compare=fake_compare)
    assert "files re-stated with the model**: 3 of 3 exit 0; 0 false alarms" in text
    restated = calls[-1][0]["records"]
    by = {r["case_id"]: r["timing"]["rel_noise"] for r in restated}
    term = json.loads((tmp_path / "noise" / "count-block.json").read_text())["cases"][j]["rerun_rel"]
    assert by[j] == pytest.approx(round(math.hypot(0.002, term), 5))
    assert [by[c] for c in by if c != j][0] == pytest.approx(round(math.hypot(0.002, 0.005), 5))


def test_restated_derives_the_within_part_of_older_files(repro):
    from moebench.core.records import Record

    m = N.NoiseModel("m.json", "0" * 64, "NVIDIA H200", 3, "c", "s", {"a": 0.04})
    r = Record("s", "count", "a", "p", "p", "ok", timing={"median_us": 2.0, "rel_noise": 0.013, "rerun_rel": 0.005})
    within = math.sqrt(0.013 ** 2 - 0.005 ** 2)
    assert repro.restated(r, m) == pytest.approx(math.hypot(within, 0.04))
    assert repro.restated(r, None) == 0.013


def test_run_moves_each_fresh_process_result_and_records_its_wall(tmp_path, repro):
    # a stand-in `python`: writes the sweep's JSON where `moebench sweep --out OUT --format json` would
    fake = tmp_path / "fakepy"
    fake.write_text("#!/bin/sh\n"
                    "out=$6; mkdir -p $out/h200; cp " + str(SRC) + " $out/h200/$4.json\n")
    fake.chmod(0o755)
    m = repro.run(2, ["count-block"], tmp_path / "d", ["--quick"], python=str(fake), log=lambda s: None)
    assert [e["file"] for e in m["runs"]] == ["count-block-run1.json", "count-block-run2.json"]
    assert all(e["exit_code"] == 0 and e["wall_s"] >= 0 for e in m["runs"])
    assert m["runs"][0]["command"].endswith("sweep count-block --out " + str(tmp_path / "d" / "_out")
                                            + " --format json --quick")
    assert json.loads((tmp_path / "d" / "repro.json").read_text())["runs"] == m["runs"]
    assert not list((tmp_path / "d" / "_out").glob("*/count-block.json"))
    # with --quick the sweep writes <sweep>-quick.json: found as well
    fake.write_text("#!/bin/sh\n"
                    "out=$6; mkdir -p $out/h200; cp " + str(SRC) + " $out/h200/$4-quick.json\n")
    m = repro.run(1, ["count-block"], tmp_path / "q", ["--quick"], python=str(fake), log=lambda s: None)
    assert m["runs"][0]["file"] == "count-block-run1.json" and (tmp_path / "q" / "count-block-run1.json").exists()


def test_fresh_ceilings_deletes_the_cached_ceilings_before_every_run(tmp_path, repro):
    # the stand-in `python` says whether it found device.json, then writes one (as a sweep would)
    fake = tmp_path / "fakepy"
    seen = tmp_path / "seen.txt"
    fake.write_text("#!/bin/sh\n"
                    "out=$6; mkdir -p $out/h200; [ -f $out/h200/device.json ] && echo cached >> " + str(seen)
                    + " || echo missing >> " + str(seen) + "\n"
                    "echo '{}' > $out/h200/device.json; cp " + str(SRC) + " $out/h200/$4.json\n")
    fake.chmod(0o755)
    m = repro.run(2, ["count-block"], tmp_path / "d", [], python=str(fake), log=lambda s: None)
    assert seen.read_text().split() == ["missing", "cached"] and not m["runs"][0]["fresh_ceilings"]
    seen.unlink()
    m = repro.run(2, ["count-block"], tmp_path / "e", [], python=str(fake), log=lambda s: None, fresh_ceilings=True)
    assert seen.read_text().split() == ["missing", "missing"] and m["runs"][1]["fresh_ceilings"]


# ----------------------------------------------------------------------------------- calibrate


def _runs(medians_per_run):
    prov = {"device": {"name": "NVIDIA H200"}, "sweep": "s", "git_commit": "c0ffee", "timing": {"rerun_rel": 0.005}}
    out = []
    for i, meds in enumerate(medians_per_run):
        recs = [Record("s", "count", cid, "p", "p", "ok", params={"tokens": 1}, timing={"median_us": m})
                for cid, m in meds.items()]
        out.append((f"run{i + 1}", f"sha{i}", prov, recs))
    return out


def test_calibrate_takes_the_worst_pair_over_sqrt2_floored(repro):
    doc = repro.noise_model(_runs([{"a": 5.0, "b": 2.0}, {"a": 5.5, "b": 2.001}, {"a": 5.0, "b": 2.0}]))
    a, b = doc["cases"]["a"], doc["cases"]["b"]
    assert a["spread_rel"] == pytest.approx(0.1)
    # (max - min) / min / sqrt(2), rounded up: 0.0707107 -> 0.07072
    assert a["rerun_rel"] == 0.07072
    assert b["rerun_rel"] == 0.005  # 0.05% apart: the floor
    assert doc["runs"] == 3 and doc["commit"] == "c0ffee" and doc["device"] == "NVIDIA H200"
    assert [c["file"] for c in doc["calibrated_on"]] == ["run1", "run2", "run3"]
    # any two runs now agree within sqrt(ha^2 + hb^2) with h = median x term, and compare's noise
    # sqrt(2) x term covers the change relative to either run as BASE
    h = [m * a["rerun_rel"] for m in (5.0, 5.5)]
    assert 0.5 <= math.hypot(*h)
    assert 0.5 / 5.0 <= math.hypot(a["rerun_rel"], a["rerun_rel"])


def test_calibrate_refuses_one_run_or_mixed_devices(repro):
    with pytest.raises(UsageError, match="at least 2"):
        repro.noise_model(_runs([{"a": 1.0}]))
    runs = _runs([{"a": 1.0}, {"a": 1.0}])
    runs[1] = (runs[1][0], runs[1][1], {**runs[1][2], "device": {"name": "other"}}, runs[1][3])
    with pytest.raises(UsageError, match="mix devices"):
        repro.noise_model(runs)
    with pytest.raises(UsageError, match="was timed in two runs"):  # interpreter runs: nothing timed
        repro.noise_model(_runs([{"a": None}, {"a": None}]))


def test_a_calibrated_model_reads_back(repro, tmp_path):
    doc = repro.noise_model(_runs([{"a": 5.0}, {"a": 5.5}]))
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    m = N.load(p, tmp_path)
    assert m.cases == {"a": doc["cases"]["a"]["rerun_rel"]} and m.runs == 2 and m.sweep == "s"

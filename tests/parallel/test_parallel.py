"""Beyond one GPU, on the CPU: which shard a process runs (--shard, Slurm arrays, Slurm tasks), the
cost-balanced split, the worker pool (two interpreter workers standing in for two GPUs, one of
them dying), and `moebench merge` of shard files from real sweeps."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import run_cli, small_count_spec
from moebench import cli
from moebench.parallel import merge, workers
from moebench.parallel import shards as sh
from moebench.core.cases import Case, expand
from moebench.errors import BackendError, UsageError
from moebench.core.pipeline import Options

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    """Tests run the same inside a Slurm job: no SLURM_* variable leaks into a sweep."""
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)


# ============================================================================ parse_shard


def test_shard_flag():
    assert sh.parse_shard("0/2", {}) == (0, 2)
    assert sh.parse_shard(" 3 / 4 ", {}) == (3, 4)
    # one part is no split: the way to run a whole sweep inside an array job
    assert sh.parse_shard("0/1", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4"}) is None
    # the flag wins over the environment
    assert sh.parse_shard("1/3", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4"}) == (1, 3)


@pytest.mark.parametrize("text", ["3/2", "2/2", "0/0", "-1/2", "1", "a/b", "1/2/3", "", "١/٢"])
def test_shard_flag_errors(text):
    with pytest.raises(UsageError) as e:
        sh.parse_shard(text, {})
    assert str(e.value) == f"--shard: expected I/N with 0 <= I < N, got {text!r}"
    assert "\n" not in str(e.value)


def test_shard_from_slurm_array():
    env = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert sh.parse_shard(None, env) == (2, 4)
    # --array=1-4: ids 1..4 are shards 0..3
    assert sh.parse_shard(None, {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4",
                                   "SLURM_ARRAY_TASK_MIN": "1"}) == (0, 4)
    assert sh.parse_shard(None, {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4",
                                   "SLURM_ARRAY_TASK_MIN": "1"}) == (3, 4)
    # --array=10-16:2: ids 10, 12, 14, 16
    step = {"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_STEP": "2"}
    assert sh.parse_shard(None, {**step, "SLURM_ARRAY_TASK_ID": "14"}) == (2, 4)
    # no COUNT (older Slurm): from MIN, MAX and STEP
    assert sh.parse_shard(None, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0",
                                   "SLURM_ARRAY_TASK_MAX": "3"}) == (3, 4)
    # an array of one task is no split
    assert sh.parse_shard(None, {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}) is None


def test_shard_from_slurm_tasks():
    assert sh.parse_shard(None, {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4)
    assert sh.parse_shard(None, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # a plain one-task job
    assert sh.parse_shard(None, {"SLURM_PROCID": "0"}) is None
    assert sh.parse_shard(None, {}) is None


@pytest.mark.parametrize("env, needle", [
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4"}, "SLURM_ARRAY_TASK_ID=5"),
    ({"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "10",
      "SLURM_ARRAY_TASK_STEP": "2"}, "steps of 2"),  # --array=1,3,7-style lists have no index
    ({"SLURM_ARRAY_TASK_ID": "0"}, "SLURM_ARRAY_TASK_COUNT is not"),
    ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "4"}, "SLURM_ARRAY_TASK_ID='x'"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, "SLURM_PROCID=4"),
])
def test_shard_env_errors(env, needle):
    with pytest.raises(UsageError) as e:
        sh.parse_shard(None, env)
    assert needle in str(e.value) and "--shard I/N" in str(e.value)


def test_shard_stem():
    assert sh.shard_stem("count-block-quick", 1, 4) == "count-block-quick.shard1of4"
    assert sh.unshard_stem("count-block-quick.shard1of4") == "count-block-quick"
    assert sh.unshard_stem("count-block") == "count-block"


# ============================================================================ partition


def _case(i: int, buffer_tokens: int, tokens: int = 0, topk: int = 8) -> Case:
    return Case("count", "persistent", "persistent",
                {"buffer_tokens": buffer_tokens, "tokens": tokens, "topk": topk, "block_size": 128}, f"c{i:04d}")


def test_estimate_cost_grows_with_the_shape():
    small, big = _case(0, 512, 7), _case(1, 16384, 4096)
    assert sh.estimate_cost(small) >= sh.CASE_OVERHEAD
    assert sh.estimate_cost(big) - sh.CASE_OVERHEAD == (16384 + 4096) * 8
    act = Case("act", "capped", "capped", {"op": "silu_mul_bounded", "rows": 1024, "live_rows": 256,
                                            "ffn": 768, "in_cols": 0}, "a")
    assert sh.estimate_cost(act) == sh.CASE_OVERHEAD + (1024 + 256) * (1536 + 768)
    host = Case("combine", "new", "new", {"world": 8, "topk": 6}, "h")
    assert sh.estimate_cost(host) == sh.CASE_OVERHEAD  # host-only: the overhead alone


def _loads(shards):
    return [sum(sh.estimate_cost(c) for c in s) for s in shards]


def _check_split(cases, shards):
    ids = [c.id for s in shards for c in s]
    assert sorted(ids) == sorted(c.id for c in cases) and len(set(ids)) == len(ids)  # each case once
    pos = {c.id: i for i, c in enumerate(cases)}
    for s in shards:
        assert [pos[c.id] for c in s] == sorted(pos[c.id] for c in s)  # original order kept


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=1 << 22), min_size=0, max_size=60),
       n=st.integers(min_value=1, max_value=9))
def test_partition_properties(sizes, n):
    cases = [_case(i, b) for i, b in enumerate(sizes)]
    shards = sh.partition(cases, n)
    assert len(shards) == n
    _check_split(cases, shards)
    assert sh.partition(cases, n) == shards  # deterministic
    if cases:  # the list-scheduling bound: no shard above the mean load plus the largest case
        costs = [sh.estimate_cost(c) for c in cases]
        assert max(_loads(shards)) <= sum(costs) / n + max(costs)


def test_partition_skewed_costs_balance():
    # one giant case, a few large ones, many small ones: the giant gets a shard of its own
    cases = [_case(i, 256) for i in range(40)]
    cases.insert(7, _case(100, 1 << 24))
    cases += [_case(200 + i, 1 << 20) for i in range(6)]
    shards = sh.partition(cases, 4)
    _check_split(cases, shards)
    giant = next(s for s in shards if any(c.id == "c0100" for c in s))
    assert [c.id for c in giant] == ["c0100"]
    rest = sorted(_loads([s for s in shards if s is not giant]))
    costs = [sh.estimate_cost(c) for c in cases if c.id != "c0100"]
    assert rest[-1] - rest[0] <= max(costs)  # the others within one case of each other
    # balanced by cost, not by count: round-robin would put ~3x the work on its heaviest shard
    rr = [cases[k::4] for k in range(4)]
    assert max(_loads(shards)) < max(_loads(rr))


def test_partition_edges():
    cases = [_case(i, 64) for i in range(3)]
    assert sh.partition(cases, 1) == [cases]
    shards = sh.partition(cases, 5)
    assert sum(len(s) for s in shards) == 3 and sum(not s for s in shards) == 2
    with pytest.raises(UsageError):
        sh.partition(cases, 0)


def test_partition_independent_of_hash_seed():
    code = ("from moebench.core.spec import load_spec; from moebench.core.cases import expand; from moebench.parallel import shards as sh; "
            "cs = expand(load_spec('count-block'), verify=True, quick=True); "
            "print([[c.id for c in s] for s in sh.partition(cs, 3)])")
    outs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    from moebench.core.spec import load_spec

    here = [[c.id for c in s] for s in sh.partition(expand(load_spec("count-block"), verify=True, quick=True), 3)]
    assert outs.pop().strip() == str(here)


# ============================================================================ devices


def test_parse_devices(monkeypatch):
    monkeypatch.setattr(workers, "_visible_gpus", lambda: ["NVIDIA H200"] * 4)
    assert workers.parse_devices("all") == [0, 1, 2, 3]
    assert workers.parse_devices("2, 0") == [2, 0]
    for bad, needle in (("4", "no GPU 4; this process sees 4 (0..3)"), ("0,0", "listed twice"),
                        ("", "expected all or comma-separated GPU indices"), ("0,x", "expected all or comma-separated")):
        with pytest.raises(UsageError) as e:
            workers.parse_devices(bad)
        assert needle in str(e.value)
    monkeypatch.setattr(workers, "_visible_gpus", lambda: ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
    with pytest.raises(UsageError, match="one device class"):
        workers.parse_devices("all")
    monkeypatch.setattr(workers, "_visible_gpus", lambda: [])
    for text in ("all", "0"):
        with pytest.raises(BackendError, match="no CUDA device is visible"):
            workers.parse_devices(text)


@pytest.mark.parametrize("bad", ["x", "0,,1", "-1", "all,0"])
def test_a_malformed_devices_value_is_named_before_the_backend_is_asked(tmp_path, capsys, bad):
    """On the CPU, `--devices x` said "this run is on CPU"; the value itself is what is wrong."""
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--devices", bad, "--out", str(tmp_path)], capsys)
    line = err.strip()
    assert code == 2 and "\n" not in line and "Traceback" not in line, err
    assert f"--devices: expected all or comma-separated GPU indices like 0,1,3, got {bad!r}" in line
    assert "this run is on" not in line and not any(tmp_path.iterdir())


def test_run_on_devices_pins_the_physical_gpu(monkeypatch):
    """Indices are as this process sees them: inside CUDA_VISIBLE_DEVICES=3,5, GPU 1 is physical 5."""
    seen = {}

    def fake(spec, cases, keys, interpret, **kw):
        seen.update(spec=spec, keys=list(keys), interpret=interpret, **kw)
        return iter(())

    monkeypatch.setattr(workers, "_run_workers", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    from moebench.core.spec import load_spec

    spec = load_spec("count-block")
    list(workers.pool(spec, [1, 0], Options(timing=spec.timing))([], [], {}))
    assert seen["keys"] == ["5", "3"] and seen["labels"] == ["GPU 1", "GPU 0"] and seen["interpret"] is False
    assert seen["spec"] is spec


# ============================================================================ the worker pool, on the CPU

TINY = small_count_spec("tiny")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from moebench.core.device import detect
    from moebench.core.pipeline import CasePipeline
    from moebench.core.spec import load_spec

    p = tmp_path_factory.mktemp("tiny") / "tiny.yaml"
    p.write_text(TINY)
    spec = load_spec(str(p))
    cases = expand(spec)
    opts = Options(timing=spec.timing, time_it=False)
    runner = CasePipeline(spec, detect(True), opts)
    return spec, cases, opts, {c.id: runner.run_case(c) for c in cases}


def _same(a, b):
    return (a.case_id, a.status, a.params, a.checks, a.launch, a.work) == \
           (b.case_id, b.status, b.params, b.checks, b.launch, b.work)


def test_two_workers_match_a_single_process_run(tiny):
    spec, cases, opts, single = tiny
    assert len(cases) == 12
    recs = list(workers._run_workers(spec, cases, ["w0", "w1"], True, opts=opts))
    assert Counter(r.case_id for r in recs) == Counter(c.id for c in cases)  # each case exactly once
    for r in recs:
        assert r.status == "ok", r.error
        assert _same(r, single[r.case_id])
        assert r.timing.get("median_us") is None  # no timings on the CPU
        assert r.sweep == "tiny" and r.checks["ref_check"] == "exact"
    assert {r.timing["worker"] for r in recs} <= {"CPU w0", "CPU w1"}  # each record names its worker


# Variants that crash their worker for one case (tokens 5, block 256) or raise the CUDA error that
# poisons a context (tokens 0, block 64), and run the persistent kernel otherwise.
CRASHING = """
import os, signal

from moebench.families import get_family

COUNT = get_family("count")
persistent = COUNT.builder("persistent")
PARAMS = ("block_size", "num_warps", "grid")


@COUNT.variant("dies", params=PARAMS, doc="kills its process at tokens 5, block 256")
def build_dies(inp, params, device):
    if params["tokens"] == 5 and params["block_size"] == 256:
        os.kill(os.getpid(), signal.SIGKILL)
    return persistent(inp, params, device)


@COUNT.variant("sticky", params=PARAMS, doc="an illegal memory access at tokens 0, block 64")
def build_sticky(inp, params, device):
    if params["tokens"] == 0 and params["block_size"] == 64:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return persistent(inp, params, device)
"""


def _crashing(tmp_path, monkeypatch, variant):
    """The tiny spec with the persistent kernel beside a CRASHING variant, its cases, and the
    persistent record of each shape (what the crashing variant's other cases must equal)."""
    from clirun import load_plugin
    from moebench.core.spec import load_spec

    load_plugin(monkeypatch, tmp_path / "crashing.py", CRASHING)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("[persistent, nonpersistent]", f"[persistent, {variant}]"))
    spec = load_spec(str(path))
    return spec, expand(spec), Options(timing=spec.timing, time_it=False)


def _shape(r):
    return tuple(sorted((k, v) for k, v in r.params.items()))


def _like_persistent(recs, skip):
    """Every record but `skip` ok, and the crashing variant's equal to the persistent kernel's."""
    base = {_shape(r): r for r in recs if r.variant == "persistent"}
    for r in recs:
        if r.case_id != skip:
            assert r.status == "ok" and r.checks["ref_check"] == "exact", r.error
            b = base[_shape(r)]
            assert (r.checks, r.launch, r.work) == (b.checks, b.launch, b.work)


def test_a_dying_worker_costs_its_case_only(tmp_path, monkeypatch):
    spec, cases, opts = _crashing(tmp_path, monkeypatch, "dies")
    victim = next(c for c in cases if c.variant == "dies" and c.params["tokens"] == 5
                  and c.params["block_size"] == 256).id
    recs = list(workers._run_workers(spec, cases, ["w0", "w1"], True, opts=opts))
    assert Counter(r.case_id for r in recs) == Counter(c.id for c in cases)
    dead = [r for r in recs if r.case_id == victim]
    assert dead[0].status == "error" and dead[0].params == next(c.params for c in cases if c.id == victim)
    assert dead[0].error in (f"worker on CPU w{i} died (exit code -9, SIGKILL)" for i in (0, 1))
    _like_persistent(recs, victim)  # the survivor drained the rest of the queue


def test_a_worker_leaves_after_a_sticky_cuda_error(tmp_path, monkeypatch, capsys):
    """After an illegal memory access every later launch in that process fails: the worker hands the
    record back and leaves, and the other worker runs the rest."""
    spec, cases, opts = _crashing(tmp_path, monkeypatch, "sticky")
    victim = next(c for c in cases if c.variant == "sticky" and c.params["tokens"] == 0
                  and c.params["block_size"] == 64).id
    recs = list(workers._run_workers(spec, cases, ["w0", "w1"], True, opts=opts))
    assert Counter(r.case_id for r in recs) == Counter(c.id for c in cases)
    by = {r.case_id: r for r in recs}
    fault = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert by[victim].status == "error" and by[victim].error.startswith(fault)
    _like_persistent(recs, victim)
    err = capsys.readouterr().err
    assert re.search(r"left after [0-9]+ cases?: RuntimeError: CUDA error: an illegal memory access", err)


def test_closing_the_pool_stops_its_workers(tiny):
    """What an interrupted sweep does: stop reading after the first record; no worker outlives it."""
    import multiprocessing as mp

    spec, cases, opts, _ = tiny
    gen = workers._run_workers(spec, cases, ["w0", "w1"], True, opts=opts)
    first = next(gen)
    assert first.case_id in {c.id for c in cases}
    gen.close()
    assert not [p for p in mp.active_children() if p.name.startswith("moebench-")]


def test_no_worker_starts(tiny, capsys):
    spec, cases, opts, _ = tiny
    with pytest.raises(BackendError) as e:
        list(workers._run_workers(dataclasses.replace(spec, sha256="0" * 64), cases, ["w0"], True, opts=opts))
    assert str(e.value).startswith("no worker started: CPU w0: UsageError: ")
    assert "changed since the sweep started" in str(e.value)


# ============================================================================ merge


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """count-block --quick, unsharded and as shards 0/2 and 1/2, through the CLI."""
    root = tmp_path_factory.mktemp("swept")

    class Cap:  # run_cli wants capsys; a module fixture cannot have it
        def readouterr(self):
            return type("C", (), {"out": "", "err": ""})()

    runs = {}
    for name, extra in (("whole", []), ("s0", ["--shard", "0/2"]), ("s1", ["--shard", "1/2"])):
        code, _, _ = run_cli(["sweep", "count-block", "--quick", "--out", str(root / name), *extra], Cap())
        assert code == 0
        d = root / name / "cpu-interpreter"
        runs[name] = next(iter(sorted(d.glob("count-block-quick*.json"))))
    return root, runs


def _doc(p):
    return json.loads(Path(p).read_text())


def test_shard_files_and_merge_equal_the_whole_run(swept, tmp_path, capsys):
    _, runs = swept
    assert runs["s0"].name == "count-block-quick.shard0of2.json"
    assert runs["s1"].name == "count-block-quick.shard1of2.json"
    a, b, whole = _doc(runs["s0"]), _doc(runs["s1"]), _doc(runs["whole"])
    assert a["provenance"]["shard"] == [0, 2] and b["provenance"]["shard"] == [1, 2]
    assert a["records"] and b["records"]
    code, out, err = run_cli(["merge", str(runs["s1"]), str(runs["s0"]), "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "count-block: merged 2 files, 9 records: 9/9 exact; complete" in out
    merged = _doc(tmp_path / "count-block-quick.json")
    ids = [r["case_id"] for r in merged["records"]]
    assert ids == [r["case_id"] for r in whole["records"]]  # the unsharded run's cases, in its order
    for m, w in zip(merged["records"], whole["records"]):
        assert (m["status"], m["checks"], m["params"]) == (w["status"], w["checks"], w["params"])
    prov = merged["provenance"]
    assert prov["complete"] is True and prov["n_records"] == 9 and prov["shard"] is None
    assert [f["file"] for f in prov["merged_from"]] == [str(runs["s1"]), str(runs["s0"])]
    assert prov["spec_sha256"] == whole["provenance"]["spec_sha256"]
    assert (tmp_path / "count-block-quick.csv").read_text().count("\n") == 10
    assert "9/9 exact" in (tmp_path / "count-block-quick.md").read_text()


def test_merge_of_a_missing_shard_is_incomplete(swept, tmp_path, capsys):
    _, runs = swept
    code, out, _ = run_cli(["merge", str(runs["s0"]), "-o", str(tmp_path / "part")], capsys)
    assert code == 1
    assert "INCOMPLETE (shard 1 of 2 missing" in out and "cases of the spec missing" in out
    assert _doc(tmp_path / "part.json")["provenance"]["complete"] is False


def _edited(src: Path, dst: Path, edit) -> Path:
    doc = _doc(src)
    edit(doc)
    dst.write_text(json.dumps(doc))
    return dst


@pytest.mark.parametrize("what, edit, shown", [
    ("spec sha256", lambda d: d["provenance"].update(spec_sha256="f" * 64), "ffffffffffff"),
    ("device", lambda d: d["provenance"]["device"].update(name="NVIDIA H200"), "'NVIDIA H200'"),
    ("timing settings", lambda d: d["provenance"]["timing"].update(l2="cold"), "l2: 'warm' -> 'cold'"),
    ("timing settings", lambda d: d["provenance"]["timing"].update(max_seconds=2.0), "max_seconds: 1.0 -> 2.0"),
    ("kill-switch settings", lambda d: d["provenance"]["settings"]["switches"].update(MCORE_COUNT_TOKENS_BLOCK="64"),
     "$MCORE_COUNT_TOKENS_BLOCK: None -> '64'"),
], ids=["spec", "device", "l2", "noise-only", "switch"])
def test_merge_refuses_mixed_inputs(swept, tmp_path, capsys, what, edit, shown):
    _, runs = swept
    other = _edited(runs["s1"], tmp_path / "other.json", edit)
    code, out, err = run_cli(["merge", str(runs["s0"]), str(other), "-o", str(tmp_path / "m")], capsys)
    assert code == 2
    line = err.strip()
    assert "\n" not in line and line.startswith(f"error: cannot merge: {what} differ")
    assert str(runs["s0"]) in line and str(other) in line and shown in line
    assert not (tmp_path / "m.json").exists()


def test_merge_duplicates(swept, tmp_path, capsys):
    _, runs = swept
    copy = _edited(runs["s0"], tmp_path / "copy.json", lambda d: None)
    code, out, _ = run_cli(["merge", str(runs["s0"]), str(runs["s1"]), str(copy), "-o", str(tmp_path / "m")],
                           capsys)
    assert code == 0 and "4 duplicates kept once" in out
    assert len(_doc(tmp_path / "m.json")["records"]) == 9

    def differ(d):
        d["records"][0]["checks"]["ref_check"] = "mismatch at 3"

    bad = _edited(runs["s0"], tmp_path / "bad.json", differ)
    code, _, err = run_cli(["merge", str(runs["s0"]), str(bad), "-o", str(tmp_path / "m2")], capsys)
    assert code == 2 and "with different results" in err and str(bad) in err


def test_merge_refuses_to_overwrite_an_input(swept, capsys):
    _, runs = swept
    code, _, err = run_cli(["merge", str(runs["s0"]), "-o", str(runs["s0"])[: -len(".json")]], capsys)
    assert code == 2 and "is one of the inputs" in err


def test_sweep_takes_its_shard_from_a_slurm_array(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--dry-run", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    code, out, err = run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    doc = _doc(tmp_path / "cpu-interpreter" / "count-block-quick.shard1of3.json")
    assert doc["provenance"]["shard"] == [1, 3]
    from moebench.core.spec import load_spec

    want = sh.partition(expand(load_spec("count-block"), quick=True), 3)[1]
    assert [r["case_id"] for r in doc["records"]] == [c.id for c in want]


def test_passes_run_inside_two_workers_and_the_summary_lists_what_ran(tiny, monkeypatch):
    """--devices on a fake two-device setup (two interpreter workers): a per-case pass runs inside
    each worker, an after-all pass runs here after both, and the driver lists exactly those two;
    a pass that needs every case's graphs in one process is refused before any worker starts."""
    import os

    from clirun import EchoPass, TallyPass
    from moebench.core import passes as P
    from moebench.core.device import detect
    from moebench.core.driver import Driver
    from moebench.passes.crosscheck import Nvbench

    spec, cases, _, single = tiny
    monkeypatch.setitem(P.catalogue(), "echo", EchoPass)  # after the built-in ones
    monkeypatch.setitem(P.PASSES, "tally", TallyPass)
    opts = Options(timing=spec.timing, time_it=False, cross=("echo", "tally"))
    sent = []

    def two_devices(cases, passes, environ):
        sent.append([p.name for p in passes])
        return workers._run_workers(spec, cases, ["w0", "w1"], True, opts=opts, passes=passes, environ=environ)

    summary = list(Driver(spec, detect(True), opts, workers=two_devices, environ=dict(os.environ)).run(cases))[-1]
    assert sent == [["echo"]]  # only the per-case pass travels to the workers
    assert summary.passes == ["echo", "tally"] and summary.complete
    recs = summary.records
    assert sorted(r.case_id for r in recs) == sorted(c.id for c in cases)
    for r in recs:
        assert r.status == "ok" and _same(r, single[r.case_id])
        assert r.cross["echo_pid"] != os.getpid() and r.cross["echo_builts"] == 1  # ran in a worker
        assert r.cross["tally"] == len(cases) and r.cross["tally_here"] is False  # here, after the workers
    assert len({r.cross["echo_pid"] for r in recs}) <= 2
    cuda = type("Dev", (), {"backend": "cuda", "name": "fake"})()
    monkeypatch.setattr(Nvbench, "unavailable", lambda self: None)  # as where cuda.bench is installed
    for name in ("nvbench", "profiler"):
        with pytest.raises(UsageError, match=f"--cross-check {name}: cannot run with --devices"):
            Driver(spec, cuda, Options(timing=spec.timing, time_it=True, cross=(name,)), workers=two_devices)
    assert sent == [["echo"]]  # refused: no worker was asked for


# A pass registered by a plugin file (moebench.core.driver says how): per case, the process that
# ran the case; after all of them, how many records there are.
PLUGIN_PASS = """
import os

from moebench.core.passes import Pass, register


@register
class Stamp(Pass):
    name = "stamp"
    cuda_only = False

    def after_case(self, ctx):
        ctx.record.cross["stamp_pid"] = os.getpid()


@register
class Count(Pass):
    name = "count-records"
    cuda_only = False

    def after_all(self, ctx):
        for r in ctx.records:
            r.cross["records"] = len(ctx.records)
"""


def test_a_pass_a_plugin_registers_runs_inside_two_workers(tiny, tmp_path, monkeypatch):
    """--devices on the fake two-device setup: the workers load the plugin before they unpickle the
    passes, so its per-case pass runs in each worker and its after-all pass here (before: every
    worker failed to start, 'no worker started', exit 2)."""
    from clirun import load_plugin
    from moebench.core.device import detect
    from moebench.core.driver import Driver
    from moebench.passes.crosscheck import Nvbench

    spec, cases, _, single = tiny
    load_plugin(monkeypatch, tmp_path / "stamp.py", PLUGIN_PASS)
    opts = Options(timing=spec.timing, time_it=False, cross=("stamp", "count-records"))

    def two_devices(cases, passes, environ):
        return workers._run_workers(spec, cases, ["w0", "w1"], True, opts=opts, passes=passes, environ=environ)

    summary = list(Driver(spec, detect(True), opts, workers=two_devices, environ=dict(os.environ)).run(cases))[-1]
    assert summary.complete and summary.passes == ["stamp", "count-records"]
    for r in summary.records:
        assert r.status == "ok" and _same(r, single[r.case_id])
        assert r.cross["stamp_pid"] != os.getpid() and r.cross["records"] == len(cases)
        assert r.timing["worker"] in ("CPU w0", "CPU w1")


def test_interpreter_workers_fork_from_a_warm_server_and_gpu_workers_are_spawned():
    """On a GPU each worker is a fresh interpreter (it pins CUDA_VISIBLE_DEVICES before torch loads);
    under the interpreter the workers fork from a server that imported torch and triton once, and
    none of moebench (each child loads the kernels after it sets TRITON_INTERPRET)."""
    from moebench.parallel import workers

    assert workers._context(False).get_start_method() == "spawn"
    ctx = workers._context(True)
    assert ctx.get_start_method() == "forkserver"
    assert "torch" in workers.WARM and not any(m.startswith("moebench") for m in workers.WARM)


def test_verify_takes_shard_and_a_sharded_run_says_it_is_one(tmp_path, capsys, monkeypatch):
    """docs/scale-out.md promised `--shard` on verify, which had none, while Slurm's variables
    sharded it silently: "20/20 exact" read as the whole 40-case matrix."""
    from clirun import run_cli

    code, _, err = run_cli(["verify", "count-block", "--quick", "--shard", "1/2", "--out", str(tmp_path)], capsys)
    assert code == 0 and "shard 1 of 2 (--shard): 20 of the spec's 40 cases" in err
    assert (tmp_path / "cpu-interpreter" / "count-block-verify-quick.shard1of2.json").is_file()
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    code, _, err = run_cli(["verify", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 0 and "shard 0 of 2 (Slurm): 20 of the spec's 40 cases" in err

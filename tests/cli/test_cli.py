"""The CLI end to end on the CPU: outputs and their schema, failing cases, interruption and
--resume. Kernels run under the Triton interpreter."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

import warm
from clirun import long_count_spec, run_cli, small_count_spec
from moebench.core.family import get_family
from moebench.families.count import kernels as count

ROOT = Path(__file__).resolve().parents[2]


def write_spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(body)
    return p


SMALL = small_count_spec("small")


def test_quick_sweep_writes_results_with_provenance(tmp_path, capsys):
    code, out, err = run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "9/9 exact" in out and "no timings" in out
    d = tmp_path / "cpu-interpreter"
    doc = json.loads((d / "count-block-quick.json").read_text())
    prov = doc["provenance"]
    for key in ("device", "spec_sha256", "spec_path", "command", "seed", "timestamp", "git_commit", "moebench",
                "timing", "quick", "complete", "jit_specializations", "compile_s_total"):
        assert key in prov, key
    assert prov["complete"] is True and prov["quick"] is True and prov["device"]["backend"] == "interpret"
    recs = doc["records"]
    assert len(recs) == 9
    for r in recs:
        assert r["status"] == "ok"
        assert r["checks"]["ref_check"] == "exact" and r["checks"]["baseline_equal"] is True
        assert r["timing"].get("median_us") is None  # no GPU: never a made-up time
        assert set(r["params"]) >= {"block_size", "tokens", "buffer_tokens", "topk", "local_experts"}
    assert any(r["checks"]["counts_sum"] > 0 for r in recs)  # not vacuous
    csv = (d / "count-block-quick.csv").read_text().splitlines()
    assert csv[0].startswith("sweep,family,case_id,variant,label,status") and len(csv) == 10
    md = (d / "count-block-quick.md").read_text()
    assert "9/9 exact" in md and "| block_size \\ tokens |" in md
    assert not list(d.glob("*.partial.jsonl"))


def test_dry_run_lists_cases_and_writes_nothing(tmp_path, capsys):
    code, out, _ = run_cli(["sweep", "count-block", "--dry-run", "--out", str(tmp_path)], capsys)
    assert code == 0 and "20 cases" in out
    assert not any(tmp_path.iterdir())


def test_failing_cases_are_recorded_and_exit_1(tmp_path, capsys, monkeypatch):
    spec = write_spec(tmp_path, SMALL)

    def broken(inp, params, device):
        raise RuntimeError("CompilationError: simulated compile failure")

    monkeypatch.setattr(get_family("count").variants["nonpersistent"], "builder", broken)
    real_ref = count.reference

    def off_by_one(inp, params):  # a wrong reference: every non-empty case must fail verification
        ref = real_ref(inp, params).clone()
        if params["tokens"]:
            ref[0] += 1
        return ref

    monkeypatch.setattr(count, "reference", off_by_one)
    code, out, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r")], capsys)
    assert code == 1
    doc = json.loads((tmp_path / "r" / "cpu-interpreter" / "small.json").read_text())
    status = [(r["variant"], r["params"]["tokens"], r["status"]) for r in doc["records"]]
    assert len(status) == 12  # the sweep went on after failures
    assert all(s == "error" for v, _, s in status if v == "nonpersistent")
    assert all(s == ("mismatch" if t else "ok") for v, t, s in status if v == "persistent")
    assert "simulated compile failure" in err and "Traceback" not in err
    assert "✗" in out


def test_case_too_large_is_refused_before_allocating(tmp_path, capsys):
    spec = write_spec(tmp_path, SMALL.replace("buffer_tokens: 64", "buffer_tokens: 4000000000000"))
    code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r")], capsys)
    assert code == 1
    assert "would not fit" in err and "Traceback" not in err


def test_show_and_list(tmp_path, capsys):
    assert run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)[0] == 0
    res = tmp_path / "cpu-interpreter" / "count-block-quick.json"
    code, out, _ = run_cli(["show", str(res), "--metric", "counts_sum"], capsys)
    assert code == 0 and "block_size \\ tokens" in out
    code, _, err = run_cli(["show", str(res), "--metric", "nope"], capsys)
    assert code == 2 and "--metric: no column 'nope'" in err
    doc = json.loads(res.read_text())
    doc["provenance"]["page"]["pivot"]["rows"] = "nope"  # the file's own pivot: not an option the user gave
    res.write_text(json.dumps(doc))
    code, _, err = run_cli(["show", str(res)], capsys)
    assert code == 2 and f"{res}: provenance.page.pivot.rows: no column 'nope'" in err
    code, out, _ = run_cli(["list"], capsys)
    assert code == 0 and "persistent" in out and "count-block" in out and "qwen3-30b-a3b" in out


def test_bad_cli_options_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--format", "xml", "--out", str(tmp_path)], capsys)
    assert code == 2 and "unknown format 'xml'" in err
    code, _, err = run_cli(["sweep", "count-block", "--timing", "l2=lukewarm", "--dry-run"], capsys)
    assert code == 2 and "--timing l2" in err


# ----------------------------------------------------------------------------- interruption

MANY = long_count_spec("many", seeds=5)  # 20 cases


def _start(spec: Path, out: Path, *extra):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1"}
    return warm.Popen(["sweep", spec, "--out", out, *extra], cwd=ROOT, env=env)


def _wait_partial(path: Path, n: int, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and sum('"record"' in line for line in path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended early: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("no progress")


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupt_saves_completed_records_then_resume_finishes(tmp_path, sig, code):
    spec = write_spec(tmp_path, MANY)
    out = tmp_path / "r"
    d = out / "cpu-interpreter"
    proc = _start(spec, out)
    _wait_partial(d / "many.partial.jsonl", 3, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert "INCOMPLETE: " in stderr and "of 20 cases" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr
    doc = json.loads((d / "many.json").read_text())
    assert doc["provenance"]["complete"] is False
    done = {r["case_id"] for r in doc["records"]}
    assert 3 <= len(done) < 20
    assert (d / "many.partial.jsonl").exists()  # the stream stays beside INCOMPLETE files: --resume reads it

    proc = _start(spec, out, "--resume")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert f"--resume: kept {len(done)} of 20 cases" in stderr
    doc = json.loads((d / "many.json").read_text())
    ids = [r["case_id"] for r in doc["records"]]
    assert len(ids) == 20 == len(set(ids)) and done <= set(ids)
    assert doc["provenance"]["complete"] is True
    assert not (d / "many.partial.jsonl").exists()  # complete: the stream is gone


def test_devices_refused_without_cuda(tmp_path, capsys):
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--devices", "all", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--devices: one worker per CUDA device" in err


def test_help_lists_the_exit_codes(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for bit in ("0 ok", "1 a case failed", "2 a usage, spec or results-file error", "3 an internal error",
                "130/143 interrupted"):
        assert bit in text, bit


def test_timings_table_adds_up_to_the_wall(tmp_path, capsys):
    """--timings: a table on stderr of where the wall went, whose rows add up to its total; the
    results JSON carries the rows up to its writing (provenance.wall_phases). -v prints it too."""
    spec = write_spec(tmp_path, SMALL)
    code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r"), "--timings"], capsys)
    assert code == 0, err
    table = err[err.index("Where the wall time went"):]
    for row in ("python start", "parsing the command line", "backend (import torch, triton)",
                "spec and cases", "cases: compile + checked launch", "writing the results files", "other", "total"):
        assert row in table, row
    phases = json.loads((tmp_path / "r" / "cpu-interpreter" / "small.json").read_text())["provenance"]["wall_phases"]
    rows = {k: v for k, v in phases.items() if k != "total"}
    assert abs(sum(rows.values()) - phases["total"]) < 1e-6 and all(v >= 0 for v in rows.values())
    assert any(k.startswith("cases: ") for k in rows) and "cases" not in rows  # split into the cases' phases
    assert not any("background" in k for k in rows)  # threads that overlapped the cases are not added
    code, _, err = run_cli(["-v", "verify", "count-block", "--quick", "--out", str(tmp_path / "v")], capsys)
    assert code == 0 and "Where the wall time went" in err
    code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "w")], capsys)
    assert code == 0 and "Where the wall time went" not in err


def test_list_family_names_every_key_a_builder_receives(capsys):
    """`list FAMILY`: every parameter a builder's params can hold (shape or launch, type, default,
    meaning), the keys resolving adds, the variants' kill switches; checked against what resolving a
    real case of each built-in sweep hands a builder."""
    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.spec import load_spec

    code, out, _ = run_cli(["list", "count"], capsys)
    assert code == 0
    line = next(x for x in out.splitlines() if x.split()[:1] == ["local_expert_start"])
    assert line.split()[1:5] == ["shape", "int", "default", "0"] and "first local expert id" in out
    assert next(x for x in out.splitlines() if x.split()[:1] == ["block_size"]).split()[1] == "launch"
    assert "block_size from $MCORE_COUNT_TOKENS_BLOCK, shipped default 128" in " ".join(out.split())
    for sweep in ("count-block", "act-grid", "layer"):
        spec = load_spec(sweep)
        code, out, _ = run_cli(["list", spec.family.name, "--json"], capsys)
        assert code == 0
        doc = json.loads(out)
        listed = {p["name"] for p in doc["params"]} | {a["name"] for a in doc["added_at_resolve"]}
        assert all(p["help"] for p in doc["params"])
        for case in expand(spec, quick=True):
            params, _ = spec.family.resolve(case.variant, case.params, detect(True), {})
            assert set(params) <= listed, (sweep, set(params) - listed)
    assert {a["name"] for a in doc["added_at_resolve"]} == {"count_resolved", "act_resolved"}  # the layer's


def test_list_unknown_family_is_a_usage_error_naming_the_families(capsys):
    code, out, err = run_cli(["list", "nope"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "unknown family 'nope'" in err and all(f in err for f in ("count", "act", "layer", "combine"))


@pytest.mark.parametrize("variant,hint", [("histogram", "pass --plugin FILE.py, or list it in the spec's plugins:"),
                                          ("capped", "'capped' is a variant of family act")])
def test_unknown_variant_names_the_plugin_option_and_the_known_variants(tmp_path, capsys, variant, hint):
    spec = write_spec(tmp_path, SMALL.replace("variants: [persistent, nonpersistent]", f"variants: [{variant}]"))
    code, _, err = run_cli(["validate", str(spec)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"variants[0].variant: unknown variant {variant!r}; family 'count' has persistent, shipped" in err
    assert hint in err

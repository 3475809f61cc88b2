"""Issue 14, line by line: every input that lost data, answered wrongly or ran unbounded now gives
exit 2 (or 1 for a failed case) with one line, and nothing completed is lost. Kernels run under
the Triton interpreter on tiny shapes; interruptions are the session's own path for Ctrl-C (a
KeyboardInterrupt between cases), or a real SIGKILL / SIGINT to a subprocess where the test is
about the process dying."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

import warm
from clirun import interrupt_after, run_cli, small_count_spec
from moebench.core import store
from moebench.core.records import Record, load_results, read_stream
from moebench.core.store import OutputLock
from moebench.core.pipeline import CasePipeline

ROOT = Path(__file__).resolve().parents[2]
SMALL = small_count_spec("small")  # 12 cases
DEV = "cpu-interpreter"


def spec_file(tmp_path: Path, body: str = SMALL, name: str = "small.yaml") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def sweep(capsys, spec: Path, out: Path, *extra):
    return run_cli(["sweep", str(spec), "--out", str(out), *map(str, extra)], capsys)


def records_of(path: Path) -> list[Record]:
    return load_results(path)[1]


def stream_records(path: Path) -> list[Record]:
    return [e.record for e in read_stream(path).entries]


def one_line(err: str) -> bool:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    return len(lines) == 1 and "Traceback" not in err


# ============================================================================ data lost


def test_empty_format_is_refused_before_any_case(tmp_path, capsys, monkeypatch):
    spec = spec_file(tmp_path)
    ran = []
    monkeypatch.setattr(CasePipeline, "run_case", lambda self, case: ran.append(case))
    code, _, err = sweep(capsys, spec, tmp_path / "r", "--format", ",")
    assert code == 2 and "--format: expected a comma list" in err and one_line(err)
    assert not ran and not (tmp_path / "r").exists()
    code, _, err = run_cli(["merge", str(tmp_path / "x.json"), "--format", ","], capsys)
    assert code == 2 and "--format: expected a comma list" in err


def test_csv_only_run_resumes_from_the_stream_and_is_never_shrunk(tmp_path, capsys, monkeypatch):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    csv = out / DEV / "small.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 5)
        code, _, err = sweep(capsys, spec, out, "--format", "csv")
    assert code == 130 and "INCOMPLETE: 5 of 12 cases" in err
    assert len(csv.read_text().splitlines()) == 6
    with monkeypatch.context() as m:  # a rerun without --resume, interrupted sooner: the 5-record CSV stays
        interrupt_after(m, 2)
        code, _, err = sweep(capsys, spec, out, "--format", "csv")
    assert code == 130 and "which holds 5 records" in err
    assert len(csv.read_text().splitlines()) == 6
    code, _, err = sweep(capsys, spec, out, "--format", "csv", "--resume")
    assert code == 0 and "--resume: kept 5 of 12 cases" in err  # the stream, not the missing .json
    assert len(csv.read_text().splitlines()) == 13
    assert not (out / DEV / "small.partial.jsonl").exists()


def test_torn_last_line_keeps_every_intact_record(tmp_path, capsys, monkeypatch):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    stream = out / DEV / "small.partial.jsonl"
    with monkeypatch.context() as m:
        interrupt_after(m, 6)
        assert sweep(capsys, spec, out)[0] == 130
    intact = stream.read_bytes()
    stream.write_bytes(intact + intact.splitlines(keepends=True)[-1][:40])  # killed mid-write
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        code, _, err = sweep(capsys, spec, out, "--resume")
    assert code == 130 and "--resume: kept 6 of 12 cases" in err and "torn last line" in err
    assert all(line.endswith(b"}") for line in stream.read_bytes().split(b"\n")[:-1])  # nothing glued on
    code, _, err = sweep(capsys, spec, out, "--resume")
    assert code == 0 and "--resume: kept 8 of 12 cases" in err
    assert len({r.case_id for r in records_of(out / DEV / "small.json")}) == 12


def test_a_second_writer_into_the_same_output_exits_2_naming_the_holder(tmp_path, capsys, monkeypatch):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    (out / DEV).mkdir(parents=True)
    monkeypatch.setattr(sys, "argv", ["moebench", "sweep", "small", "--out", "r"])
    with OutputLock(out / DEV, "small"):
        code, _, err = sweep(capsys, spec, out)
    assert code == 2 and one_line(err)
    assert f"pid {os.getpid()}: moebench sweep small --out r" in err
    assert not (out / DEV / "small.partial.jsonl").exists()
    assert sweep(capsys, spec, out)[0] == 0  # released: the next run goes ahead
    assert not (out / DEV / ".small.lock").exists()


def test_records_of_two_spec_versions_are_kept_per_record(tmp_path, capsys, monkeypatch):
    a = spec_file(tmp_path)
    out = tmp_path / "r"
    with monkeypatch.context() as m:
        interrupt_after(m, 4)
        assert sweep(capsys, a, out)[0] == 130
    keys_a = {r.case_id: r.resume_key for r in stream_records(out / DEV / "small.partial.jsonl")}
    spec_file(tmp_path, SMALL.replace("block_size: 1024}", "block_size: 512}"))  # spec B: another baseline
    with monkeypatch.context() as m:
        interrupt_after(m, 7)
        assert sweep(capsys, a, out)[0] == 130
    spec_file(tmp_path)  # back to A
    code, _, err = sweep(capsys, a, out, "--resume")
    assert code == 0 and "--resume: kept 4 of 12 cases" in err
    assert "made under other settings (baseline.block_size: 512 -> 1024)" in err
    recs = records_of(out / DEV / "small.json")
    assert {r.case_id: r.resume_key for r in recs if r.case_id in keys_a} == keys_a


def test_a_comment_keeps_every_record_and_a_complete_file_is_not_shrunk(tmp_path, capsys, monkeypatch):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    final = out / DEV / "small.json"
    assert sweep(capsys, spec, out)[0] == 0
    spec_file(tmp_path, "# a comment changes the bytes, not the cases\n" + SMALL)
    code, _, err = sweep(capsys, spec, out, "--resume")
    assert code == 0 and "--resume: kept 12 of 12 cases" in err
    with monkeypatch.context() as m:  # other settings: nothing kept, and the rerun is interrupted
        interrupt_after(m, 3)
        code, _, err = sweep(capsys, spec, out, "--resume", "--timing", "l2=cold")
    assert code == 130 and "kept 0 of 12" in err and "which holds 12 records" in err
    prov, recs = load_results(final)
    assert prov["complete"] is True and len(recs) == 12  # the complete file stands
    assert len(stream_records(out / DEV / "small.partial.jsonl")) == 3  # and the new records are kept
    code, _, err = sweep(capsys, spec, out, "--resume", "--timing", "l2=cold")
    assert code == 0 and "kept 3 of 12" in err
    assert load_results(final)[0]["timing"]["l2"] == "cold"


def test_a_full_disk_mid_run_is_one_line_and_keeps_what_was_written(tmp_path, capsys, monkeypatch):
    real, calls = os.fsync, {"n": 0}

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".partial.jsonl"):
            calls["n"] += 1
            if calls["n"] > 4:  # the run header and three records are synced; the fourth is written, not synced
                raise OSError(28, "No space left on device")
        return real(fd)

    spec, out = spec_file(tmp_path), tmp_path / "r"
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fsync)
        m.setattr(store, "FSYNC_EVERY_S", 0.0)  # every record synced: the failure lands on the fourth
        code, _, err = sweep(capsys, spec, out)
    assert code == 2 and "No space left on device" in err and "--resume" in err and one_line(err)
    assert len(stream_records(out / DEV / "small.partial.jsonl")) == 4
    code, _, err = sweep(capsys, spec, out, "--resume")
    assert code == 0 and "kept 4 of 12" in err


def test_render_never_overwrites_its_input(tmp_path, capsys):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    assert sweep(capsys, spec, out)[0] == 0
    doc = (out / DEV / "small.json").read_text()
    md = tmp_path / "x.md"
    md.write_text(doc)
    code, _, err = run_cli(["render", str(md)], capsys)
    assert code == 2 and "would overwrite its own input" in err and one_line(err)
    assert md.read_text() == doc


# ============================================================================ wrong answers


def _timed(path: Path, medians: dict[str, float | None], noise: float | None = 0.002) -> Path:
    recs = []
    for cid, us in medians.items():
        timing = {} if us is None else {"median_us": us, **({"rel_noise": noise, "rerun_rel": noise}
                                                            if noise is not None else {})}
        recs.append(Record("s", "count", cid, "persistent", "persistent", "ok", params={"tokens": 1}, timing=timing))
    path.write_text(json.dumps({"provenance": {"sweep": "s"}, "records": [r.to_json() for r in recs]}))
    return path


@pytest.mark.parametrize("new,why", [
    ({"c": 1.0}, "share no case_id"),
    ({"a": None, "b": None}, "NEW holds no timings"),
    ({"a": float("nan"), "b": 1.0}, "median_us: expected a positive number, got nan"),
    ({"a": 0.0, "b": 1.0}, "median_us: expected a positive number, got 0.0"),
    ({"a": -1.0, "b": 1.0}, "median_us: expected a positive number, got -1.0"),
    ({"a": None, "b": 1.0}, "could not be judged"),
    ({"a": 1.0}, "cases of BASE are not in NEW"),
], ids=["no-shared-case", "no-timings", "nan", "zero", "negative", "one-untimed", "missing-case"])
def test_compare_gate_fails_closed(tmp_path, capsys, new, why):
    base = _timed(tmp_path / "base.json", {"a": 1.0, "b": 1.0})
    code, _, err = run_cli(["compare", str(base), str(_timed(tmp_path / "new.json", new)), "--fail-on-regression"],
                           capsys)
    assert code == 2 and why in err and one_line(err)


def test_compare_metric_that_names_no_column(tmp_path, capsys):
    base = _timed(tmp_path / "base.json", {"a": 1.0})
    code, _, err = run_cli(["compare", str(base), str(base), "--metric", "nope", "--fail-on-regression"], capsys)
    assert code == 2 and "no column 'nope'" in err
    code, _, _ = run_cli(["compare", str(base), str(base), "--fail-on-regression"], capsys)
    assert code == 0  # the same inputs with a real column pass the gate


BAD_SWITCHES = [("MCORE_COUNT_TOKENS_BLOCK", v) for v in ("abc", "100", "0", "-128", str(2**31))]


@pytest.mark.parametrize("var,value", BAD_SWITCHES + [("MCORE_MOE_ACTIVATION_GRID_CAP", "500")])
def test_bad_kill_switch_is_a_usage_error_before_any_case(tmp_path, capsys, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    ran = []
    monkeypatch.setattr(CasePipeline, "run_case", lambda self, case: ran.append(case))
    name = "count-block" if var.startswith("MCORE_COUNT") else "act-grid"
    for cmd in (["sweep", name, "--quick"], ["verify", name, "--quick"]):
        code, _, err = run_cli([*cmd, "--out", str(tmp_path)], capsys)
        assert code == 2 and f"${var}={value!r}" in err and "which takes" in err and one_line(err), err
    assert not ran and not list(tmp_path.rglob("*.json*"))


def test_bad_kill_switch_stops_ab_and_device_workers_before_any_case(tmp_path, capsys, monkeypatch):
    import moebench.core.device as device
    from moebench.core.cases import expand
    from moebench.core.driver import run_sweep
    from moebench.core.pipeline import Options
    from moebench.core.spec import load_spec

    spec = load_spec("count-block")
    cases = expand(spec, quick=True)
    spawned = []

    def workers(cases, passes, environ):
        spawned.append(cases)
        return iter(())

    events = run_sweep(spec, cases, Options(timing=spec.timing, time_it=False), device.detect(True), workers=workers,
                       environ={"MCORE_COUNT_TOKENS_BLOCK": "abc"})
    with pytest.raises(Exception, match="MCORE_COUNT_TOKENS_BLOCK"):  # before any worker is spawned
        next(events)
    assert not spawned
    real = device.detect
    monkeypatch.setattr(device, "want_interpreter", lambda requested: False)
    monkeypatch.setattr(device, "detect", lambda interpret: real(True))
    ran = []
    monkeypatch.setattr(CasePipeline, "run_case", lambda self, case: ran.append(case))
    code, _, err = run_cli(["ab", "count-block", "--quick", "--off", "env:MCORE_COUNT_TOKENS_BLOCK=abc", "--on",
                            "env:MCORE_COUNT_TOKENS_BLOCK=128", "--out", str(tmp_path)], capsys)
    assert code == 2 and "$MCORE_COUNT_TOKENS_BLOCK='abc'" in err and not ran


@pytest.mark.parametrize("change", [("env", "MCORE_COUNT_TOKENS_BLOCK", "128"), ("opt", "--timing", "l2=cold")],
                         ids=["kill-switch", "l2"])
def test_resume_drops_records_made_under_other_settings(tmp_path, capsys, monkeypatch, change):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    with monkeypatch.context() as m:
        interrupt_after(m, 4)
        assert sweep(capsys, spec, out)[0] == 130
    kind, name, value = change
    extra = [name, value] if kind == "opt" else []
    if kind == "env":
        monkeypatch.setenv(name, value)
    code, _, err = sweep(capsys, spec, out, "--resume", *extra)
    assert code == 0 and "--resume: kept 0 of 12 cases" in err and "4 made under other settings" in err
    assert (f"${name}: unset -> '128'" if kind == "env" else "timing.l2: 'warm' -> 'cold'") in err
    prov, recs = load_results(out / DEV / "small.json")
    keys = {r.resume_key for r in recs}
    from moebench.core.cases import expand
    from moebench.core.provenance import record_key
    from moebench.core.spec import load_spec

    s = load_spec(str(spec))
    if name == "--timing":
        s.timing.l2 = "cold"
    assert keys == {record_key(c, prov["settings"]) for c in expand(s)}  # every record made under the stated settings


@pytest.mark.parametrize("check", ["dobench", "nvbench", "profiler"])
def test_a_cross_check_that_cannot_run_here_is_refused_before_any_case(tmp_path, capsys, monkeypatch, check):
    """On the CPU (the interpreter: no timings) a cross-check would be listed and never run: exit 2, one
    line, nothing run or written. (nvbench may be refused first for its missing package.)"""
    ran = []
    monkeypatch.setattr(CasePipeline, "run_case", lambda self, case: ran.append(case))
    code, _, err = sweep(capsys, spec_file(tmp_path), tmp_path / "r", "--cross-check", check)
    assert code == 2 and not ran and "Traceback" not in err and one_line(err), err
    assert f"--cross-check {check}:" in err
    assert check == "nvbench" or "needs timings on a CUDA device" in err
    assert not list((tmp_path / "r").rglob("*.json*"))


def test_markup_and_emoji_in_user_text_print_as_written(tmp_path, capsys):
    body = SMALL.replace("variants: [persistent, nonpersistent]",
                         'variants: [{variant: persistent, label: "[/]"}, {variant: nonpersistent, label: ":x:[b]"}]')
    code, out, err = sweep(capsys, spec_file(tmp_path, body), tmp_path / "r")
    assert code == 0, err
    assert "[/]" in out and ":x:[b]" in out and "❌" not in out
    code, _, err = run_cli(["validate", "a:x:b.yaml"], capsys)
    assert code == 2 and "a:x:b.yaml" in err and "❌" not in err


def test_parquet_without_its_library_is_refused_before_any_case(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("pyarrow", "fastparquet") else real(name, *a))
    ran = []
    monkeypatch.setattr(CasePipeline, "run_case", lambda self, case: ran.append(case))
    code, _, err = sweep(capsys, spec_file(tmp_path), tmp_path / "r", "--format", "json,parquet")
    assert code == 2 and "parquet needs pyarrow or fastparquet" in err and not ran


@pytest.mark.parametrize("out", ["file", "file/sub", "/dev/full", "/proc/moebench-out"])
def test_unwritable_out_is_a_usage_error(tmp_path, capsys, out):
    (tmp_path / "file").write_text("x")
    target = out if out.startswith("/") else str(tmp_path / out)
    code, _, err = sweep(capsys, spec_file(tmp_path), Path(target))
    assert code == 2 and "--out:" in err and one_line(err), err


def test_unwritable_plot_and_merge_outputs_are_usage_errors(tmp_path, capsys):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    assert sweep(capsys, spec, out)[0] == 0
    res = out / DEV / "small.json"
    (tmp_path / "file").write_text("x")
    for cmd in (["plot", str(res), "-o", str(tmp_path / "file" / "x.png")],
                ["plot", str(res), "-o", "/proc/moebench.png"],
                ["merge", str(res), "-o", str(tmp_path / "file" / "m")]):
        code, _, err = run_cli(cmd, capsys)
        assert code == 2 and "-o:" in err and one_line(err), (cmd, err)


@pytest.mark.parametrize("doc,key", [
    ({"provenance": {}, "records": [{"sweep": "s", "family": "count", "case_id": "a", "variant": "v", "label": "v",
                                     "status": "ok", "params": None}]}, "records[0].params: expected an object"),
    ({"provenance": {}, "records": [{"sweep": "s", "family": "count", "case_id": "a", "variant": "v", "label": "v",
                                     "status": "ok", "params": "tokens=1"}]}, "records[0].params: expected an object"),
    ({"provenance": {}, "records": [{"sweep": "s", "family": "count", "case_id": "a", "variant": "v", "label": "v",
                                     "status": "ok", "timing": {"median_us": "fast"}}]},
     "records[0].timing.median_us: expected a number"),
    ({"provenance": {"device": "H200"}, "records": []}, "provenance.device: expected an object"),
    ({"provenance": {}, "records": {"a": 1}}, "records: expected a list"),
], ids=["null-group", "string-params", "string-median", "string-device", "records-object"])
def test_malformed_results_name_the_key(tmp_path, capsys, doc, key):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    for cmd in (["show", str(f)], ["compare", str(f), str(f)], ["render", str(f)], ["recommend", str(f)]):
        code, _, err = run_cli(cmd, capsys)
        assert code == 2 and key in err and one_line(err), (cmd, err)


def test_deeply_nested_results_file_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "deep.json"
    f.write_text("[" * 200_000 + "]" * 200_000)
    code, _, err = run_cli(["show", str(f)], capsys)
    assert code == 2 and "nested too deeply" in err and one_line(err)


def test_render_finds_a_spec_given_by_path(tmp_path, capsys):
    spec, out = spec_file(tmp_path, name="mine.yaml"), tmp_path / "r"  # sweeps/small.yaml does not exist
    assert sweep(capsys, spec, out)[0] == 0
    page = out / DEV / "small.md"
    page.unlink()
    code, out_text, err = run_cli(["render", str(out / DEV / "small.json")], capsys)
    assert code == 0, err
    assert page.read_text().startswith("# small")


@pytest.mark.parametrize("delay", [0.0, 0.02], ids=["while-winding-down", "while-exiting"])
def test_second_ctrl_c_exits_at_once_without_a_traceback(tmp_path, delay):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1"}
    proc = warm.Popen(["sweep", spec, "--out", out], cwd=ROOT, env=env)
    stream = out / DEV / "small.partial.jsonl"
    _wait_records(stream, 2, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert len(stream_records(stream)) >= 2  # the finished records are kept


def test_result_files_follow_the_umask(tmp_path, capsys):
    spec, out = spec_file(tmp_path), tmp_path / "r"
    old = os.umask(0o027)
    try:
        assert sweep(capsys, spec, out)[0] == 0
    finally:
        os.umask(old)
    for f in (out / DEV).iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o640, f


# ============================================================================ unbounded work


def _product_spec(tmp_path: Path, n_values: int, axes: int, where: str, max_cases: int) -> Path:
    names = ["tokens", "buffer_tokens", "seed", "local_expert_start"][:axes]
    body = small_count_spec("big").split("axes:")[0].replace("[persistent, nonpersistent]", "[persistent]")
    body += f"max_cases: {max_cases}\naxes:\n"
    for n in names:
        start = 1000 if n == "buffer_tokens" else 0
        body += f"  {n}: {list(range(start, start + n_values))}\n"
    return spec_file(tmp_path, body + f"where: {where!r}\n", "big.yaml")


def test_a_huge_product_is_refused_without_expanding(tmp_path, capsys, monkeypatch):
    import moebench.core.cases as cases

    made = []
    monkeypatch.setattr(cases, "evaluator", lambda tree: made.append(tree) or (lambda env: True))
    spec = _product_spec(tmp_path, 1000, 4, "tokens == 5", 10**15)  # 10^12 cases before the filter
    code, _, err = run_cli(["validate", str(spec)], capsys)
    assert code == 2 and "hard limit of 1000000" in err and one_line(err)
    assert not made  # refused from the arithmetic count alone
    code, _, err = run_cli(["sweep", str(spec), "--force", "--dry-run"], capsys)
    assert code == 2 and "no key or flag lifts it" in err


def test_where_prunes_a_large_product_instead_of_walking_it(tmp_path, capsys, monkeypatch):
    import moebench.core.cases as cases

    calls = {"n": 0}
    real = cases.evaluator

    def counting(tree):
        fn = real(tree)

        def run(env):
            calls["n"] += 1
            return fn(env)

        return run

    monkeypatch.setattr(cases, "evaluator", counting)
    spec = _product_spec(tmp_path, 100, 3, "tokens == 5 and seed == 7 and buffer_tokens == 1003", 10**6)
    code, out, err = run_cli(["validate", str(spec)], capsys)
    assert code == 0 and "1 cases" in out, err
    # 10^6 points, one case: tokens is pinned at the first level, buffer_tokens at the second, seed at the
    # third; a few hundred checks, not a million
    assert calls["n"] < 2_000


def test_shard_count_is_bounded_by_the_cases(tmp_path, capsys, monkeypatch):
    spec = spec_file(tmp_path)
    for text in ("0/100000000", "0/13", "0/" + "9" * 40):
        code, _, err = run_cli(["sweep", str(spec), "--shard", text, "--dry-run"], capsys)
        assert code == 2 and "--shard" in err and one_line(err), (text, err)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "100000000")
    code, _, err = run_cli(["sweep", str(spec), "--dry-run"], capsys)
    assert code == 2 and "SLURM_ARRAY_TASK_COUNT" in err and "at most 12 shards" in err


def test_launch_sizes_are_bounded_and_a_case_has_a_time_limit(tmp_path, capsys):
    big = SMALL.replace("block_size: [64, 256]", "grid: [2147483647]")
    code, _, err = run_cli(["validate", str(spec_file(tmp_path, big))], capsys)
    assert code == 2 and "grid" in err and "must be <=" in err
    slow = SMALL.replace("block_size: [64, 256]\n  tokens: [0, 5, 40]", "grid: [1048576]\n  tokens: [5]").replace(
        "[persistent, nonpersistent]", "[persistent]")
    code, _, err = sweep(capsys, spec_file(tmp_path, slow), tmp_path / "r", "--case-limit", "0.5")
    assert code == 1 and "CaseTimeLimit: still running after 0.5 s" in err


def test_reference_names_are_the_shipped_ones(tmp_path, capsys):
    bomb = tmp_path / "x.yaml"
    bomb.write_text("a: &a [1]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}]\n"
                                             for p, c in zip("abcdefgh", "bcdefghi")))  # a billion-laughs YAML
    for name in ("../../x", str(bomb.with_suffix("")), "seed-000-count-block-gb200/../x"):
        code, _, err = run_cli(["show", str(ROOT / "results" / "h200" / "count-block.json"), "--reference", name],
                               capsys)
        assert code == 2 and "unknown reference" in err and one_line(err), err


# ============================================================================ killed at random points


def _wait_records(path: Path, n: int, proc, timeout: float = 120) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and sum(b'"record"' in line for line in path.read_bytes().splitlines()) >= n:
            return
        if proc.poll() is not None:
            return
        time.sleep(0.01)
    raise AssertionError("no progress")


def _comparable(recs: list[Record]) -> dict[str, dict]:
    """Records as a clean run would write them; the JIT compile time of a first launch varies."""
    out = {}
    for r in recs:
        d = r.to_json()
        d["timing"] = {k: v for k, v in d["timing"].items() if k != "compile_s"}
        out[r.case_id] = d
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_killed_at_random_points_resume_ends_with_the_clean_record_set(tmp_path, capsys, seed):
    """SIGKILL at a random record count (sometimes before the first), sometimes tearing the last
    line as a kill mid-write would, then --resume, until a run completes: the result is exactly
    the record set of a clean run, each case once."""
    rng = random.Random(seed)
    spec = spec_file(tmp_path)
    assert sweep(capsys, spec, tmp_path / "clean")[0] == 0
    clean = _comparable(records_of(tmp_path / "clean" / DEV / "small.json"))
    out = tmp_path / "r"
    stream = out / DEV / "small.partial.jsonl"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1"}
    for attempt in range(8):
        proc = warm.Popen(["sweep", spec, "--out", out, "--resume"], cwd=ROOT, env=env, text=False)
        have = len(stream_records(stream)) if stream.exists() else 0
        if attempt < 3:
            _wait_records(stream, have + rng.randint(0, 4), proc)
            proc.kill()
        _, errb = proc.communicate(timeout=120)
        if proc.returncode == 0:
            break
        if stream.exists() and rng.random() < 0.5:  # torn: the kill landed inside a write
            data = stream.read_bytes()
            last = data.rstrip(b"\n").rfind(b"\n") + 1
            stream.write_bytes(data[:last + rng.randint(1, max(1, len(data) - last - 2))])
    assert proc.returncode == 0, errb
    prov, recs = load_results(out / DEV / "small.json")
    assert prov["complete"] is True and len(recs) == 12
    assert _comparable(recs) == clean
    assert not stream.exists()

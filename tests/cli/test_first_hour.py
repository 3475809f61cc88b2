"""A newcomer's first hour: the first command on a fresh machine, where runs write, verify
--resume, output in a pipe, CPU results and help texts. Kernels run under the Triton interpreter.
(What the README and docs/ say is checked by tests/docs/test_docs.py, which pins no wording.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import interrupt_after, run_cli, small_count_spec
import warm

ROOT = Path(__file__).resolve().parents[2]
DEV = "cpu-interpreter"


# ============================================================================ 1. the first command


def _bare_python() -> str | None:
    """A Python 3 on this machine without moebench's dependencies (the system one, usually)."""
    for cand in ("/usr/bin/python3", "/bin/python3", shutil.which("python3")):
        if cand and Path(cand).exists():
            r = subprocess.run([cand, "-c", "import typer"], capture_output=True)
            if r.returncode != 0:
                return cand
    return None


def test_without_dependencies_python_m_moebench_says_what_to_run():
    py = _bare_python()
    if py is None:
        pytest.skip("no Python without typer on this machine")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MOEBENCH_RELAUNCHED": "1"}  # as if no .venv
    r = subprocess.run([py, "-m", "moebench", "sweep", "count-block"], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "make sweep" in r.stderr and "Traceback" not in r.stderr
    if (ROOT / ".venv" / "bin" / "python").exists():  # with the checkout's .venv it runs under it
        env.pop("MOEBENCH_RELAUNCHED")
        r = subprocess.run([py, "-m", "moebench", "list"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert r.returncode == 0 and "count-block" in r.stdout, r.stderr


def test_make_sweep_runs_the_main_job_after_installing():
    make = (ROOT / "Makefile").read_text()
    rule = re.search(r"^sweep: install\n\t(.+)$", make, re.M)
    assert rule and "moebench sweep $(SWEEP)" in rule.group(1)
    assert re.search(r"^SWEEP\s*\?= count-block$", make, re.M)


# ============================================================================ 2. where runs write


def test_bare_run_writes_under_out_with_portable_provenance(tmp_path, capsys, monkeypatch):
    from moebench.cli.common import DEFAULT_OUT

    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["sweep", "combine-lds", "--quick"], capsys)
    assert code == 0, err
    assert DEFAULT_OUT == Path("out")
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == [f"out/host/combine-lds-quick.{x}" for x in ("csv", "json", "md")]
    text = (tmp_path / "out" / "host" / "combine-lds-quick.json").read_text()
    assert str(ROOT) not in text  # the clone's location is nowhere in the results
    assert json.loads(text)["provenance"]["spec_path"] == "sweeps/combine-lds.yaml"
    r = subprocess.run(["git", "check-ignore", "-q", "out/h200/count-block.json"], cwd=ROOT)
    assert r.returncode == 0  # the default output is ignored by git: a bare run leaves the checkout clean


def test_every_family_writes_out_device_name(tmp_path, capsys):
    assert run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)[0] == 0
    assert run_cli(["sweep", "combine-lds", "--quick", "--out", str(tmp_path)], capsys)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEV, "host"]
    assert (ROOT / "results" / "host" / "combine-lds.json").exists()  # the committed one lives there too
    assert not (ROOT / "results" / "combine-lds.json").exists()


# ============================================================================ 3. verify --resume, INCOMPLETE


VERIFY = small_count_spec("small") + """verify:
  axes:
    tokens: [0, 5]
    block_size: [64, 256]
"""


def test_verify_resumes_writes_csv_and_marks_incomplete(tmp_path, capsys, monkeypatch):
    spec, out = tmp_path / "small.yaml", tmp_path / "r"
    spec.write_text(VERIFY)
    cmd = ["verify", str(spec), "--out", str(out)]
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        code, stdout, err = run_cli(cmd, capsys)
    assert code == 130
    assert err.splitlines()[-1].startswith("INCOMPLETE: 3 of 8 cases")
    page = (out / DEV / "small-verify.md").read_text()
    assert page.startswith("# small\n\n**INCOMPLETE: 3 of 8 cases.**")
    assert "Correctness: **3/3 exact**" in page  # the verdict is of what ran, under the INCOMPLETE banner
    code, stdout, err = run_cli(cmd + ["--resume"], capsys)
    assert code == 0 and "--resume: kept 3 of 8 cases" in err and "8/8 exact" in stdout
    assert len((out / DEV / "small-verify.csv").read_text().splitlines()) == 9
    assert "INCOMPLETE" not in (out / DEV / "small-verify.md").read_text()


def test_a_merge_missing_a_shard_reads_incomplete(tmp_path, capsys):
    spec, out = tmp_path / "small.yaml", tmp_path / "r"
    spec.write_text(small_count_spec("small"))
    assert run_cli(["sweep", str(spec), "--shard", "0/2", "--out", str(out)], capsys)[0] == 0
    code, stdout, _ = run_cli(["merge", str(out / DEV / "small.shard0of2.json"), "-o", str(tmp_path / "m")], capsys)
    assert code == 1 and "INCOMPLETE (shard 1 of 2 missing" in stdout
    assert (tmp_path / "m.md").read_text().startswith("# small\n\n**INCOMPLETE: 6 of 12 cases.**")


# ============================================================================ 4. in a pipe


def _piped(*args, **env):
    e = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    e.update({"TRITON_INTERPRET": "1", **env})
    return warm.run(args, cwd=ROOT, env=e)


def test_piped_compare_shows_every_verdict_and_number_whole(tmp_path):
    from moebench.core.records import Record

    def write(path, scale):
        recs = [Record("s", "count", f"case{i:02d}", "persistent", f"a-long-variant-label-{i}", "ok",
                       params={"tokens": 2**i, "block_size": 1024},
                       timing={"median_us": 1234.5678 * (scale if i % 2 else 1), "rel_noise": 0.001,
                               "rerun_rel": 0.001})
                for i in range(6)]
        path.write_text(json.dumps({"provenance": {"sweep": "s"}, "records": [r.to_json() for r in recs]}))
        return path

    r = _piped("compare", write(tmp_path / "a-rather-long-base-file-name.json", 1.0),
               write(tmp_path / "a-rather-long-new-file-name.json", 1.5))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("SLOWER") >= 3 and r.stdout.count("SAME") >= 3 and "…" not in r.stdout
    assert "1851.852" in r.stdout and "+50.00" in r.stdout and "a-long-variant-label-5" in r.stdout


def test_piped_list_and_progress(tmp_path):
    r = _piped("list")
    assert r.returncode == 0 and "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) > 80  # not cut to 80 columns
    r = _piped("sweep", "count-block", "--quick", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(r"count-block: 9/9 done, \d+ s", r.stderr)  # stderr is a pipe: progress as lines


def test_progress_lines_carry_done_total_and_eta(monkeypatch, capsys):
    import time

    from moebench.cli import common

    clock = iter([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    bar = common.Bar("sweep", 4, every=0.0)
    with bar:
        bar.advance()
        bar.note("case 2")
    err = capsys.readouterr().err
    assert "sweep: 1/4 done" in err and "ETA" in err and "now case 2" in err


# ============================================================================ 5. CPU results


def test_cpu_results_show_the_check_and_read_as_a_cpu(tmp_path, capsys):
    code, stdout, _ = run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 0 and "excluded from timings" not in stdout
    res = tmp_path / DEV / "count-block-quick.json"
    code, stdout, err = run_cli(["show", str(res)], capsys)
    assert code == 0, err
    assert "showing ref_check" in err and "count-block: ref_check" in stdout and "exact" in stdout
    page = (tmp_path / DEV / "count-block-quick.md").read_text()
    assert "Device: this machine's CPU, kernels run by the Triton interpreter" in page
    assert "SMs, L2 0 MiB" not in page and "driver None" not in page


def test_not_taken_mark_is_explained(tmp_path, capsys):
    code, stdout, _ = run_cli(["sweep", "act-grid", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 0 and "legacy ·" in stdout and "· in a row label" in stdout
    assert "· in a row label: the variant does not take" in (tmp_path / DEV / "act-grid-quick.md").read_text()


def test_combine_prints_a_summary_and_the_page_has_every_table(tmp_path, capsys):
    code, stdout, _ = run_cli(["sweep", "combine-lds", "--out", str(tmp_path)], capsys)
    assert code == 0
    assert len(stdout.splitlines()) < 20 and "1152 cases in 6 tables" in stdout
    assert (tmp_path / "host" / "combine-lds.md").read_text().count("## path") == 6


# ============================================================================ 6. help


def _commands():
    from moebench.cli import command

    return command().commands


SWEEP_PANELS = ("What to run", "Timer", "Output", "Scale-out", "Plugins and sources")


def _pty_help(*args: str) -> str:
    """`moebench ARGS --help` with stdout a terminal (a pseudo-terminal), ANSI styles stripped."""
    import pty

    main, sub = pty.openpty()
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "moebench", *args, "--help"], cwd=ROOT, env=env, stdout=sub,
                            stderr=sub, close_fds=True)
    os.close(sub)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=60) == 0
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())


def test_sweep_help_is_in_panels_in_a_pipe_and_a_terminal(capsys):
    piped = warm.run(["sweep", "--help"], cwd=ROOT, timeout=60)
    assert piped.returncode == 0, piped.stderr
    for text in (piped.stdout, _pty_help("sweep")):
        for panel in SWEEP_PANELS:
            assert re.search(rf"─ {panel} ─", text), panel
        assert "<bool>" not in text and "--timings" in text
        assert "'moebench[nvbench]'" in " ".join(text.replace("│", " ").split())  # not eaten as markup
    code, stdout, _ = run_cli(["verify", "--help"], capsys)
    assert code == 0 and "─ What to run ─" in stdout and "─ Scale-out ─" in stdout
    code, stdout, _ = run_cli(["ab", "--help"], capsys)
    assert code == 0 and all(f"─ {panel} ─" in stdout for panel in ("The arms", "What to run", "Output"))


def test_every_option_has_help_and_no_bool_placeholders(capsys):
    for name, cmd in _commands().items():
        for p in cmd.params:
            assert (p.help or "").strip(), f"{name} {p.name}"
    for name in ["", *_commands()]:
        code, stdout, _ = run_cli([name, "--help"] if name else ["--help"], capsys)  # COLUMNS=2000
        assert code == 0 and "<bool>" not in stdout, name
        # wide enough for every paragraph on one line: a docstring's own line breaks do not show
        intro = re.split(r"\n\s*\n", stdout.split("╭─")[0].strip())[1:]  # the paragraphs after Usage
        assert intro, name
        for para in intro:
            assert len(para.strip().splitlines()) == 1, (name, para)


def test_references_are_named_in_list_and_help(capsys):
    from moebench.analysis.reference import reference_names

    names = reference_names()
    assert names
    code, stdout, _ = run_cli(["list"], capsys)
    assert code == 0 and all(n in stdout for n in names)
    for cmd in (["show", "--help"], ["plot", "--help"]):
        code, stdout, _ = run_cli(cmd, capsys)
        assert all(n in " ".join(stdout.split()) for n in names), cmd

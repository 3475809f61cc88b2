"""Paste-able output (issue 24 item 6): `show`, `compare`, `recommend` and `ab` print markdown pipe
tables with --markdown, and `list` fits a pipe."""

import json
import os
from pathlib import Path

import pytest

import warm

from clirun import run_cli, small_count_spec

ROOT = Path(__file__).resolve().parents[2]
COUNT_BLOCK = ROOT / "results" / "h200" / "count-block.json"  # a committed GPU results file: timings to show
BOX = set("┃┏━│┡╇└─")


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_show_prints_pipe_tables(capsys):
    code, out, err = run_cli(["show", str(COUNT_BLOCK), "--markdown"], capsys)
    assert code == 0, err
    assert not BOX & set(out)
    rows = _table_lines(out)
    assert rows[0] == "| block_size \\ tokens | 256 | 1024 | 4096 | 16384 |" and rows[1] == "|---|---|---|---|---|"
    cell = next(r["timing"]["median_us"] for r in json.loads(COUNT_BLOCK.read_text())["records"]
                if r["params"]["block_size"] == 128 and r["params"]["tokens"] == 256)
    assert any(r.startswith(f"| 128 | {cell:.2f} |") for r in rows)  # the file's own number, as a pipe cell
    assert "**count-block: median_us**" in out


def test_compare_prints_a_pipe_table(capsys):
    # the committed file states the measured noise model's terms, the widest ±7.5% (tokens 1024 /
    # BLOCK 512): compare's noise is √2 x that (10.7%), so a file against itself is SAME only above it
    code, out, err = run_cli(["compare", str(COUNT_BLOCK), str(COUNT_BLOCK), "--markdown", "--threshold", "12"], capsys)
    assert code == 0, err
    assert not BOX & set(out)
    rows = _table_lines(out)
    assert rows[0].startswith("| case | variant | tokens | block_size | BASE µs | NEW µs | Δ % |")
    assert len(rows) == 2 + 20 and all(r.count("|") == rows[0].count("|") for r in rows)
    assert "20 matched cases: 20 SAME" in " ".join(out.split()), out


def test_recommend_prints_pipe_tables_only(capsys):
    code, out, err = run_cli(["recommend", str(COUNT_BLOCK), "--markdown"], capsys)
    assert code == 0, err
    assert not BOX & set(out)
    assert "| block_size \\ tokens | 256 | 1024 | 4096 | 16384 | worst | at | choice |" in out
    assert "- Robust choice (minimax regret): block_size=128" in out


def test_ab_dry_run_and_run_print_markdown(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["ab", "count-block", "--off", "block_size=1024", "--on", "block_size=128", "--dry-run",
                              "--markdown"], capsys)
    assert code == 0, err
    assert not BOX & set(out) and "| case | OFF case id | ON case id |" in out and "| tokens=256 |" in out
    # a run, with a stand-in for the GPU timer: only the PR block is printed
    import moebench.core.device as device
    from moebench.core.pipeline import CasePipeline

    monkeypatch.setattr(device, "want_interpreter", lambda requested: False)
    monkeypatch.setattr(device, "detect", lambda interpret: device.host_device())
    monkeypatch.setattr(device, "require_triton", lambda: None)
    monkeypatch.setattr(CasePipeline, "_kernel_case", lambda self, case, params, rec: rec.timing.update(
        median_us=2.0 if case.params["block_size"] == 128 else 3.0))
    spec = tmp_path / "s.yaml"
    spec.write_text(small_count_spec("s"))
    code, out, err = run_cli(["ab", str(spec), "--off", "block_size=64", "--on", "block_size=256", "--arms", "2",
                              "--iters", "2", "--out", str(tmp_path / "r"), "--markdown"], capsys)
    assert code == 0, err
    assert not BOX & set(out)
    assert "### A/B on " in out and "| case | OFF µs | ON µs | Δ µs |" in out
    assert "--- markdown for the PR description ---" not in out


def test_list_fits_a_pipe():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    p = warm.run(["list"], cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert max(len(line) for line in p.stdout.splitlines()) <= 100
    assert "$MCORE_MOE_ACTIVATION_GRID_CAP" in p.stdout and "…" not in p.stdout  # wrapped, never cut
    assert "  persistent (builtin; launch params: block_size, num_warps, grid)" in p.stdout

"""TIMER.md from N runs: per-case spread, coverage by the stated intervals, the cross-check
columns of the first run; and the wall-profile table (scripts/wall_profile.py) adding up."""

import json
import sys
from pathlib import Path

import pytest

from moebench.core.records import Record

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import timer_report as TR  # noqa: E402  (scripts/timer_report.py)


def _write(root: Path, name: str, medians: dict, rel: float, cross: dict | None = None, wall=1.5):
    recs = []
    for cid, m in medians.items():
        r = Record(name, "count", cid, "persistent", "persistent", "ok", params={"tokens": int(cid[1:]) * 256},
                   timing={"median_us": m, "rel_noise": rel}, cross=dict((cross or {}).get(cid, {})))
        recs.append(r.to_json())
    d = root / "h200"
    d.mkdir(parents=True, exist_ok=True)
    prov = {"sweep_wall_s": wall, "timing": {"placements": 8, "groups": 4, "max_groups": 0,
                                             "placement_memory": "private"}}
    (d / f"{name}.json").write_text(json.dumps({"provenance": prov, "records": recs}))


def test_spread_coverage_and_cross_check_columns(tmp_path):
    cross = {"c1": {"dobench_us": 2.0, "nvbench_delta_pct": 0.5, "nvbench_cold_delta_pct": -1.0,
                    "kernel_us": 1.8, "node_gap_us": 0.2}}
    _write(tmp_path / "a", "s", {"c1": 2.00, "c2": 4.00, "c3": 9.0}, 0.01, cross)
    _write(tmp_path / "b", "s", {"c1": 2.02, "c2": 4.20, "c3": 9.0}, 0.01)
    _write(tmp_path / "c", "s", {"c1": 2.01, "c2": 4.00}, 0.01)  # c3 missing: left out
    st = TR.spread_stats([tmp_path / r / "h200" / "s.json" for r in "abc"])
    assert st["cases"] == 2 and st["spreads"]["c1"] == pytest.approx(1.0) and st["spreads"]["c2"] == pytest.approx(5.0)
    assert st["over"] == 1 and st["pairs"] == 6
    # c1: every pair within sqrt(2) x 1%; c2: 4.00 vs 4.20 is 5% apart, outside (2 of its 3 pairs)
    assert st["covered"] == 4
    text = TR.build([tmp_path / r for r in "abc"], ["s"], "h200")
    assert "1 of 2 cases over 3%" in text and "pairs of runs within their combined interval: 4 of 6" in text
    assert "vs nvbench batch (run 1): median |Δ| 0.50%" in text and "5.00% ✗" in text
    assert "8 sets x 4 groups, private memory" in text  # prov: 8 sets, no copies, no strata given
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # header, rule and rows have the same cells
    assert TR.covered(Record("s", "f", "x", "v", "v", "ok", timing={"median_us": 1.0, "rel_noise": 0.0}),
                      Record("s", "f", "x", "v", "v", "ok", timing={"median_us": 1.0, "rel_noise": 0.0}))


def test_the_cli_writes_the_page_with_appended_sections(tmp_path):
    for r in "ab":
        _write(tmp_path / r, "count-block", {"c1": 2.0, "c2": 3.0}, 0.002)
    extra = tmp_path / "study.md"
    extra.write_text("## Run-to-run: the study\n")
    out = tmp_path / "TIMER.md"
    TR.main([str(tmp_path / "a"), str(tmp_path / "b"), "--sweeps", "count-block,act-grid", "-o", str(out),
             "--append", str(extra)])
    text = out.read_text()
    assert "## count-block" in text and "missing:" in text and text.rstrip().endswith("## Run-to-run: the study")


def test_the_wall_profile_rows_add_up_to_the_whole_command():
    sys.path.insert(0, str(ROOT / "scripts"))
    import wall_profile

    rec = {"command": "moebench sweep count-block", "total_s": 5.0, "child_s": 4.5, "returncode": 0, "exit": 0,
           "imports": {"import torch": 1.5, "import pandas": 0.3}, "stages": {"print tables": 0.1},
           "sweep_wall_s": 2.0, "n_records": 20, "jit_specializations": 5, "compile_s_total": 0.4,
           "wall_phases_s": {"timing": 1.2, "compile + checked launch": 0.5,
                             "inputs + reference (background threads)": 0.7},
           "triton_cache_before": {"entries": 10}, "triton_cache_after": {"entries": 10}}
    rows = [line for line in wall_profile.table(rec) if line.startswith("| ") and "overlapped" not in line]
    total = sum(float(line.split("|")[2]) for line in rows[1:])
    assert total == pytest.approx(5.0, abs=0.005)
    assert any("cases: the rest" in line and "0.300" in line for line in rows)

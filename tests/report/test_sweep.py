"""Records -> tables: verdict lines, pivots with parameters a variant does not read, re-rendering."""

import json

from clirun import run_cli
from moebench.core.records import Record
from moebench.report.sweep import markdown_table, pivots, verdict_line


def rec(label, variant, cap, live, status="ok", ref="exact", us=None):
    return Record("s", "act", f"{label}{cap}{live}", variant, label, status, params={"grid_cap": cap, "live_rows": live},
                  checks={"ref_check": ref, "baseline_equal": status == "ok"},
                  timing={"median_us": us} if us is not None else {})


def test_verdict_line_exact_and_within_bound():
    assert verdict_line([rec("a", "capped", 512, 1), rec("a", "capped", 512, 2)]) == "2/2 exact"
    line = verdict_line([rec("a", "capped", 512, 1), rec("a", "capped", 512, 2, ref="max 1 ulp (3/10 elems differ)")])
    assert line.startswith("2/2 pass") and "1 exact against torch, 1 within the stated ulp bound" in line
    line = verdict_line([rec("a", "capped", 512, 1, status="mismatch"), rec("a", "capped", 512, 2, status="error")])
    assert line == "0/2 exact, 1 mismatched, 1 failed to run"


def test_pivot_keeps_integer_caps_and_marks_unread_params():
    rs = [rec("capped", "capped", 512, 256, us=1.5), rec("capped", "capped", 8192, 256, us=5.0),
          rec("legacy", "legacy", None, 256, us=1.6), rec("capped", "capped", 512, 2048, status="mismatch")]
    (title, t), = pivots(rs, "grid_cap", "live_rows", "median_us", ["grid_cap", "live_rows"])
    assert list(t.index) == [("capped", 512), ("capped", 8192), ("legacy", "·")]  # no 512.0, no NaN
    assert t.loc[("capped", 512), 256] == 1.5 and t.loc[("capped", 512), 2048] == "✗ mismatch"
    md = markdown_table(t, "median_us")
    assert "| capped 512 | 1.50 | ✗ mismatch |" in md and "| legacy · | 1.60 | — |" in md


def test_render_rewrites_the_page_from_the_json(tmp_path, capsys):
    assert run_cli(["sweep", "count-block", "--quick", "--out", str(tmp_path)], capsys)[0] == 0
    res = tmp_path / "cpu-interpreter" / "count-block-quick.json"
    md = res.with_suffix(".md")
    md.unlink()
    code, out, _ = run_cli(["render", str(res)], capsys)
    assert code == 0 and md.exists() and "9/9 exact" in md.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([1, 2]))
    code, _, err = run_cli(["render", str(bad)], capsys)
    assert code == 2 and "not a moebench results file" in err

"""The REPORT.md section on what survives in a layer, from layer A/B and sweep files: ratios,
verdicts and the best cap. Synthetic timings, no GPU."""

import json
import sys
from pathlib import Path

import pytest

from moebench.analysis import results_json_layout
from moebench.analysis.ab import ab_pairs, parse_setting, run_arms
from moebench.core.cases import expand
from moebench.core.records import Record
from moebench.core.baseline import add_baseline_deltas
from moebench.core.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from layer_report import HEADING, best_cap, main, section  # noqa: E402  (scripts/layer_report.py)

DEVICE = {"name": "NVIDIA H200", "torch": "2.11", "triton": "3.6"}


class Runner:
    """A layer case timed as a model: `alone` and `one` are the OFF → ON savings of the kernel
    alone and of one layer step (negative: ON faster); a 48-layer graph saves 48 x `one` x 0.9."""

    def __init__(self, key, on_value, alone, one):
        self.key, self.on_value, self.alone, self.one = key, on_value, alone, one

    def run_case(self, case):
        p = case.params
        on = p[self.key] == self.on_value
        if p["scope"] != "step":
            v = 5.0 + (self.alone if on else 0.0)
        else:
            v = 100.0 * p["layers"] + ((self.one if p["layers"] == 1 else 0.9 * 48 * self.one) if on else 0.0)
        launch = {"rows": 2560, "act_grid_cap": 8192 if p["act_variant"] == "capped" else 512}
        return Record(case.family, "layer", case.id, case.variant, case.label, "ok", params=dict(p), launch=launch,
                      timing={"median_us": v})


def _ab_file(path, spec_name, off, on, runner):
    spec = load_spec(spec_name)
    offs = [parse_setting(s, spec.family, "--off") for s in off]
    ons = [parse_setting(s, spec.family, "--on") for s in on]
    pairs, _ = ab_pairs(spec, expand(spec), offs, ons)
    records = run_arms(pairs, offs, ons, arms=4, iters=3, make_runner=lambda environ: runner)
    prov = {"sweep": spec_name, "device": DEVICE, "ab": {"off": off, "on": on, "arms": 4, "iters": 3}}
    path.write_text(results_json_layout(prov, records))


@pytest.fixture()
def results(tmp_path):
    d = tmp_path / "h200"
    d.mkdir()
    _ab_file(d / "layer-count-ab.json", "layer-count", ["count_block_size=1024"], ["count_block_size=128"],
             Runner("count_block_size", 128, alone=-3.2, one=-2.6))
    _ab_file(d / "layer-act-ab.json", "layer-act", ["act_variant=legacy"], ["act_variant=capped"],
             Runner("act_variant", "capped", alone=-0.3, one=+1.5))
    # the layer sweep: "seed 000 (count 128)" fastest at decode; caps 512 / 1024 / 2048 in between
    spec = load_spec("layer")
    cases = expand(spec)
    recs = []
    for i, c in enumerate(cases):
        us = 100.0 - (2.0 if c.label.startswith("seed 000") else 0.0)
        if c.params.get("act_variant") == "capped" and c.params.get("act_grid_cap") == 1024:
            us -= 1.0
        status = "unavailable" if c.variant == "mcore" else "ok"
        recs.append(Record("layer", "layer", c.id, c.variant, c.label, status, params=dict(c.params),
                           launch={k: v for k, v in c.params.items() if k.startswith(("count_", "act_"))},
                           timing={"median_us": us} if status == "ok" else {}))
    add_baseline_deltas(spec, recs)
    (d / "layer.json").write_text(results_json_layout({"sweep": "layer", "device": DEVICE}, recs))
    kd = tmp_path / "kernels"
    kd.mkdir()
    count_ab = [Record("count-block", "count", "x", "persistent", "persistent", "ok",
                       params={"tokens": 256, "buffer_tokens": 16384}, timing={"median_us": 1.9})]
    prov = {"sweep": "count-block", "ab": {"cases": [{"case": "tokens=256", "delta_us": -3.271,
                                                     "separation": "better"}]}}
    (kd / "count-block-ab.json").write_text(results_json_layout(prov, count_ab))
    act_rows = [Record("act-grid-rows", "act", v, v, v, "ok", params={"rows": 4096, "live_rows": 2048},
                       launch={"grid_cap": cap}, timing={"median_us": us})
                for v, cap, us in (("capped", 8192, 3.97), ("legacy", 512, 3.40))]
    (kd / "act-grid-rows.json").write_text(results_json_layout({"sweep": "act-grid-rows"}, act_rows))
    return d, kd


def test_the_section_gives_each_changes_conversion_and_verdict(results):
    d, kd = results
    text = section(d, kd)
    assert text.startswith(HEADING) and "NVIDIA H200" in text
    count = next(line for line in text.splitlines() if line.startswith("| seed 000"))
    cells = [c.strip() for c in count.strip("|").split("|")]
    assert cells[1] == "256 of 256" and cells[2].startswith("-3.271 (better)")
    assert cells[3].startswith("-3.200") and cells[4].startswith("-2.600") and cells[5] == "0.81"
    assert cells[6] == "-153.6" and cells[7].startswith("-112.3") and cells[8] == "0.73"
    assert "**seed 000: count BLOCK_SIZE 1024 → 128**: alone it saves 3.200 µs" in text
    assert "the win **survives**" in text
    # the activation change saves alone but costs in the layer: the verdict says it reverses
    assert "in the layer step it costs 1.500 µs" in text and "**reverses**" in text
    act = next(line for line in text.splitlines() if line.startswith("| seed 001"))
    assert "+0.570 (one sweep, no arms) (`act-grid-rows.json`, M 4096 (the layer's 2560 rows" in act
    # the sweep table: the fastest at decode, against the before-launch
    assert ("| silu_mul_bounded | 256 of 256 | 32 | before (count 1024, act min(M,512)) 100.00 | "
            "seed 000 (count 128) 98.00 |") in text
    assert "| silu_mul_bounded | 256 of 256 | 16 | before, other EP 100.00 |" in text
    assert "Separation: " in text and '"overlap (m)": the slowest ON measurement is m slower' in text


def test_the_sweep_table_says_tie_inside_the_noise(results):
    d, kd = results
    doc = json.loads((d / "layer.json").read_text())
    for r in doc["records"]:  # every record +-2%: at decode the 98 and 99 intervals overlap the 100s
        if r["timing"]:
            r["timing"]["rel_noise"] = 0.02
    (d / "layer.json").write_text(json.dumps(doc))
    text = section(d, kd)
    row = next(line for line in text.splitlines() if line.startswith("| silu_mul_bounded | 256 of 256 | 32 |"))
    assert "tie: seed 000 (count 128) 98.00 ± 1.96; count 128, act cap, act_grid_cap=1024 99.00 ± 1.98" in row
    assert "do not say which of them is faster" in text


def test_best_cap_reads_the_layer_sweep(results):
    d, _ = results
    assert best_cap(d / "layer.json") == 1024
    assert best_cap(d / "missing.json") is None


def test_the_command_line(results, tmp_path, capsys):
    d, kd = results
    assert main([str(d), "--kernel-dir", str(kd), "-o", str(tmp_path / "s.md")]) == 0
    assert (tmp_path / "s.md").read_text().startswith(HEADING)
    assert main(["best-cap", str(d / "layer.json")]) == 0
    assert capsys.readouterr().out.strip() == "1024"
    assert main(["best-cap", str(tmp_path / "none.json"), "--default", "2048"]) == 0
    assert capsys.readouterr().out.strip() == "2048"
    json.loads((d / "layer-count-ab.json").read_text())  # the synthetic files are results files


def test_the_report_and_the_layer_pages_need_no_torch(results, tmp_path):
    """A reader: it runs where torch and triton cannot be imported, as does `moebench render` of
    a layer sweep (the family's sections)."""
    import subprocess
    import sys
    from pathlib import Path

    d, kd = results
    root = Path(__file__).resolve().parents[2]
    blocked = "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None; "
    code = blocked + (f"sys.path.insert(0, 'scripts'); from layer_report import main; "
                      f"main([{str(d)!r}, '--kernel-dir', {str(kd)!r}])")
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert HEADING in r.stdout
    code = blocked + ("sys.argv = ['moebench', 'render', " + repr(str(d / "layer.json")) + "]; "
                      "from moebench.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "## In the layer" in (d / "layer.md").read_text()

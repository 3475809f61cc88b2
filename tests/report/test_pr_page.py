"""`moebench pr`'s page from its document (moebench.report.pr.build), records aside."""

from pathlib import Path

import pytest

from moebench.core.records import load_results
from moebench.report.pr import ab_page, build


def test_the_separation_section_projects_per_step_with_the_layers_one_launch_covers():
    """A launch that is a whole 48-layer step: its Δ per step is the Δ per launch, not 48 times it."""
    case = {"case": "tokens=256", "off_case_id": "off1", "on_case_id": "on1", "errors": [],
            "arms": [{"side": "OFF", "values": [10.0, 10.2]}, {"side": "ON", "values": [9.0, 9.1]},
                     {"side": "OFF", "values": [10.1, 10.3]}, {"side": "ON", "values": [9.2, 9.0]}]}
    doc = {"skipped": {}, "on": ["x=1"], "off": ["x=0"], "spec": "s", "device": "d", "timer": "Graph replay.",
           "moe_layers": 48, "per_launch": {"off1": 48},
           "sections": {"separation": {"arms": 4, "iters": 2, "cases": [case]}}}
    nums, page = build(doc, [], ["separation"])
    delta = nums["separation"][0]["delta"]
    assert abs(nums["separation"][0]["per_step_delta_us"] - delta) < 1e-9
    row = next(line for line in page.splitlines() if line.startswith("| tokens=256 |"))
    assert row.rstrip(" |").endswith(f"{delta:+.1f} µs")
    assert "Measured per step" in page and "Projected per step" not in page


@pytest.mark.parametrize("results", sorted((Path(__file__).resolve().parents[2] / "results").glob("*/*-ab.json")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_committed_ab_page_is_what_its_json_builds_today(results):
    """Each committed `ab` page is report.pr.ab_page of its JSON alone (the arms' values in
    provenance.ab, the records): the statistics are recomputed, and a page never drifts from its data."""
    prov, records = load_results(results)
    assert ab_page(prov, records) == results.with_suffix(".md").read_text()

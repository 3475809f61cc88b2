"""Combine PULL tile against the LDS budget (seed 002): the host-side model, its spec and its page.

Every number asserted here is quoted from the PR or its review; the model is pure integer
arithmetic, so the checks are exact.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from dataclasses import astuple
from pathlib import Path

import pytest

import warm

from moebench.core.cases import expand
from moebench.errors import SpecError
from moebench.families.combine import FAMILY, LDS_BUDGET
from moebench.families.combine import kernels as C
from moebench.core.family import cdiv
from moebench.core.records import Record
from moebench.core.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def defaults(**over) -> dict:
    """A case at the family's defaults, as the host runner would hand it to `evaluate`."""
    params = {n: p.default for n, p in FAMILY.params.items()}
    params.update(over)
    return params


def old(**over) -> dict:
    return C.evaluate(defaults(**over), "old")


def new(**over) -> dict:
    return C.evaluate(defaults(compact_npes=None, **over), "new")  # `new` does not read compact_npes


# ----------------------------------------------------------------------------------- seed figures


def test_budget_is_320_kb():
    assert LDS_BUDGET == 327680
    d = defaults()
    assert (d["world"], d["hidden"], d["warps"], d["dtype"], d["use_weights"], d["tdm"]) == (
        8, 7168, 8, "bf16", True, 2)


@pytest.mark.parametrize("topk,need,path", [
    (5, 287360, "PULL"),
    (6, 344832, "fallback"),
    (7, 402304, "fallback"),
    (8, 459776, "QUAD"),  # (459776): QUAD takes it, PULL never runs
    (9, 517248, "fallback"),
])
def test_old_rule_review_table(topk, need, path):
    w = old(topk=topk)
    assert (w["rule"], w["src_max"], w["chunks"], w["lds_bytes"], w["path"]) == ("old", topk, 2, need, path)
    assert w["fits"] == (need <= LDS_BUDGET)


@pytest.mark.parametrize("world,topk,chunks,need,path", [
    (4, 6, 2, 230144, "QUAD"),  # unchanged: the collateral-damage control
    (8, 6, 3, 234240, "PULL"),  # the fix
    (16, 8, 3, 312320, "PULL"),  # the host-side replica above 8 ranks
])
def test_new_rule_pr_figures(world, topk, chunks, need, path):
    w = new(world=world, topk=topk)
    assert (w["rule"], w["chunks"], w["lds_bytes"], w["fits"], w["path"]) == ("new", chunks, need, True, path)


def test_world_4_bit_identical_across_rules():
    # "world 4 still resolves to 2 chunks and the same 230144 bytes"
    for topk in (6, 8):
        o, n = old(world=4, topk=topk), new(world=4, topk=topk)
        assert (o["chunks"], o["tile"], o["lds_bytes"]) == (n["chunks"], n["tile"], n["lds_bytes"])


def test_seed_figures_all_match_from_model_and_from_records():
    figs = C.seed_figures()
    assert len(figs) == 8 and all(f.match and f.source == "model" for f in figs)
    # from records: a corrupted record must show up as a mismatch, not be recomputed away
    recs = [_record(f.rule, world=f.world, topk=f.topk) for f in figs]
    recs[1].work["lds_bytes"] += 128
    got = C.seed_figures(recs)
    assert [f.source for f in got] == ["sweep"] * 8
    assert [f.match for f in got] == [True, False] + [True] * 6


# ----------------------------------------------------------------------------------- the band


def test_old_band_at_world_8():
    fallback = {k for k in range(1, 17) if old(topk=k)["path"] == "fallback"}
    assert fallback == {6, 7} | set(range(9, 17))
    assert old(topk=5)["path"] == "PULL" and old(topk=8)["path"] == "QUAD"


def test_new_rule_has_no_band_at_world_8():
    assert all(new(topk=k)["path"] != "fallback" for k in range(1, 17))


def test_new_src_max_stops_over_reserving_when_topk_exceeds_npes():
    assert old(world=8, topk=12)["src_max"] == 12
    assert new(world=8, topk=12)["src_max"] == 8
    # at npes <= 4 the old rule already compacted
    assert old(world=4, topk=12)["src_max"] == new(world=4, topk=12)["src_max"] == 4


def test_path_change_npes_8_topk_16_fallback_to_quad():
    # the review's first note: the srcMax bound also moves topk > npes (npes > 4) onto QUAD
    o, n = old(topk=16), new(topk=16)
    assert (o["src_max"], o["lds_bytes"], o["path"]) == (16, 919552, "fallback")
    assert (n["src_max"], n["path"]) == (8, "QUAD")


# ----------------------------------------------------------------------------------- the model


def _least_fitting_chunks(hidden, warps, src, ptr, budget, tdm, dtype):
    """The rule as the PR states it: count up from MORI_COMB_TDM until the need fits; give up once
    the tile is a single row."""
    row = C.row_elems(dtype)
    for c in range(tdm, max(tdm, cdiv(hidden, row)) + 1):
        if C.lds_need(ptr, warps, src, C.tile_elems(hidden, c, dtype), dtype) <= budget:
            return c
    return None


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_closed_form_chunks_equal_the_search(dtype):
    checked = gave_up = 0
    for budget, hidden in itertools.product((LDS_BUDGET, 64 * 1024, 20000), (4096, 7168, 1000)):
        for topk in (1, 2, 5, 6, 9, 17, 31, 63):
            for warps in (1, 3, 8, 16, 32):
                for tdm in (1, 2, 3):
                    ptr = C.pointer_bytes(warps, topk, True)
                    want = _least_fitting_chunks(hidden, warps, topk, ptr, budget, tdm, dtype)
                    got = C.fit_chunks(hidden, C.tile_cap(warps, topk, ptr, budget, dtype), tdm)
                    assert got == want, (hidden, topk, warps, tdm)
                    s = C.size("new", topk + 1, topk, hidden, warps, budget=budget, tdm=tdm, dtype=dtype)
                    assert s.chunks == (want or tdm) and s.fits == (want is not None)
                    assert s.path == ("PULL" if want else "fallback")
                    checked += 1
                    gave_up += want is None
    assert checked and 0 < gave_up < checked  # both branches exercised


def test_pointer_and_tile_rounding():
    assert C.pointer_bytes(8, 5, True) == 640
    assert C.pointer_bytes(1, 1, False) == 128  # padded to one row
    assert C.pointer_bytes(8, 5, False) == 384
    assert C.tile_elems(7168, 3, "bf16") == 2432  # ceil(7168 / 3) = 2390 -> 38 rows of 64
    assert C.tile_elems(7168, 3, "fp32") == 2400  # rows of 32
    assert C.row_elems("bf16") == 64 and C.row_elems("fp32") == 32


def test_weights_and_dtype_move_the_need():
    base = new(topk=6)
    assert new(topk=6, use_weights=False)["ptr_bytes"] < base["ptr_bytes"]
    f = old(topk=5, dtype="fp32")
    assert f["lds_bytes"] == 640 + 8 * 5 * 3584 * 4 and f["path"] == "fallback"


# ----------------------------------------------------------------------------------- guarantee


@pytest.mark.parametrize("bound", C.BOUNDS, ids=lambda b: b.name)
@pytest.mark.parametrize("hidden", [4096, 7168])
def test_new_rule_fallback_unreachable(bound, hidden):
    g = C.guarantee(bound, hidden)
    assert g.shapes == bound.world * bound.topk * bound.warps
    assert g.fallback == []
    assert g.pull > 0 and g.quad > 0 and g.quad + g.pull == g.shapes
    # the review: _cPullTileCap still comes out at 128 in the worst case
    assert g.min_cap == 128 and g.min_tile == 128
    worst = (bound.world, bound.topk, bound.warps)
    assert worst in g.min_tile_at
    assert C.size("new", *worst[:2], hidden, worst[2]).tile_cap == 128


def test_guarantee_does_not_depend_on_world():
    # a non-QUAD shape has topk < npes, so srcMax = topk: every world above topk sizes the same
    for topk, warps in ((6, 8), (13, 15), (63, 16)):
        sizes = {astuple(C.size("new", w, topk, 7168, warps)) for w in range(topk + 1, 65)}
        assert len(sizes) == 1


def test_guarantee_reports_a_failure():
    # a budget too small for the worst wave64 shape: the check must say so, not pass vacuously
    g = C.guarantee(C.Bound("tight", 63, 64, 16), 7168, budget=20000)
    assert not g.holds and (64, 63, 16) in g.fallback


# ----------------------------------------------------------------------------------- spec & sweep


def test_sweep_spec_expands_and_carries_the_rule():
    spec = load_spec(str(ROOT / "sweeps" / "combine-lds.yaml"))
    cases = expand(spec)
    assert len(cases) == 6 * 16 * 2 * 3 * 2
    assert 0 < len(expand(spec, quick=True)) < 100
    for c in cases:
        assert (c.params["compact_npes"] is None) == (c.variant == "new")
    works = {(c.variant, c.params["world"], c.params["topk"], c.params["hidden"], c.params["warps"]):
             C.evaluate(c.params, c.variant) for c in cases}
    assert all(w["rule"] == key[0] for key, w in works.items())
    assert works[("old", 8, 6, 7168, 8)]["lds_bytes"] == 344832
    assert works[("new", 8, 6, 7168, 8)]["lds_bytes"] == 234240
    assert spec.pivot == {"rows": "topk", "cols": "world", "metric": "path"}


def _spec_file(tmp_path, body: str) -> str:
    p = tmp_path / "sweeps" / "c.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("name: c\nfamily: combine\nvariants: [old, new]\n" + textwrap.dedent(body))
    return str(p)


@pytest.mark.parametrize("body,key,says", [
    ("fixed: {dtype: fp16}\n", "fixed.dtype", "expected one of bf16, fp32; got 'fp16'"),
    ("axes: {topk: [8, 64]}\n", "axes.topk[1]", "must be <= 63"),
    ("axes: {world: [0, 8]}\n", "axes.world[0]", "must be >= 1"),
    ("fixed: {use_weights: 1}\n", "fixed.use_weights", "expected true or false"),
    ("fixed: {tdm: 0}\n", "fixed.tdm", "must be >= 1"),
    ("axes: {rule: [old]}\n", "axes.rule", "unknown parameter of family 'combine'"),
])
def test_bad_values_are_spec_errors(tmp_path, body, key, says):
    with pytest.raises(SpecError) as e:
        expand(load_spec(_spec_file(tmp_path, body)))
    assert e.value.key == key and says in e.value.message


def test_compact_npes_belongs_to_old_only(tmp_path):
    path = _spec_file(tmp_path, "")
    Path(path).write_text("name: c\nfamily: combine\n"
                          "variants: [{variant: new, params: {compact_npes: 4}}]\n")
    with pytest.raises(SpecError, match="does not take 'compact_npes'"):
        load_spec(path)


def test_unknown_variant_lists_the_rules(tmp_path):
    path = _spec_file(tmp_path, "")
    Path(path).write_text("name: c\nfamily: combine\nvariants: [newer]\n")
    with pytest.raises(SpecError, match="family 'combine' has old, new"):
        load_spec(path)


# ----------------------------------------------------------------------------------- results page


def _record(rule: str, **over) -> Record:
    params = defaults(**over) if rule == "old" else defaults(compact_npes=None, **over)
    return Record("combine-lds", "combine", f"{rule}-{over}", rule, rule, "ok", params=params,
                  work=C.evaluate(params, rule))


def test_markdown_sections():
    recs = [_record(rule, world=w, topk=k) for rule in ("old", "new") for w in (4, 8, 16) for k in range(1, 17)]
    from moebench.report.sections.combine import markdown_sections

    md = markdown_sections(recs)
    assert "**8/8 match**" in md
    assert "| 8 | 1-16 | 6-7, 9-16 | none |" in md  # world 8: old band, new none
    assert "npes 8, topk 16 (hidden 7168, 8 warps): fallback (old PULL need 919552 bytes) -> QUAD" in md
    assert "The guarantee holds" in md and "**fails**" not in md


def test_kernel_module_is_torch_free():
    code = ("import sys, moebench.families.combine.kernels, moebench.families.combine; "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_quick_sweep_end_to_end(tmp_path):
    r = warm.run(["sweep", "combine-lds", "--quick", "--out", tmp_path], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "host" / "combine-lds-quick.md").read_text()  # OUT/<device>/NAME.*, host-only too
    assert "**8/8 match**" in md and "## Per-element fallback band" in md
    assert (tmp_path / "host" / "combine-lds-quick.csv").exists()

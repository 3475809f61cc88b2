"""The combine family's part of a sweep's results page: the seed figures, the fallback band, the
path changes and the new rule's guarantee, read from records and the family's host model (pure
Python, no torch)."""

from __future__ import annotations

import functools

from moebench.core.text import md_table
from moebench.families.combine import LDS_BUDGET
from moebench.families.combine.kernels import (_ELEM_BYTES, _TDM, BOUNDS, FALLBACK, SEED_SHAPE, SHAPE_KEYS, by_rule,
                                               guarantee, seed_figures)


def _ranges(values) -> str:
    """[6, 7, 9, 10, 11] -> '6-7, 9-11'; empty -> 'none'."""
    vs = sorted(set(values))
    if not vs:
        return "none"
    parts, start, prev = [], vs[0], vs[0]
    for v in vs[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


def _group_cols(keys) -> list[str]:
    """The shape parameters (other than topk) that vary across the sweep, world always first."""
    keys = list(keys)
    cols = ["world"]
    for i, name in enumerate(SHAPE_KEYS):
        if name not in ("world", "topk") and len({k[i] for k in keys}) > 1:
            cols.append(name)
    return cols[1:] + cols[:1]  # hidden, warps, ... then world: rows read as a band per world


def _groups(keys, cols: list[str]) -> dict[tuple, list[tuple]]:
    idx = [SHAPE_KEYS.index(c) for c in cols]
    out: dict[tuple, list[tuple]] = {}
    for k in sorted(keys, key=lambda k: tuple(str(x) if isinstance(x, str) else x for x in k)):
        out.setdefault(tuple(k[i] for i in idx), []).append(k)
    return dict(sorted(out.items()))


def _figures_section(records: list) -> str:
    figs = seed_figures(records)
    rows = []
    for f in figs:
        lead = f.expected_chunks is not None  # the PR states chunks for the new rule only
        exp = (f"{f.expected_chunks} / " if lead else "") + f"{f.expected_bytes} ({f.expected_path})"
        got = (f"{f.chunks} / " if lead else "") + f"{f.lds_bytes} ({f.path})"
        rows.append([f.rule, f.world, f.topk, exp, got, "yes" if f.match else "**no**", f.source])
    n_ok = sum(f.match for f in figs)
    return "\n".join([
        "## Seed figures", "",
        f"The PR's and the review's numbers at hidden 7168, 8 warps, bf16, weights on, budget {LDS_BUDGET} "
        f"bytes, MORI_COMB_TDM {_TDM}: **{n_ok}/{len(figs)} match**. Expected and computed are "
        "[chunks /] LDS bytes (path); source says whether the row came from this sweep or was computed "
        "because the sweep does not hold that shape.", "",
        md_table(["rule", "world", "topk", "expected", "computed", "match", "source"], rows)])


def _band_section(by: dict) -> str:
    keys = set(by["old"]) | set(by["new"])
    if not keys:
        return ""
    cols = _group_cols(keys)
    rows = []
    for gkey, members in _groups(keys, cols).items():
        topks = [k[1] for k in members]
        old = [k[1] for k in members if by["old"].get(k, {}).get("path") == FALLBACK]
        new = [k[1] for k in members if by["new"].get(k, {}).get("path") == FALLBACK]
        has_old = any(k in by["old"] for k in members)
        has_new = any(k in by["new"] for k in members)
        rows.append([*gkey, _ranges(topks), _ranges(old) if has_old else "—", _ranges(new) if has_new else "—"])
    return "\n".join([
        "## Per-element fallback band", "",
        "The topk values whose combine drops to the per-element fallback (not QUAD, PULL need over the "
        "budget), per rule. Under the old rule the band is not contiguous: at world 8 (hidden 7168, 8 "
        "warps) topk 5 fits and topk 8 escapes through the QUAD gate (srcMax == npes), which is why it "
        "went unnoticed.", "",
        md_table(cols + ["topk swept", "old: fallback at topk", "new: fallback at topk"], rows)])


def _changes_section(by: dict) -> str:
    both = set(by["old"]) & set(by["new"])
    if not both:
        return ""
    cols = _group_cols(both)
    moves = sorted({(by["old"][k]["path"], by["new"][k]["path"]) for k in both
                    if by["old"][k]["path"] != by["new"][k]["path"]})
    total = sum(by["old"][k]["path"] != by["new"][k]["path"] for k in both)
    out = ["## Path changes, old rule -> new rule", ""]
    if not moves:
        return "\n".join(out + [f"No shape of the {len(both)} changes path."])
    rows = []
    for gkey, members in _groups(both, cols).items():
        cells = [_ranges(k[1] for k in members if (by["old"][k]["path"], by["new"][k]["path"]) == m) for m in moves]
        if any(c != "none" for c in cells):
            rows.append([*gkey, *cells])
    out += [f"{total} of {len(both)} shapes take another path under the new rule; the cells list their topk. "
            "fallback -> PULL is the fix the PR describes. Moves onto QUAD come from bounding srcMax by "
            "min(npes, topk): once topk > npes (npes > 4), srcMax == npes and the QUAD gate accepts "
            "(the review's first note); QUAD dedups to at most npes sources on its own.", ""]
    ex = (8, 16, *SEED_SHAPE.values())
    if ex in both:
        o, n = by["old"][ex], by["new"][ex]
        out += [f"The review's example, npes 8, topk 16 (hidden 7168, 8 warps): {o['path']} "
                f"(old PULL need {o['lds_bytes']} bytes) -> {n['path']}.", ""]
    out.append(md_table(cols + [f"{a} -> {b}" for a, b in moves], rows))
    return "\n".join(out)


@functools.cache  # constants only: every combine page of a process shows the same section
def _guarantee_section() -> str:
    rows, holds = [], True
    for dtype in ("bf16", "fp32"):
        for bound in BOUNDS:
            for hidden in (4096, 7168):
                g = guarantee(bound, hidden, dtype=dtype)
                holds &= g.holds
                w, k, wp = max(g.min_tile_at, key=lambda t: (t[1], t[2], t[0]))
                pairs = len({(t[1], t[2]) for t in g.min_tile_at})
                mw, mk, mwp = g.max_need_at
                rows.append([f"{bound.name}: topk <= {bound.topk}, npes <= {bound.world}, warps <= {bound.warps}",
                             hidden, dtype, g.shapes, g.quad, g.pull, f"**{len(g.fallback)}**", g.min_cap,
                             f"{g.min_tile} el = {g.min_tile * _ELEM_BYTES[dtype]} B at {len(g.min_tile_at)} shapes "
                             f"({pairs} topk x warps pairs), worst npes {w} topk {k} warps {wp}",
                             g.max_chunks, f"{g.max_need} (npes {mw} topk {mk} warps {mwp})"])
    verdict = ("holds: every shape the new rule does not hand to QUAD fits PULL, so the per-element fallback "
               "is unreachable at any world size" if holds else "**fails**: see the fallback column")
    return "\n".join([
        "## New rule: the fallback is unreachable", "",
        f"Every shape EpCfgIsValid admits on each wave size (every integer npes, topk and warps up to the "
        f"bound), weights on, budget {LDS_BUDGET} bytes, MORI_COMB_TDM {_TDM}, sized by the new rule. The "
        f"guarantee {verdict}. A non-QUAD shape has topk < npes, so srcMax = topk and world size drops out "
        "of the inequality. The tile cap is _cPullTileCap, the largest whole-row tile that fits; the review "
        "says it still comes out at 128 in the worst case, and this model agrees for bf16: the smallest "
        "cap and the smallest tile are both 128 elements (two rows), never below one row. fp32 is beyond "
        "the review (the PR measured bf16); it holds too, bottoming out at 64 elements (two rows).", "",
        md_table(["bound", "hidden", "dtype", "shapes", "QUAD", "PULL", "fallback", "smallest tile cap",
                "smallest tile", "most chunks", "largest PULL need"], rows)])


def markdown_sections(records: list) -> str:
    """The seed figures, the fallback band, the path changes and the new rule's guarantee."""
    by = by_rule(records)
    parts = [_figures_section(records), _band_section(by), _changes_section(by), _guarantee_section()]
    return "\n\n".join(p for p in parts if p)

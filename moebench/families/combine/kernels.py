"""The gfx1250 combine PULL tile against the LDS budget (seed 002), evaluated on the host.

MORI EPv2's combine pulls each token's rows from the ranks it was routed to. The TDM PULL path
stages, per warp, one tile of every source row in LDS, so its need is

    need = ptr + W * S * tile * s          ptr  = round_up((1 + weights) * W * K * 8, 128)
                                           tile = round_up(ceil(H / chunks), 128 / s)

Shapes: P = world (npes), K = topk, H = hidden (elements), W = warps per block, s = element
bytes (2 bf16, 4 fp32), S = srcMax (distinct source ranks a warp reserves for), B = the budget.

- old rule (main): chunks = MORI_COMB_TDM; S = P if P <= 4 and P < K else K.
- new rule (the PR): S = min(P, K); chunks = the least count >= MORI_COMB_TDM whose need fits B.
- path: QUAD when S == P (QUAD sizes its own tiles and never reads this budget); otherwise PULL
  when the need fits; otherwise the per-element fallback, which reads peer memory with the
  fabric latency exposed (619 us against 81 us at world 8, topk 6 in the PR).

Pure integer arithmetic: no torch, no triton. `evaluate` is what the host runner calls per case;
`markdown_sections` adds the seed figures, the fallback band, the path changes and the new rule's
guarantee to the sweep's results page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moebench.core.text import md_table
from moebench.core.family import cdiv
from moebench.families.combine import FAMILY, LDS_BUDGET

# A TDM row is 128 bytes: tiles are whole rows, and the pointer arrays are padded to one.
_ROW_BYTES = 128
_ELEM_BYTES = {"bf16": 2, "fp32": 4}
# One 8-byte peer pointer per (warp, k) for the rows, and another for the weights.
_PTR_BYTES = 8
# MORI_COMB_TDM as shipped.
_TDM = 2
# main's srcMax expression compacts to npes only at or below this world size.
_COMPACT_NPES = 4

QUAD, PULL, FALLBACK = "QUAD", "PULL", "fallback"


def _round_up(n: int, to: int) -> int:
    return cdiv(n, to) * to


def row_elems(dtype: str) -> int:
    return _ROW_BYTES // _ELEM_BYTES[dtype]


def pointer_bytes(warps: int, topk: int, use_weights: bool) -> int:
    return _round_up((1 + int(use_weights)) * warps * topk * _PTR_BYTES, _ROW_BYTES)


def tile_elems(hidden: int, chunks: int, dtype: str) -> int:
    return _round_up(cdiv(hidden, chunks), row_elems(dtype))


def lds_need(ptr: int, warps: int, src_max: int, tile: int, dtype: str) -> int:
    return ptr + warps * src_max * tile * _ELEM_BYTES[dtype]


def src_max_old(world: int, topk: int, compact_npes: int = _COMPACT_NPES) -> int:
    return world if (world <= compact_npes and world < topk) else topk


def src_max_new(world: int, topk: int) -> int:
    return min(world, topk)


def tile_cap(warps: int, src_max: int, ptr: int, budget: int, dtype: str) -> int:
    """The largest tile (whole rows) whose need fits the budget (_cPullTileCap); 0 if not one row."""
    spare = budget - ptr
    if spare <= 0:
        return 0
    row = row_elems(dtype)
    return spare // (warps * src_max * _ELEM_BYTES[dtype]) // row * row


def fit_chunks(hidden: int, cap: int, tdm: int) -> int | None:
    """The least chunk count >= tdm whose tile is at most `cap` (_cPullFitChunks), or None when
    no count does (cap below one row). Tiles shrink monotonically with the count, and a tile is
    rounded up to whole rows while `cap` is whole rows, so tile(c) <= cap iff ceil(H / c) <= cap
    iff c >= ceil(H / cap): no search needed."""
    if cap <= 0:
        return None
    return max(tdm, cdiv(hidden, cap))


@dataclass(frozen=True)
class Sizing:
    rule: str
    src_max: int
    chunks: int
    tile: int  # elements per source row per warp
    tile_cap: int | None  # new rule: the largest tile that fits (0: not one row); old rule: None
    ptr_bytes: int
    lds_bytes: int
    fits: bool
    path: str


def size(rule: str, world: int, topk: int, hidden: int, warps: int, *, budget: int = LDS_BUDGET,
         tdm: int = _TDM, dtype: str = "bf16", use_weights: bool = True,
         compact_npes: int = _COMPACT_NPES) -> Sizing:
    """Size the PULL tile of one shape under `rule` ("old" or "new") and say which path runs."""
    ptr = pointer_bytes(warps, topk, use_weights)
    cap = None
    if rule == "old":
        src = src_max_old(world, topk, compact_npes)
        chunks = tdm
    elif rule == "new":
        src = src_max_new(world, topk)
        cap = tile_cap(warps, src, ptr, budget, dtype)
        # nothing fits: keep MORI_COMB_TDM, the need stays over budget and combine falls back
        chunks = fit_chunks(hidden, cap, tdm) or tdm
    else:
        raise ValueError(f"unknown rule {rule!r}; expected old or new")
    tile = tile_elems(hidden, chunks, dtype)
    need = lds_need(ptr, warps, src, tile, dtype)
    fits = need <= budget
    path = QUAD if src == world else (PULL if fits else FALLBACK)
    return Sizing(rule, src, chunks, tile, cap, ptr, need, fits, path)


# The variant is the rule. The session hands an evaluator the parameters only; `old` alone reads
# compact_npes (None for `new`).


@FAMILY.variant("old", params=("compact_npes",),
                doc="main: chunks = MORI_COMB_TDM; srcMax = npes if npes <= 4 and npes < topk else topk")
def evaluate_old(params: dict) -> dict:
    return evaluate(params, "old")


@FAMILY.variant("new", doc="the PR: srcMax = min(npes, topk); chunks = the least count >= MORI_COMB_TDM whose tile "
                           "fits the budget")
def evaluate_new(params: dict) -> dict:
    return evaluate(params, "new")


def evaluate(params: dict, rule: str) -> dict:
    """One case under one rule: the sizing and the path taken."""
    extra = {"compact_npes": params["compact_npes"]} if rule == "old" else {}
    s = size(rule, params["world"], params["topk"], params["hidden"], params["warps"],
             budget=params["budget"], tdm=params["tdm"], dtype=params["dtype"],
             use_weights=params["use_weights"], **extra)
    return {"rule": s.rule, "src_max": s.src_max, "chunks": s.chunks, "tile": s.tile, "tile_cap": s.tile_cap,
            "ptr_bytes": s.ptr_bytes, "lds_bytes": s.lds_bytes, "fits": s.fits, "path": s.path}


# ----------------------------------------------------------------------------------- seed figures

# Every figure in the PR and its review, at the PR's shape: hidden 7168, 8 warps (comb 64x8),
# bf16, weights on, 320 KB, MORI_COMB_TDM 2. (rule, world, topk, chunks or None, LDS bytes, path)
SEED_SHAPE = {"hidden": 7168, "warps": 8, "budget": LDS_BUDGET, "tdm": _TDM, "dtype": "bf16",
              "use_weights": True}
SEED_FIGURES = (
    ("old", 8, 5, None, 287360, PULL),
    ("old", 8, 6, None, 344832, FALLBACK),
    ("old", 8, 7, None, 402304, FALLBACK),
    ("old", 8, 8, None, 459776, QUAD),
    ("old", 8, 9, None, 517248, FALLBACK),
    ("new", 4, 6, 2, 230144, QUAD),
    ("new", 8, 6, 3, 234240, PULL),
    ("new", 16, 8, 3, 312320, PULL),
)


@dataclass(frozen=True)
class FigureCheck:
    rule: str
    world: int
    topk: int
    expected_chunks: int | None
    expected_bytes: int
    expected_path: str
    chunks: int
    lds_bytes: int
    path: str
    source: str  # "sweep" (read from a record) or "model" (not in the sweep: computed here)

    @property
    def match(self) -> bool:
        return (self.lds_bytes == self.expected_bytes and self.path == self.expected_path
                and (self.expected_chunks is None or self.chunks == self.expected_chunks))


def seed_figures(records: list | None = None) -> list[FigureCheck]:
    """The eight seed figures against the model: read from the sweep's records where the sweep
    has the shape at the seed defaults, else computed directly."""
    found = {}
    for r in records or ():
        p = r.params
        if r.status != "ok" or any(p.get(k) != v for k, v in SEED_SHAPE.items()):
            continue
        if r.work.get("rule") == "old" and p.get("compact_npes") != _COMPACT_NPES:
            continue
        found[(r.work.get("rule"), p["world"], p["topk"])] = r.work
    out = []
    for rule, world, topk, chunks, nbytes, path in SEED_FIGURES:
        w, source = found.get((rule, world, topk)), "sweep"
        if w is None:
            s = size(rule, world, topk, SEED_SHAPE["hidden"], SEED_SHAPE["warps"])
            w, source = {"chunks": s.chunks, "lds_bytes": s.lds_bytes, "path": s.path}, "model"
        out.append(FigureCheck(rule, world, topk, chunks, nbytes, path, w["chunks"], w["lds_bytes"], w["path"],
                               source))
    return out


# ----------------------------------------------------------------------------------- guarantee


@dataclass(frozen=True)
class Bound:
    """The largest shapes EpCfgIsValid admits on one wave size."""

    name: str
    topk: int
    world: int
    warps: int


BOUNDS = (Bound("wave64", 63, 64, 16), Bound("wave32", 31, 32, 32))


@dataclass
class Guarantee:
    bound: Bound
    hidden: int
    dtype: str
    shapes: int = 0
    quad: int = 0
    pull: int = 0
    fallback: list = field(default_factory=list)  # (world, topk, warps) left on the per-element path
    min_cap: int | None = None  # smallest _cPullTileCap over the PULL shapes
    min_tile: int | None = None  # smallest tile over the PULL shapes
    min_tile_at: list = field(default_factory=list)  # (world, topk, warps) reaching min_tile
    max_chunks: int = 0
    max_need: int = 0
    max_need_at: tuple = ()

    @property
    def holds(self) -> bool:
        return not self.fallback


def guarantee(bound: Bound, hidden: int, *, dtype: str = "bf16", budget: int = LDS_BUDGET, tdm: int = _TDM,
              use_weights: bool = True) -> Guarantee:
    """Every shape under `bound` (world 1..P, topk 1..K, warps 1..W), sized by the new rule: which
    non-QUAD shapes still miss the budget (none, if the PR's claim holds), and how small the tile
    gets on the way."""
    g = Guarantee(bound, hidden, dtype)
    for world in range(1, bound.world + 1):
        for topk in range(1, bound.topk + 1):
            for warps in range(1, bound.warps + 1):
                s = size("new", world, topk, hidden, warps, budget=budget, tdm=tdm, dtype=dtype,
                         use_weights=use_weights)
                g.shapes += 1
                if s.path == QUAD:
                    g.quad += 1
                    continue
                if s.path == FALLBACK:
                    g.fallback.append((world, topk, warps))
                    continue
                g.pull += 1
                g.min_cap = s.tile_cap if g.min_cap is None else min(g.min_cap, s.tile_cap)
                if g.min_tile is None or s.tile < g.min_tile:
                    g.min_tile, g.min_tile_at = s.tile, []
                if s.tile == g.min_tile:
                    g.min_tile_at.append((world, topk, warps))
                g.max_chunks = max(g.max_chunks, s.chunks)
                if s.lds_bytes > g.max_need:
                    g.max_need, g.max_need_at = s.lds_bytes, (world, topk, warps)
    return g


# ----------------------------------------------------------------------------------- results page

_SHAPE_KEYS = ("world", "topk", "hidden", "warps", "budget", "tdm", "dtype", "use_weights")


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


def _by_rule(records: list) -> dict[str, dict[tuple, dict]]:
    """rule -> shape key -> work, over the ok records (old at its shipped compact_npes only)."""
    out: dict[str, dict[tuple, dict]] = {"old": {}, "new": {}}
    for r in records:
        rule = r.work.get("rule")
        if r.status != "ok" or rule not in out:
            continue
        if rule == "old" and r.params.get("compact_npes") != _COMPACT_NPES:
            continue
        out[rule][tuple(r.params[k] for k in _SHAPE_KEYS)] = r.work
    return out


def _group_cols(keys) -> list[str]:
    """The shape parameters (other than topk) that vary across the sweep, world always first."""
    keys = list(keys)
    cols = ["world"]
    for i, name in enumerate(_SHAPE_KEYS):
        if name not in ("world", "topk") and len({k[i] for k in keys}) > 1:
            cols.append(name)
    return cols[1:] + cols[:1]  # hidden, warps, ... then world: rows read as a band per world


def _groups(keys, cols: list[str]) -> dict[tuple, list[tuple]]:
    idx = [_SHAPE_KEYS.index(c) for c in cols]
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
    ex = next((k for k in sorted(both) if k[0] == 8 and k[1] == 16 and k[2] == 7168 and k[3] == 8
               and k[4:] == (LDS_BUDGET, _TDM, "bf16", True)), None)
    if ex is not None:
        o, n = by["old"][ex], by["new"][ex]
        out += [f"The review's example, npes 8, topk 16 (hidden 7168, 8 warps): {o['path']} "
                f"(old PULL need {o['lds_bytes']} bytes) -> {n['path']}.", ""]
    out.append(md_table(cols + [f"{a} -> {b}" for a, b in moves], rows))
    return "\n".join(out)


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
    by = _by_rule(records)
    parts = [_figures_section(records), _band_section(by), _changes_section(by), _guarantee_section()]
    return "\n\n".join(p for p in parts if p)

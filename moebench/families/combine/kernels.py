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
  fabric latency exposed.

Pure integer arithmetic: no torch, no triton. `evaluate` is what the host runner calls per case;
moebench.report.sections.combine reads these (seed figures, fallback band, path changes, the new
rule's guarantee) into the sweep's results page.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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


@dataclass(slots=True)  # not frozen: a page sizes ~400k shapes, and a frozen one takes 5x as long to make
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
        src = world if (world <= compact_npes and world < topk) else topk
        chunks = tdm
    elif rule == "new":
        src = min(world, topk)
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


@FAMILY.builds("old")
def evaluate_old(params: dict) -> dict:
    return evaluate(params, "old")


@FAMILY.builds("new")
def evaluate_new(params: dict) -> dict:
    return evaluate(params, "new")


def evaluate(params: dict, rule: str) -> dict:
    """One case under one rule: the sizing and the path taken."""
    s = size(rule, params["world"], params["topk"], params["hidden"], params["warps"],
             budget=params["budget"], tdm=params["tdm"], dtype=params["dtype"],
             use_weights=params["use_weights"], compact_npes=params["compact_npes"])
    return asdict(s)


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


SHAPE_KEYS = ("world", "topk", *SEED_SHAPE)


def by_rule(records) -> dict[str, dict[tuple, dict]]:
    """rule -> shape (SHAPE_KEYS values) -> work, over the ok records (old at its shipped compact_npes only)."""
    out: dict[str, dict[tuple, dict]] = {"old": {}, "new": {}}
    for r in records:
        rule = r.work.get("rule")
        if r.status != "ok" or rule not in out:
            continue
        if rule == "old" and r.params.get("compact_npes") != _COMPACT_NPES:
            continue
        out[rule][tuple(r.params[k] for k in SHAPE_KEYS)] = r.work
    return out


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
    found = by_rule(records or ())
    out = []
    for rule, world, topk, chunks, nbytes, path in SEED_FIGURES:
        w, source = found[rule].get((world, topk, *SEED_SHAPE.values())), "sweep"
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

"""Activation family (seed 001): the row-parallel MoE activation kernels and their launch grid.

SiLU-mul over a flat token-major buffer with a live-row bound, and the padded SwiGLU /
squared-ReLU kernels that also skip rows whose permutation-map entry is -1. The grid is
NUM_BLOCKS CTAs striding over rows; the variants differ only in how NUM_BLOCKS is chosen.
"""

from moebench.core.family import FamilySpec, Param, Preset, VariantSpec

OPS = ("silu_mul_bounded", "swiglu", "squared_relu")
GATED_OPS = ("silu_mul_bounded", "swiglu")  # input is gate | up, output is half as wide
PADDED_OPS = ("swiglu", "squared_relu")  # also skip rows whose permutation-map entry is -1


def widths(params: dict) -> tuple[int, int]:
    """(input width W, output width N) of a case. `in_cols` = 0 derives W from `ffn`; a set
    `in_cols` is the input width and N follows from it (W / 2 for the gated ops)."""
    gated = params["op"] in GATED_OPS
    w = params.get("in_cols") or 0
    if w == 0:
        n = params["ffn"]
        return (2 * n if gated else n), n
    return w, (w // 2 if gated else w)


def cost(params: dict) -> int:
    """Elements a case builds and touches, for the sharding cost model: input W + output N
    columns, for the capacity rows and the live ones."""
    w, o = widths(params)
    return (params.get("rows", 0) + params.get("live_rows", 0)) * (w + o)


FAMILY = FamilySpec(
    name="act",
    doc="Row-parallel bf16 MoE activations (SiLU-mul, SwiGLU, squared ReLU) over a live-row bound; "
        "grid = NUM_BLOCKS CTAs striding rows.",
    params={
        p.name: p
        for p in (
            Param("op", str, default="silu_mul_bounded", choices=OPS,
                  help="silu_mul_bounded: flat [M, 2N] -> [M, N] up to the live rows; swiglu / "
                       "squared_relu: padded, also skip rows whose permutation-map entry is -1"),
            Param("rows", int, min=1, help="capture-time row capacity M (tokens x topk); the grid is derived from it"),
            Param("live_rows", int, min=0,
                  help="rows live this step (a device scalar read in-kernel; n_used for the padded ops)"),
            Param("ffn", int, min=1, model_key="moe_ffn", help="output width N (per-expert FFN width)"),
            Param("in_cols", int, default=0, min=0,
                  help="input width; 0 = 2N for the gated ops, N for squared_relu. When set, N follows "
                       "from it and ffn is not used"),
            Param("pad_frac", float, default=0.25, min=0.0, max=1.0,
                  help="fraction of permutation-map entries that are -1 (padded ops only)"),
            Param("seed", int, default=0, min=0, help="input seed"),
            Param("grid_cap", int, default=8192, role="launch", pow2=True, min=1, max=2**30,
                  help="NUM_BLOCKS = min(next_pow2(rows), grid_cap) (tl.constexpr: one JIT per value)"),
            Param("num_warps", int, default=4, role="launch", pow2=True, min=1, max=32,
                  help="warps per CTA (4 = the PR's 128-thread block)"),
            Param("tile_rows", int, default=4, role="launch", pow2=True, min=1, max=256,
                  help="tiled variant: rows per tile"),
            Param("tile_cols", int, default=256, role="launch", pow2=True, min=16, max=4096,
                  help="tiled variant: columns per tile (contiguous bf16: 8 per 16-byte vector)"),
            Param("prefetch", int, default=0, role="launch", choices=(0, 1),
                  help="tiled variant: 1 = load the first tile against M alongside the live-row load"),
        )
    },
    rules=(
        ("live_rows <= rows", "live rows must not exceed the capture-time row capacity M"),
        ("op == 'squared_relu' or in_cols % 2 == 0",
         "the gated ops (silu_mul_bounded, swiglu) split the input into gate | up halves, so the "
         "input width in_cols must be even"),
    ),
    default_pivot={"rows": "grid_cap", "cols": "live_rows", "metric": "median_us"},
    plot=Preset("grid_cap", "live_rows", "occupancy curve", floor_panel=True),
    cost=cost,
    twin_tolerance=0.03,  # seed vs Megatron's kernel: bandwidth-bound, 0.6% median run to run
    variants=(
        VariantSpec("capped", params=("grid_cap", "num_warps"),
                    doc="the seed kernel (Megatron's mechanism: early exit for pid >= live rows, loop to the "
                        "capacity M) at NUM_BLOCKS = min(next_pow2(rows), grid_cap)"),
        VariantSpec("shipped", params=("num_warps",), env={"grid_cap": ("MCORE_MOE_ACTIVATION_GRID_CAP", 8192)},
                    doc="capped with the cap from $MCORE_MOE_ACTIVATION_GRID_CAP (the PR's default 8192; 512 is "
                        "the kill switch)"),
        VariantSpec("legacy", params=("num_warps",),
                    doc="the seed kernel at NUM_BLOCKS = min(rows, 512): the geometry before the PR"),
        VariantSpec("live-bound", params=("grid_cap", "num_warps"),
                    doc="capped geometry, but the row loop stops at the live count instead of the capacity "
                        "(moebench's first kernel; 64-bit row pointers)"),
        VariantSpec("upstream", params=("grid_cap", "num_warps"), source="upstream",
                    twins=("capped", "legacy", "shipped"),
                    doc="Megatron's kernel for the op (_silu_mul_bounded_kernel, _swiglu_kernel, "
                        "_squared_relu_kernel), imported at run time, at NUM_BLOCKS = min(next_pow2(rows), grid_cap)"),
        VariantSpec("tiled", params=("grid_cap", "num_warps", "tile_rows", "tile_cols", "prefetch"),
                    doc="silu_mul_bounded over TILE_ROWS x TILE_COLS tiles of the live prefix, round-robin over "
                        "min(grid_cap, tiles at capacity) programs"),
    ),
    package=__name__,
)

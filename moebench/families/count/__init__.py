"""Token-count family (seed 000): per-expert token counts of the local experts, via atomics.

Torch-free: the catalogue (parameters, rules, pivot and plot presets, sharding cost). Kernels,
reference, inputs and variants are in kernels.py; the results page's own section in
moebench.report.sections.count.
"""

from moebench.core.family import FamilySpec, Param, Preset, VariantSpec


def cost(params: dict) -> int:
    """Elements a case builds and touches, for the sharding cost model: the routing map at
    capacity (T x K) and the valid pairs the atomics count."""
    return (params.get("buffer_tokens", 0) + params.get("tokens", 0)) * max(1, params.get("topk", 1))


FAMILY = FamilySpec(
    name="count",
    doc="Per-local-expert token counts from a (T, K) routing map by integer atomic adds (MoE dispatch).",
    params={
        p.name: p
        for p in (
            Param("tokens", int, min=0, help="valid tokens this step (read from a device scalar)"),
            Param("buffer_tokens", int, min=1, help="capture-time capacity T; the grid is derived from it"),
            Param("topk", int, min=1, max=64, model_key="topk", help="experts per token K"),
            Param("num_experts", int, min=1, model_key="num_experts", help="routed experts E"),
            Param("local_experts", int, min=1, model_key="local_experts", help="experts on this rank"),
            Param("local_expert_start", int, default=0, min=0, help="first local expert id"),
            Param("routing", str, default="uniform", choices=("uniform", "zipf"),
                  help="expert choice: uniform, or Zipf-skewed towards hot experts"),
            Param("zipf_s", float, default=1.2, min=0.0, help="Zipf exponent when routing=zipf"),
            Param("seed", int, default=0, min=0, help="input seed"),
            Param("block_size", int, default=1024, role="launch", pow2=True, min=16, max=65536,
                  help="(token, k) pairs per program iteration (tl.constexpr)"),
            Param("num_warps", int, default=4, role="launch", pow2=True, min=1, max=32,
                  help="warps per program"),
            Param("grid", int, default=0, role="launch", min=0, max=2**20, auto="sm_count",
                  help="persistent grid; 0 = the device's SM count"),
            Param("prefetch", int, default=0, role="launch", choices=(0, 1),
                  help="privatized: 1 = load the first chunk alongside the valid count"),
        )
    },
    rules=(
        ("tokens <= buffer_tokens", "valid tokens must not exceed the buffer capacity"),
        ("topk <= num_experts", "topk must not exceed num_experts"),
        ("local_expert_start + local_experts <= num_experts",
         "local experts must lie inside [0, num_experts)"),
    ),
    default_pivot={"rows": "block_size", "cols": "tokens", "metric": "median_us"},
    plot=Preset("block_size", "tokens", "block-size curve"),
    cost=cost,
    twin_tolerance=0.05,  # seed vs Megatron's kernel: counter placement alone moves it 20-40%
    variants=(
        VariantSpec("persistent", params=("block_size", "num_warps", "grid"),
                    doc="the seed baseline, Megatron's mechanism: grid = SM count, each program a contiguous run of "
                        "ceil(chunks / grid) BLOCK_SIZE chunks; topk runtime, local experts constexpr"),
        VariantSpec("shipped", params=("num_warps", "grid"),
                    env={"block_size": ("MCORE_COUNT_TOKENS_BLOCK", 128)},
                    doc="persistent with BLOCK_SIZE from $MCORE_COUNT_TOKENS_BLOCK (the PR's default 128; "
                        "1024 is the kill switch)"),
        VariantSpec("nonpersistent", params=("block_size", "num_warps"),
                    doc="the seed's other kernel, Megatron's mechanism: grid = ceil(buffer_tokens * topk / BLOCK_SIZE) "
                        "from the capacity, one chunk per program"),
        VariantSpec("strided", params=("block_size", "num_warps", "grid"),
                    doc="grid = SM count; program p takes chunks p, p + grid, ...; topk constexpr, local experts "
                        "runtime (moebench's first persistent kernel)"),
        VariantSpec("prefetch", params=("block_size", "num_warps", "grid"),
                    doc="strided; the first chunk is loaded alongside the valid count, so the two latencies overlap"),
        VariantSpec("privatized", params=("block_size", "num_warps", "grid", "prefetch"),
                    doc="strided; a per-program register histogram flushed once (<= L atomics per program)"),
        VariantSpec("upstream", params=("block_size", "num_warps", "grid"), source="upstream",
                    twins=("persistent", "shipped"),
                    doc="Megatron's _count_local_tokens_kernel_persistent, imported at run time, at this case's "
                        "BLOCK_SIZE, warps and grid"),
        VariantSpec("upstream-nonpersistent", params=("block_size", "num_warps"), source="upstream",
                    twins=("nonpersistent",),
                    doc="Megatron's _count_local_tokens_kernel, imported at run time, grid from the capacity"),
    ),
    package=__name__,
)

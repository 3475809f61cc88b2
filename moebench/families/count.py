"""Token-count family (seed 000): per-expert token counts of the local experts, via atomics."""

from moebench.families import FamilySpec, Param, VariantSpec

FAMILY = FamilySpec(
    name="count",
    doc="Per-local-expert token counts from a (T, K) routing map by integer atomic adds (MoE dispatch).",
    module="moebench.kernels.count",
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
            Param("grid", int, default=0, role="launch", min=0,
                  help="persistent grid; 0 = the device's SM count"),
            Param("prefetch", int, default=0, role="launch", choices=(0, 1),
                  help="privatized: 1 = load the first chunk alongside the valid count"),
        )
    },
    variants={
        v.name: v
        for v in (
            VariantSpec("persistent", "grid = SM count; each program strides over BLOCK_SIZE chunks",
                        ("block_size", "num_warps", "grid")),
            VariantSpec("nonpersistent", "grid = ceil(buffer_tokens*topk / BLOCK_SIZE), one chunk each",
                        ("block_size", "num_warps")),
            VariantSpec("shipped", "persistent with BLOCK_SIZE from $MCORE_COUNT_TOKENS_BLOCK (default 128)",
                        ("num_warps", "grid")),
            VariantSpec("prefetch", "persistent; the first chunk is loaded alongside the valid count, "
                        "so the two latencies overlap", ("block_size", "num_warps", "grid")),
            VariantSpec("privatized", "persistent; a per-program register histogram flushed once "
                        "(<= L atomics per program)", ("block_size", "num_warps", "grid", "prefetch")),
        )
    },
    rules=(
        ("tokens <= buffer_tokens", "valid tokens must not exceed the buffer capacity"),
        ("topk <= num_experts", "topk must not exceed num_experts"),
        ("local_expert_start + local_experts <= num_experts",
         "local experts must lie inside [0, num_experts)"),
    ),
    default_pivot={"rows": "block_size", "cols": "tokens", "metric": "median_us"},
)

"""Layer family: one whole MoE layer step (or L of them) around a `count` and an `act` variant,
or that kernel alone on the step's tensors (`scope`); docs/layer.md describes it. Torch-free: the
catalogue. kernels.py has the stages; the pages' sections are in moebench.report.sections.layer.
"""

from __future__ import annotations

from typing import Mapping

from moebench.core.family import FamilySpec, Param, REQUIRED, VariantSpec, get_family
from moebench.families.act import FAMILY as ACT
from moebench.families.act import OPS, widths  # (FC1 output width W, activation output width N)
from moebench.families.count import FAMILY as COUNT

SCOPES = ("step", "count", "act")
# Shape parameters the step shares with the count family (live tokens V, capacity T, K, E, L, S).
_ROUTING = ("tokens", "buffer_tokens", "topk", "num_experts", "local_experts", "local_expert_start")
# At most this many MoE layers in one launch: Qwen3-30B-A3B has 48 (configs/qwen3-30b-a3b.yaml),
# and a 64-layer graph still fits an H200 (~20 GB of expert weights at these widths).
MAX_LAYERS = 64
# A graph replay of many layer steps should stay near this long: long enough that the graph's
# own launch cost (a few µs) is a small share, short enough that 20 replays take well under 1 s.
_REPLAY_BUDGET_US = 2000.0
# What an estimate of one layer step assumes: expert weights streamed at ~4 TB/s (the H200's
# measured DRAM copy ceiling, results/h200/device.json) plus ~30 µs of routing and glue kernels.
_WEIGHT_BYTES_PER_US = 4.0e6
_GLUE_US = 30.0


def _delegated(fam: FamilySpec, prefix: str) -> list[Param]:
    """The launch parameters of another family, renamed PREFIX + name: what a case passes to that
    family's variant (defaults, limits and help as that family declares them)."""
    out = []
    for name in fam.launch_params:
        p = fam.params[name]
        out.append(Param(prefix + name, p.type, default=p.default, role="launch", choices=p.choices, pow2=p.pow2,
                         min=p.min, max=p.max, help=f"{fam.name} family's {name}: {p.help}"))
    return out


def capacity_rows(params: dict) -> int:
    """Rows of the permuted buffer, fixed at capture: every live pair could be local, at most
    min(K, L) of a token's, plus one alignment block per expert (megatron-core sizes it so)."""
    return params["buffer_tokens"] * min(params["topk"], params["local_experts"]) + \
        params["align"] * params["local_experts"]


def expert_weight_bytes(params: dict) -> int:
    """FC1 + FC2 bf16 weights of the local experts, one layer."""
    w, n = widths(params)
    return params["local_experts"] * params["hidden"] * (w + n) * 2


def cost(params: dict) -> int:
    """Elements a case builds and touches, for the sharding cost model: the expert weights of
    every layer dominate."""
    return params.get("layers", 1) * expert_weight_bytes(params) // 2 + params["buffer_tokens"] * params["hidden"]


def layers_per_launch(params: dict) -> int:
    """A step launch covers `layers` MoE layers; a kernel alone, one."""
    return (params.get("layers") or 1) if params.get("scope", "step") == "step" else 1


def graph_launches(params: dict, spec_value: int) -> int:
    """Launches per graph: the spec's value for a kernel alone (scope count / act); for a step,
    as many as fit _REPLAY_BUDGET_US at an estimated weight-streaming time per layer."""
    if params.get("scope", "step") != "step":
        return spec_value
    try:
        est = params.get("layers", 1) * (expert_weight_bytes(params) / _WEIGHT_BYTES_PER_US + _GLUE_US)
    except (KeyError, TypeError):
        return spec_value
    return max(1, min(spec_value, int(_REPLAY_BUDGET_US // est)))


def _delegate(fam_name: str, variant: str, prefix: str, params: dict, shape: dict, device,
              environ: Mapping[str, str]) -> tuple[dict, dict]:
    """Another family's variant resolved as its own run would resolve it: its defaults, the shape
    this step gives it, the PREFIX launch values of this case, its kill switches from `environ`
    (the run's), a grid of 0 made the device's. Returns (params, sources)."""
    fam = get_family(fam_name)
    q = {n: p.default for n, p in fam.params.items() if p.default is not REQUIRED}
    q.update(shape)
    for n in fam.launch_params:
        if params.get(prefix + n) is not None:
            q[n] = params[prefix + n]
    return fam.resolve(variant, q, device, environ)


def resolve_delegates(variant: str, params: dict, device, environ: Mapping[str, str]) -> dict:
    """The step's count and act launches, resolved once per case with the case's environment
    (FamilySpec.resolve_more): `count_resolved` and `act_resolved`, each (params, sources). The act
    shape (its rows come from the inputs) is added by the builder; resolving does not read it."""
    if variant != "step":
        return {}
    count_shape = {**{n: params[n] for n in _ROUTING}, "seed": params["seed"]}
    return {"count_resolved": _delegate("count", params["count_variant"], "count_", params, count_shape, device,
                                        environ),
            "act_resolved": _delegate("act", params["act_variant"], "act_", params, {}, device, environ)}


FAMILY = FamilySpec(
    name="layer",
    doc="A whole bf16 MoE layer step (routing, count, offsets, permute, FC1, activation, FC2, combine) in one "
        "CUDA graph, with a count and an act variant under test; or that kernel alone on the layer's tensors.",
    params={
        p.name: p
        for p in (
            # the routing shape, as the count family declares it: the step hands these to its count variant
            *(COUNT.params[n] for n in _ROUTING),
            Param("hidden", int, min=8, model_key="hidden", help="model width H"),
            Param("ffn", int, min=8, model_key="moe_ffn", help="per-expert FFN width N"),
            Param("op", str, default="silu_mul_bounded", choices=OPS,
                  help="activation: silu_mul_bounded (Qwen3's SwiGLU), swiglu (the same, skipping "
                       "alignment-padding rows), squared_relu (megatron-core 0.19.2's fused path)"),
            Param("align", int, default=16, min=1, max=256,
                  help="rows per expert are padded to a multiple of this (megatron-core's BF16 grouped GEMM: 16)"),
            Param("layers", int, default=1, min=1, max=MAX_LAYERS,
                  help="MoE layers in one launch, each with its own router and expert weights"),
            Param("scope", str, default="step", choices=SCOPES,
                  help="what one launch is: the layer step, or the count / act kernel alone on the "
                       "layer's own tensors"),
            Param("seed", int, default=0, min=0, help="input seed"),
            Param("count_variant", str, default="persistent", role="launch", variant_of="count",
                  help="the count family's variant that counts tokens inside the step (any registered one, "
                       "plugins' included)"),
            *_delegated(COUNT, "count_"),
            Param("act_variant", str, default="capped", role="launch", variant_of="act",
                  help="the act family's variant that runs the activation inside the step (any registered one, "
                       "plugins' included)"),
            *_delegated(ACT, "act_"),
        )
    },
    rules=(
        ("tokens <= buffer_tokens", "live tokens must not exceed the capacity"),
        ("topk <= num_experts", "topk must not exceed num_experts"),
        ("local_expert_start + local_experts <= num_experts", "local experts must lie inside [0, num_experts)"),
        ("hidden % 8 == 0 and ffn % 8 == 0",
         "the grouped GEMM needs 16-byte row strides: hidden and ffn must be multiples of 8 (bf16)"),
        ("scope == 'step' or layers == 1", "a kernel alone (scope count or act) runs on one layer's tensors"),
    ),
    default_pivot={"rows": "label", "cols": "tokens", "metric": "median_us"},
    cost=cost,
    layers_per_launch=layers_per_launch,
    graph_launches=graph_launches,
    reference_after_build=True,  # scope act: the reference reads the FC1 output the builder wrote
    resolve_more=resolve_delegates,
    variants=(
        VariantSpec("step", params=("count_variant", "count_block_size", "count_num_warps", "count_grid",
                                     "count_prefetch", "act_variant", "act_grid_cap", "act_num_warps", "act_tile_rows",
                                     "act_tile_cols", "act_prefetch"),
                    doc="the layer step with a count and an act variant under test (scope step); or that "
                        "kernel alone on the step's own tensors (scope count / act)"),
        VariantSpec("mcore", source="upstream",
                    doc="megatron-core's mcore_fused_moe (BF16; squared ReLU only in 0.19.2) on the same routing and "
                        "weights: the upstream reference arm"),
    ),
    package=__name__,
)

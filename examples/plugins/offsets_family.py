"""A moebench plugin that adds a whole family: `offsets`, the step between token counting and
permutation in MoE dispatch. From per-expert token counts it computes each local expert's rows in
the permuted buffer: counts rounded up to an alignment (experts with no tokens stay at 0), and
their exclusive and inclusive prefix sums.

    moebench sweep examples/plugins/offsets.yaml

Shapes: L = local_experts, A = alignment. A family from a plugin is declared as the built-in
ones are (moebench/families/count/): a FamilySpec with its parameters, then in the module named
by `kernels=` the Triton kernel, launcher, torch reference and checks, input builder and the
variants. Here one file is both.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.families import Built, Check, FamilySpec, Param, next_pow2, register_family

FAMILY = register_family(FamilySpec(
    name="offsets",
    doc="Aligned per-expert row offsets (exclusive and inclusive prefix sums) from token counts",
    kernels=__name__,
    params={p.name: p for p in (
        Param("local_experts", int, min=1, max=4096, model_key="local_experts", help="experts on this rank L"),
        Param("alignment", int, default=16, min=1, max=1024, help="rows per expert rounded up to this multiple"),
        Param("max_count", int, default=512, min=0, help="token counts are drawn from [0, max_count]"),
        Param("empty_frac", float, default=0.25, min=0.0, max=1.0, help="fraction of experts with no tokens"),
        Param("seed", int, default=0, min=0, help="input seed"),
        Param("num_warps", int, default=4, role="launch", pow2=True, min=1, max=32, help="warps of the one program"),
    )},
    default_pivot={"rows": "num_warps", "cols": "local_experts", "metric": "median_us"},
))

_POISON = -0x0FF5E7  # output poison: no prefix sum of non-negative counts is negative


@triton.jit
def _aligned_offsets_kernel(
    counts_ptr,  # (L,) int32 token counts
    out_ptr,  # (2, L) int32: exclusive offsets, then inclusive offsets
    num_local,  # L
    ALIGN: tl.constexpr,
    LANES: tl.constexpr,  # next_pow2(L)
):
    """Grid: (1,). One program holds every expert in LANES lanes and scans them."""
    i = tl.arange(0, LANES)
    inside = i < num_local
    c = tl.load(counts_ptr + i, mask=inside, other=0)
    rows = ((c + ALIGN - 1) // ALIGN) * ALIGN  # 0 stays 0
    incl = tl.cumsum(rows, axis=0)
    tl.store(out_ptr + i, incl - rows, mask=inside)
    tl.store(out_ptr + num_local + i, incl, mask=inside)


def aligned_offsets(inp, num_warps: int):
    lanes = next_pow2(inp.counts.numel())

    def launch():
        _aligned_offsets_kernel[(1,)](inp.counts, inp.out, inp.counts.numel(), ALIGN=inp.alignment, LANES=lanes,
                                      num_warps=num_warps)

    return launch, lanes


def reference(inp, params: dict) -> torch.Tensor:
    c = inp.counts.cpu().long()
    a = params["alignment"]
    rows = (c + a - 1) // a * a
    incl = torch.cumsum(rows, 0)
    return torch.stack([incl - rows, incl]).to(torch.int32)


def check(inp, out: torch.Tensor, expected: torch.Tensor, params: dict) -> Check:
    got = out.cpu()
    if torch.equal(got, expected):
        return Check(True, "exact")
    return Check(False, f"{int((got != expected).sum())}/{expected.numel()} offsets differ from torch.cumsum")


def nonvacuity(inp, out: torch.Tensor, params: dict) -> dict:
    c = inp.counts.cpu()
    return {"tokens": int(c.sum()), "experts_with_tokens": int((c > 0).sum()), "rows_total": int(out[1, -1])}


def work(params: dict, geometry: dict, device) -> dict:
    L = params["local_experts"]
    return {"bytes": L * 4 + 2 * L * 4, "ctas": 1, "ctas_with_work": 1, "threads_per_cta": geometry["num_warps"] * 32}


@dataclass
class Inputs:
    counts: torch.Tensor  # (L,) int32
    out: torch.Tensor  # (2, L) int32
    alignment: int


def build_inputs(params: dict, device: str, set_index: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(params["seed"] * 1_000_003 + set_index)
    L = params["local_experts"]
    counts = torch.randint(1, max(2, params["max_count"] + 1), (L,), generator=g, dtype=torch.int32)
    counts[torch.rand(L, generator=g) < params["empty_frac"]] = 0
    out = torch.full((2, L), _POISON, dtype=torch.int32)
    return Inputs(counts.to(device), out.to(device), params["alignment"])


def input_bytes(params: dict) -> int:
    return params["local_experts"] * 4 * 3


@FAMILY.variant("scan", params=("num_warps",), doc="one program scans every expert with tl.cumsum")
def build_scan(inp: Inputs, params: dict, device) -> Built:
    launch, lanes = aligned_offsets(inp, params["num_warps"])

    def reset():
        inp.out.fill_(_POISON)

    return Built(launch, inp.out, reset, {"grid": 1, "lanes": lanes, "num_warps": params["num_warps"]})

"""A moebench plugin that adds one variant to the built-in `count` family.

    moebench sweep examples/plugins/count-histogram.yaml
    moebench sweep count-variants --plugin examples/plugins/count_histogram.py   # then name it in a spec

`histogram` counts each program's chunks with Triton's tl.histogram into a per-program histogram
and flushes it with one atomic per local expert, where the seed kernel issues one atomic per
routed pair. The builder gets the family's inputs (moebench.families.count.kernels.Inputs: the
(T, K) routing map, the valid-token scalar, the (L,) counters inside poisoned guard cells) and its
launch parameters already resolved (`grid` is the SM count when the spec says 0), and returns a
Built: the launch closure the session verifies against torch.bincount, times in a CUDA graph and
checks bit for bit against the spec's baseline launch.
"""

import triton
import triton.language as tl

from moebench.families import Built, get_family, next_pow2

COUNT = get_family("count")


@triton.jit
def _count_histogram_kernel(
    routing_map_ptr,  # (T, K) int32 expert ids
    valid_tokens_ptr,  # (1,) int32 V
    counts_ptr,  # (L,) int32, accumulated into
    local_start,  # S
    num_local,  # L
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BINS: tl.constexpr,  # next_pow2(L)
):
    """Grid: (P,). Program p takes chunks p, p + P, ... of the V * K valid pairs."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    hist = tl.zeros([BINS], dtype=tl.int32)
    for start in range(pid * BLOCK_SIZE, n_pairs, nprog * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        valid = offs < n_pairs
        local = tl.load(routing_map_ptr + offs, mask=valid, other=-1) - local_start
        hit = valid & (local >= 0) & (local < num_local)
        hist += tl.histogram(tl.where(hit, local, 0), BINS, mask=hit)
    bins = tl.arange(0, BINS)
    tl.atomic_add(counts_ptr + bins, hist, mask=(bins < num_local) & (hist > 0))


@COUNT.variant("histogram", params=("block_size", "num_warps", "grid"),
               doc="strided chunks counted with tl.histogram per program, one atomic per local expert")
def build_histogram(inp, params, device) -> Built:
    grid, block, nw = params["grid"], params["block_size"], params["num_warps"]
    bins = next_pow2(params["local_experts"])
    args = (inp.routing_map, inp.valid, inp.counts, params["local_expert_start"], params["local_experts"])

    def launch():
        _count_histogram_kernel[(grid,)](*args, TOPK=params["topk"], BLOCK_SIZE=block, BINS=bins, num_warps=nw)

    def reset():
        inp.counts.zero_()

    geometry = {"grid": grid, "block_size": block, "num_warps": nw, "chunking": "strided"}
    return Built(launch, inp.counts, reset, geometry)

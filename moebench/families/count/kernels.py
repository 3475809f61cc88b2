"""Token counting for MoE dispatch (seed 000): how many routed (token, k) pairs land on each
local expert, counted with integer atomic adds.

Shapes: T = buffer_tokens (capture-time capacity), V = tokens (valid this step, a device
scalar), K = topk, E = num_experts, L = local_experts, S = local_expert_start, P = programs
(the grid), B = BLOCK_SIZE (pairs per chunk). The map is read flat: pair i is token i // K.

Because the counts are an integer reduction by atomic_add, the launch geometry decides only
which thread issues which increment, never the multiset of increments: every geometry is
bit-exact with every other, and with torch.bincount.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.core.family import Built, Check, cdiv, next_pow2
from moebench.families.count import FAMILY
from moebench.sources import upstream

# Cells on each side of the counters, poisoned; a stray atomic outside [S, S + L) would hit them.
_GUARD = 16
_POISON = -0x5EED


@triton.jit
def _count_experts(
    counts_ptr,  # (L,) int32
    expert,  # (B,) int32 expert ids of one chunk; -1 where not loaded
    valid,  # (B,) bool: the pair is below V * K
    local_start,  # S
    num_local,  # L (a constexpr where the caller has one)
):
    local = expert - local_start
    hit = (local >= 0) & (local < num_local) & valid
    tl.atomic_add(counts_ptr + local, 1, mask=hit)


@triton.jit
def _count_chunk(
    routing_map_ptr,  # (T * K,) int32, flat
    counts_ptr,  # (L,) int32
    offs,  # (B,) pair offsets of one chunk
    n_pairs,  # V * K
    local_start,
    num_local,
):
    """Load one chunk of pairs and count those below V * K that land on a local expert."""
    in_range = offs < n_pairs
    expert = tl.load(routing_map_ptr + offs, mask=in_range, other=-1)
    _count_experts(counts_ptr, expert, in_range, local_start, num_local)


@triton.jit
def _count_persistent_kernel(
    routing_map_ptr,  # (T, K) int32 expert ids, row-major; rows >= V are stale
    counts_ptr,  # (L,) int32, accumulated into
    valid_tokens_ptr,  # (1,) int32 V, read on device (graph-safe)
    topk,  # K, a runtime argument
    local_start,  # S
    NUM_LOCAL: tl.constexpr,  # L
    num_programs,  # P, passed in as upstream passes its SM count
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (P,), fixed at capture. Program p counts the contiguous chunk run
    [p * ceil(C / P), min(p * ceil(C / P) + ceil(C / P), C)) of the C = ceil(V*K / B) chunks."""
    pid = tl.program_id(0)
    n_pairs = tl.load(valid_tokens_ptr) * topk
    n_chunks = tl.cdiv(n_pairs, BLOCK_SIZE)
    per_program = tl.cdiv(n_chunks, num_programs)
    first = pid * per_program
    if first < n_chunks:
        last = tl.minimum(first + per_program, n_chunks)
        for chunk in tl.range(first, last):
            offs = chunk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            _count_chunk(routing_map_ptr, counts_ptr, offs, n_pairs, local_start, NUM_LOCAL)


@triton.jit
def _count_nonpersistent_kernel(
    routing_map_ptr,  # (T, K) int32
    counts_ptr,  # (L,) int32
    valid_tokens_ptr,  # (1,) int32 V
    topk,  # K, a runtime argument
    local_start,  # S
    NUM_LOCAL: tl.constexpr,  # L
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (ceil(T * K / B),), from the capacity. Program p counts chunk p only."""
    pid = tl.program_id(0)
    n_pairs = tl.load(valid_tokens_ptr) * topk
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    _count_chunk(routing_map_ptr, counts_ptr, offs, n_pairs, local_start, NUM_LOCAL)


@triton.jit
def _count_strided_kernel(
    routing_map_ptr,  # (T, K) int32
    valid_tokens_ptr,  # (1,) int32 V
    counts_ptr,  # (L,) int32
    local_start,  # S
    num_local,  # L, a runtime argument
    TOPK: tl.constexpr,  # K
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (P,), fixed at capture. Program p counts chunks p, p + P, p + 2P, ... below V * K."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    for start in range(pid * BLOCK_SIZE, n_pairs, nprog * BLOCK_SIZE):
        _count_chunk(routing_map_ptr, counts_ptr, start + tl.arange(0, BLOCK_SIZE), n_pairs, local_start, num_local)


@triton.jit
def _count_prefetch_kernel(
    routing_map_ptr,  # (T, K) int32
    valid_tokens_ptr,  # (1,) int32 V
    counts_ptr,  # (L,) int32
    local_start,
    num_local,
    cap_pairs,  # T * K: bounds the speculative first load
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (P,), as the strided kernel. The first chunk's load is issued against the capacity,
    independently of the valid-count load, so the two memory latencies overlap instead of adding
    up; the valid bound is applied after both arrive."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    expert = tl.load(routing_map_ptr + offs, mask=offs < cap_pairs, other=-1)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    _count_experts(counts_ptr, expert, offs < n_pairs, local_start, num_local)
    for start in range((pid + nprog) * BLOCK_SIZE, n_pairs, nprog * BLOCK_SIZE):
        _count_chunk(routing_map_ptr, counts_ptr, start + tl.arange(0, BLOCK_SIZE), n_pairs, local_start, num_local)


@triton.jit
def _histogram_chunk(
    hist,  # (LOCAL_POW2,) int32 running histogram
    bins,  # (LOCAL_POW2,) local expert indices
    expert,  # (B,) int32
    valid,  # (B,) bool
    local_start,
):
    onehot = ((expert - local_start)[:, None] == bins[None, :]) & valid[:, None]
    return hist + tl.sum(onehot.to(tl.int32), axis=0)


@triton.jit
def _count_privatized_kernel(
    routing_map_ptr,  # (T, K) int32
    valid_tokens_ptr,  # (1,) int32 V
    counts_ptr,  # (L,) int32
    local_start,
    num_local,
    cap_pairs,  # T * K: bounds the speculative first load
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    LOCAL_POW2: tl.constexpr,  # next_pow2(L): the register histogram's width
    PREFETCH: tl.constexpr,  # issue the first chunk's load alongside the valid-count load
):
    """Grid: (P,), as the strided kernel. Each program keeps a private histogram of the local
    experts in registers across its chunks (a one-hot compare-and-sum per chunk) and flushes it
    once: at most L atomics per program instead of one per routed pair."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    bins = tl.arange(0, LOCAL_POW2)
    hist = tl.zeros([LOCAL_POW2], dtype=tl.int32)
    first = pid * BLOCK_SIZE
    if PREFETCH:
        offs = first + tl.arange(0, BLOCK_SIZE)
        expert = tl.load(routing_map_ptr + offs, mask=offs < cap_pairs, other=-1)
        n_pairs = tl.load(valid_tokens_ptr) * TOPK
        hist = _histogram_chunk(hist, bins, expert, offs < n_pairs, local_start)
        first += nprog * BLOCK_SIZE
    else:
        n_pairs = tl.load(valid_tokens_ptr) * TOPK
    for start in range(first, n_pairs, nprog * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_range = offs < n_pairs
        expert = tl.load(routing_map_ptr + offs, mask=in_range, other=-1)
        hist = _histogram_chunk(hist, bins, expert, in_range, local_start)
    tl.atomic_add(counts_ptr + bins, hist, mask=(bins < num_local) & (hist > 0))


# ----------------------------------------------------------------------------------- launchers
# Each returns a zero-argument launch closure over tensors allocated by the caller.


def count_persistent(inp: Inputs, params: dict, grid: int, block_size: int, num_warps: int, kernel=None):
    """The persistent count: moebench's kernel, or `kernel` (Megatron's, same signature by name)."""
    return _seed_launch(inp, params, grid, block_size, num_warps, kernel, persistent=True)


def count_nonpersistent(inp: Inputs, params: dict, block_size: int, num_warps: int, kernel=None):
    grid = cdiv(params["buffer_tokens"] * params["topk"], block_size)
    return _seed_launch(inp, params, grid, block_size, num_warps, kernel, persistent=False), grid


# The seed kernels' argument names and Megatron's, in their kernels' order; the persistent kernels
# take the last one too. Megatron's are passed by name, so a reordering upstream still launches
# correctly, and a renaming makes the variant unavailable with the reason.
_SEED_ARGS = ("routing_map_ptr", "counts_ptr", "valid_tokens_ptr", "topk", "local_start", "NUM_LOCAL", "num_programs")
_UPSTREAM_ARGS = ("routing_map_ptr", "tokens_per_expert_ptr", "valid_tokens_ptr", "topk", "local_expert_start",
                  "num_local_experts", "num_sms")


def _seed_launch(inp: Inputs, params: dict, grid: int, block_size: int, num_warps: int, kernel, *, persistent: bool):
    """A seed-signature kernel launched by argument name: moebench's where `kernel` is None, else Megatron's."""
    names = _SEED_ARGS if persistent else _SEED_ARGS[:-1]
    if kernel is None:
        kernel = _count_persistent_kernel if persistent else _count_nonpersistent_kernel
    else:
        names = _UPSTREAM_ARGS[:len(names)]
        upstream.require_args(kernel, names + ("BLOCK_SIZE",), "count")
    # the grid is the persistent kernels' program count; zip leaves it out for the others
    values = (inp.routing_map, inp.counts, inp.valid, params["topk"], params["local_expert_start"],
              params["local_experts"], grid)
    kw = dict(zip(names, values))

    def launch():
        kernel[(grid,)](**kw, BLOCK_SIZE=block_size, num_warps=num_warps)

    return launch


def _strided_launch(kernel, inp: Inputs, params: dict, *cap_pairs: int, **consts):
    """A strided-signature kernel (map, valid, counts, S, L[, T * K]; K a constexpr) at the case's
    grid, block size and warps."""
    args = (inp.routing_map, inp.valid, inp.counts, params["local_expert_start"], params["local_experts"], *cap_pairs)
    grid, block, nw = params["grid"], params["block_size"], params["num_warps"]

    def launch():
        kernel[(grid,)](*args, TOPK=params["topk"], BLOCK_SIZE=block, **consts, num_warps=nw)

    return launch


# ----------------------------------------------------------------------------------- reference


def reference(inp: Inputs, params: dict) -> torch.Tensor:
    """torch.bincount over the valid prefix, sliced to the local experts."""
    ids = inp.routing_map[: params["tokens"]].reshape(-1).long().cpu()
    full = torch.bincount(ids, minlength=params["num_experts"])
    s = params["local_expert_start"]
    return full[s:s + params["local_experts"]].to(torch.int32)


def check(inp: Inputs, out: torch.Tensor, expected: torch.Tensor, params: dict) -> Check:
    guards = torch.cat([inp.counts_buf[:_GUARD], inp.counts_buf[-_GUARD:]]).cpu()
    if not bool((guards == _POISON).all()):
        return Check(False, "wrote outside the local-expert counters")
    got = out.cpu()
    if torch.equal(got, expected):
        return Check(True, "exact")
    bad = int((got != expected).sum())
    return Check(False, f"{bad}/{expected.numel()} counts differ from torch.bincount")


def nonvacuity(inp: Inputs, out: torch.Tensor, params: dict) -> dict:
    c = out.cpu()
    return {"counts_sum": int(c.sum()), "experts_populated": int((c > 0).sum()),
            "local_experts": params["local_experts"]}


def programs_with_work(pairs: int, block: int, grid: int, chunking: str) -> int:
    """How many of the grid's programs count at least one chunk."""
    chunks = cdiv(pairs, block)
    if chunking == "contiguous":  # runs of ceil(C / P) chunks: the last runs may be empty
        return cdiv(chunks, cdiv(chunks, grid)) if chunks else 0
    return min(grid, chunks)


def work(params: dict, geometry: dict, device) -> dict:
    """Byte and occupancy model: the valid prefix of the map is read once; each counter is
    read-modified-written (in L2, by atomics)."""
    pairs = params["tokens"] * params["topk"]
    block = geometry["block_size"]
    ctas = geometry["grid"]
    return {
        "bytes": pairs * 4 + 4 + params["local_experts"] * 8,
        "ctas": ctas,
        "ctas_with_work": programs_with_work(pairs, block, ctas, geometry.get("chunking", "strided")),
        "threads_per_cta": geometry["num_warps"] * 32,
        "pairs_per_thread": cdiv(block, geometry["num_warps"] * 32),
    }


# ----------------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    routing_map: torch.Tensor  # (T, K) int32
    valid: torch.Tensor  # (1,) int32
    counts_buf: torch.Tensor  # (L + 2 * _GUARD,) int32; counts are the middle
    counts: torch.Tensor  # (L,) int32 view
    tokens: int


def routing_map(params: dict, seed: int) -> torch.Tensor:
    """(T, K) int32: K distinct experts per token, uniform or Zipf-skewed. Rows past the valid
    count are drawn too, so a kernel that ignores the valid bound counts them and fails."""
    T, K, E = params["buffer_tokens"], params["topk"], params["num_experts"]
    g = torch.Generator().manual_seed(seed)
    if params["routing"] == "uniform":
        scores = torch.rand(T, E, generator=g)
        return scores.topk(K, dim=1).indices.to(torch.int32)
    # Zipf: expert popularity ~ 1 / rank^s over a random permutation of experts; K distinct draws.
    rank = torch.randperm(E, generator=g).to(torch.float64) + 1.0
    w = rank.pow(-params["zipf_s"])
    # Gumbel-top-k draws K distinct experts per token with probabilities proportional to w.
    gumbel = -torch.log(-torch.log(torch.rand(T, E, generator=g, dtype=torch.float64).clamp_min(1e-300)))
    return (w.log() + gumbel).topk(K, dim=1).indices.to(torch.int32)


def build_inputs(params: dict, device: str, set_index: int = 0) -> Inputs:
    seed = params["seed"] * 1_000_003 + set_index
    rmap = routing_map(params, seed).to(device)
    valid = torch.tensor([params["tokens"]], dtype=torch.int32, device=device)
    buf = torch.full((params["local_experts"] + 2 * _GUARD,), _POISON, dtype=torch.int32, device=device)
    return Inputs(rmap, valid, buf, buf[_GUARD:_GUARD + params["local_experts"]], params["tokens"])


def input_bytes(params: dict) -> int:
    return params["buffer_tokens"] * params["topk"] * 4 + 4 + params["local_experts"] * 4


def touched_bytes(params: dict) -> int:
    """What one launch reads and writes: the valid prefix of the map, the scalar, the counters."""
    return params["tokens"] * params["topk"] * 4 + 4 + params["local_experts"] * 4


# ----------------------------------------------------------------------------------- variants
# Every launch parameter arrives resolved (the session reads the spec, the kill switches and the
# device once): `grid` is already the SM count where the spec said 0.


def _built(inp: Inputs, params: dict, launch, chunking: str, grid: int | None = None, **more) -> Built:
    """A count Built: reset zeroes the counters; the geometry's grid is the case's unless the
    launch derives its own."""
    def reset():
        inp.counts.zero_()

    geometry = {"grid": params["grid"] if grid is None else grid, "block_size": params["block_size"],
                "num_warps": params["num_warps"], **more, "chunking": chunking}
    return Built(launch, inp.counts, reset, geometry)


@FAMILY.builds("persistent", "shipped")
def build_persistent(inp: Inputs, params: dict, device) -> Built:
    launch = count_persistent(inp, params, params["grid"], params["block_size"], params["num_warps"])
    return _built(inp, params, launch, "contiguous")


@FAMILY.builds("nonpersistent")
def build_nonpersistent(inp: Inputs, params: dict, device) -> Built:
    launch, grid = count_nonpersistent(inp, params, params["block_size"], params["num_warps"])
    return _built(inp, params, launch, "one chunk", grid)


@FAMILY.builds("strided")
def build_strided(inp: Inputs, params: dict, device) -> Built:
    return _built(inp, params, _strided_launch(_count_strided_kernel, inp, params), "strided")


@FAMILY.builds("prefetch")
def build_prefetch(inp: Inputs, params: dict, device) -> Built:
    launch = _strided_launch(_count_prefetch_kernel, inp, params, params["buffer_tokens"] * params["topk"])
    return _built(inp, params, launch, "strided")


@FAMILY.builds("privatized")
def build_privatized(inp: Inputs, params: dict, device) -> Built:
    pre = bool(params.get("prefetch") or 0)
    launch = _strided_launch(_count_privatized_kernel, inp, params, params["buffer_tokens"] * params["topk"],
                             LOCAL_POW2=next_pow2(params["local_experts"]), PREFETCH=pre)
    return _built(inp, params, launch, "strided", prefetch=int(pre))


@FAMILY.builds("upstream")
def build_upstream(inp: Inputs, params: dict, device) -> Built:
    launch = count_persistent(inp, params, params["grid"], params["block_size"], params["num_warps"],
                              kernel=upstream.load("count_persistent"))
    return _built(inp, params, launch, "contiguous")


@FAMILY.builds("upstream-nonpersistent")
def build_upstream_nonpersistent(inp: Inputs, params: dict, device) -> Built:
    launch, grid = count_nonpersistent(inp, params, params["block_size"], params["num_warps"],
                                       kernel=upstream.load("count"))
    return _built(inp, params, launch, "one chunk", grid)

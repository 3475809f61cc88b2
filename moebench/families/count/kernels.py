"""Token counting for MoE dispatch (seed 000): how many routed (token, k) pairs land on each
local expert, counted with integer atomic adds.

Shapes: T = buffer_tokens (capture-time capacity), V = tokens (valid this step, a device
scalar), K = topk, E = num_experts, L = local_experts, S = local_expert_start.

Because the counts are an integer reduction by atomic_add, the launch geometry decides only
which thread issues which increment, never the multiset of increments: every geometry is
bit-exact with every other, and with torch.bincount.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.families import Built, Check, cdiv, next_pow2
from moebench.families.count import FAMILY

# Cells on each side of the counters, poisoned; a stray atomic outside [S, S + L) would hit them.
_GUARD = 16
_POISON = -0x5EED


@triton.jit
def _count_local_tokens_persistent_kernel(
    routing_map_ptr,  # (T, K) int32 expert ids, row-major; rows >= V are stale
    valid_tokens_ptr,  # (1,) int32 V, read on device (graph-safe)
    counts_ptr,  # (L,) int32, accumulated into
    local_start,  # S
    num_local,  # L
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (programs,), programs fixed at capture (SM count). Program p handles the chunks
    p, p + programs, ... of BLOCK_SIZE flattened (token, k) pairs below V * K."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    for start in range(pid * BLOCK_SIZE, n_pairs, nprog * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_range = offs < n_pairs
        expert = tl.load(routing_map_ptr + offs, mask=in_range, other=-1)
        local = expert - local_start
        hit = in_range & (local >= 0) & (local < num_local)
        tl.atomic_add(counts_ptr + local, 1, mask=hit)


@triton.jit
def _count_local_tokens_kernel(
    routing_map_ptr,  # (T, K) int32
    valid_tokens_ptr,  # (1,) int32
    counts_ptr,  # (L,) int32
    local_start,
    num_local,
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (ceil(T * K / BLOCK_SIZE),), from the capacity. Program p handles chunk p only."""
    pid = tl.program_id(0)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    in_range = offs < n_pairs
    expert = tl.load(routing_map_ptr + offs, mask=in_range, other=-1)
    local = expert - local_start
    hit = in_range & (local >= 0) & (local < num_local)
    tl.atomic_add(counts_ptr + local, 1, mask=hit)


@triton.jit
def _count_local_tokens_prefetch_kernel(
    routing_map_ptr,  # (T, K) int32
    valid_tokens_ptr,  # (1,) int32
    counts_ptr,  # (L,) int32
    local_start,
    num_local,
    cap_pairs,  # T * K: bounds the speculative first load
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (programs,), as the persistent kernel. The first chunk's load is issued against the
    capacity, independently of the valid-count load, so the two memory latencies overlap instead
    of adding up; the valid bound is applied after both arrive."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    expert = tl.load(routing_map_ptr + offs, mask=offs < cap_pairs, other=-1)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    local = expert - local_start
    hit = (offs < n_pairs) & (local >= 0) & (local < num_local)
    tl.atomic_add(counts_ptr + local, 1, mask=hit)
    for start in range((pid + nprog) * BLOCK_SIZE, n_pairs, nprog * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_range = offs < n_pairs
        expert = tl.load(routing_map_ptr + offs, mask=in_range, other=-1)
        local = expert - local_start
        hit = in_range & (local >= 0) & (local < num_local)
        tl.atomic_add(counts_ptr + local, 1, mask=hit)


@triton.jit
def _count_local_tokens_privatized_kernel(
    routing_map_ptr,  # (T, K) int32
    valid_tokens_ptr,  # (1,) int32
    counts_ptr,  # (L,) int32
    local_start,
    num_local,
    cap_pairs,  # T * K: bounds the speculative first load
    TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    LOCAL_POW2: tl.constexpr,  # next_pow2(L): the register histogram's width
    PREFETCH: tl.constexpr,  # issue the first chunk's load alongside the valid-count load
):
    """Grid: (programs,), as the persistent kernel. Each program keeps a private histogram of the
    local experts in registers across its chunks (a one-hot compare-and-sum per chunk) and
    flushes it once: at most L atomics per program instead of one per routed pair."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    bins = tl.arange(0, LOCAL_POW2)
    hist = tl.zeros([LOCAL_POW2], dtype=tl.int32)
    first = pid * BLOCK_SIZE
    if PREFETCH:
        offs = first + tl.arange(0, BLOCK_SIZE)
        expert = tl.load(routing_map_ptr + offs, mask=offs < cap_pairs, other=-1)
        n_pairs = tl.load(valid_tokens_ptr) * TOPK
        local = expert - local_start
        onehot = (local[:, None] == bins[None, :]) & (offs < n_pairs)[:, None]
        hist += tl.sum(onehot.to(tl.int32), axis=0)
        first += nprog * BLOCK_SIZE
    else:
        n_pairs = tl.load(valid_tokens_ptr) * TOPK
    for start in range(first, n_pairs, nprog * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_range = offs < n_pairs
        expert = tl.load(routing_map_ptr + offs, mask=in_range, other=-1)
        local = expert - local_start
        onehot = (local[:, None] == bins[None, :]) & in_range[:, None]
        hist += tl.sum(onehot.to(tl.int32), axis=0)
    tl.atomic_add(counts_ptr + bins, hist, mask=(bins < num_local) & (hist > 0))


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


# ----------------------------------------------------------------------------------- launchers


def count_local_tokens_persistent(inp: Inputs, params: dict, grid: int, block_size: int, num_warps: int):
    args = (inp.routing_map, inp.valid, inp.counts, params["local_expert_start"], params["local_experts"])

    def launch():
        _count_local_tokens_persistent_kernel[(grid,)](*args, TOPK=params["topk"], BLOCK_SIZE=block_size,
                                                       num_warps=num_warps)

    return launch


def count_local_tokens(inp: Inputs, params: dict, block_size: int, num_warps: int):
    grid = cdiv(params["buffer_tokens"] * params["topk"], block_size)
    args = (inp.routing_map, inp.valid, inp.counts, params["local_expert_start"], params["local_experts"])

    def launch():
        _count_local_tokens_kernel[(grid,)](*args, TOPK=params["topk"], BLOCK_SIZE=block_size,
                                            num_warps=num_warps)

    return launch, grid


def count_local_tokens_prefetch(inp: Inputs, params: dict, grid: int, block_size: int, num_warps: int):
    args = (inp.routing_map, inp.valid, inp.counts, params["local_expert_start"], params["local_experts"],
            params["buffer_tokens"] * params["topk"])

    def launch():
        _count_local_tokens_prefetch_kernel[(grid,)](*args, TOPK=params["topk"], BLOCK_SIZE=block_size,
                                                     num_warps=num_warps)

    return launch


def count_local_tokens_privatized(inp: Inputs, params: dict, grid: int, block_size: int, num_warps: int,
                                  prefetch: bool = False):
    args = (inp.routing_map, inp.valid, inp.counts, params["local_expert_start"], params["local_experts"],
            params["buffer_tokens"] * params["topk"])
    local_pow2 = next_pow2(params["local_experts"])

    def launch():
        _count_local_tokens_privatized_kernel[(grid,)](*args, TOPK=params["topk"], BLOCK_SIZE=block_size,
                                                       LOCAL_POW2=local_pow2, PREFETCH=prefetch,
                                                       num_warps=num_warps)

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


def work(params: dict, geometry: dict, device) -> dict:
    """Byte and occupancy model: the valid prefix of the map is read once; each counter is
    read-modified-written (in L2, by atomics)."""
    pairs = params["tokens"] * params["topk"]
    block = geometry["block_size"]
    ctas = geometry["grid"]
    return {
        "bytes": pairs * 4 + 4 + params["local_experts"] * 8,
        "ctas": ctas,
        "ctas_with_work": min(ctas, cdiv(pairs, block)),
        "threads_per_cta": geometry["num_warps"] * 32,
        "pairs_per_thread": cdiv(block, geometry["num_warps"] * 32),
    }


# ----------------------------------------------------------------------------------- variants
# Every launch parameter arrives resolved (the session reads the spec, the kill switches and the
# device once): `grid` is already the SM count where the spec said 0.


def _built(inp: Inputs, launch, geometry: dict, kernel: str, params: dict) -> Built:
    def reset():
        inp.counts.zero_()

    key = (kernel, params["topk"], geometry["block_size"], geometry["num_warps"])
    return Built(launch, inp.counts, reset, geometry, key)


@FAMILY.variant("persistent", params=("block_size", "num_warps", "grid"),
                doc="grid = SM count; each program strides over BLOCK_SIZE chunks")
@FAMILY.variant("shipped", params=("num_warps", "grid"),
                env={"block_size": ("MCORE_COUNT_TOKENS_BLOCK", 128)},
                doc="persistent with BLOCK_SIZE from $MCORE_COUNT_TOKENS_BLOCK (the PR's default 128; "
                    "1024 is the kill switch)")
def build_persistent(inp: Inputs, params: dict, device) -> Built:
    grid, block, nw = params["grid"], params["block_size"], params["num_warps"]
    launch = count_local_tokens_persistent(inp, params, grid, block, nw)
    return _built(inp, launch, {"grid": grid, "block_size": block, "num_warps": nw}, "persistent", params)


@FAMILY.variant("nonpersistent", params=("block_size", "num_warps"),
                doc="grid = ceil(buffer_tokens*topk / BLOCK_SIZE), one chunk each")
def build_nonpersistent(inp: Inputs, params: dict, device) -> Built:
    nw = params["num_warps"]
    launch, grid = count_local_tokens(inp, params, params["block_size"], nw)
    return _built(inp, launch, {"grid": grid, "block_size": params["block_size"], "num_warps": nw},
                  "nonpersistent", params)


@FAMILY.variant("prefetch", params=("block_size", "num_warps", "grid"),
                doc="persistent; the first chunk is loaded alongside the valid count, so the two latencies "
                    "overlap")
def build_prefetch(inp: Inputs, params: dict, device) -> Built:
    grid, nw, block = params["grid"], params["num_warps"], params["block_size"]
    launch = count_local_tokens_prefetch(inp, params, grid, block, nw)
    return _built(inp, launch, {"grid": grid, "block_size": block, "num_warps": nw}, "prefetch", params)


@FAMILY.variant("privatized", params=("block_size", "num_warps", "grid", "prefetch"),
                doc="persistent; a per-program register histogram flushed once (<= L atomics per program)")
def build_privatized(inp: Inputs, params: dict, device) -> Built:
    grid, nw, block = params["grid"], params["num_warps"], params["block_size"]
    pre = bool(params.get("prefetch") or 0)
    launch = count_local_tokens_privatized(inp, params, grid, block, nw, pre)
    return _built(inp, launch, {"grid": grid, "block_size": block, "num_warps": nw, "prefetch": int(pre)},
                  f"privatized{next_pow2(params['local_experts'])}{'-prefetch' if pre else ''}", params)

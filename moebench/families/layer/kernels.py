"""One MoE layer step (or L of them) in one launch, with the count and activation kernels under test
inside it: what a kernel saving is worth once the kernel has neighbours.

Shapes: T = buffer_tokens (capture-time capacity), V = tokens (live this step, an int32 device
scalar), H = hidden, E = num_experts, K = topk, L = local_experts from S = local_expert_start,
N = ffn (the activation's output width), W = FC1 output width (2N for the gated ops, N for
squared_relu), A = align, M = T * min(K, L) + A * L (rows of the permuted buffer, fixed at
capture), U = n_used = rows in use this step (each local expert's pair count rounded up to A,
summed; an int32 device scalar), Ly = layers.

One layer, every stage on the graph's stream, every grid fixed at capture, every bound read on
the device:

    route     torch: logits = x @ Wr^T (bf16), softmax in fp32, top-K, renormalize -> (T, K) map + probs
    count     the `count` family's variant: pairs per local expert       (its reset first: counts zeroed)
    offsets   _expert_offsets_kernel: counts rounded up to A, prefix sum -> starts, ends; U = ends[L-1]
    place     _place_pairs_kernel: each live local pair's row, its rank among its expert's pairs
    permute   _gather_rows_kernel: permuted rows of x; alignment-padding rows written as zeros
    FC1       torch grouped_mm over the expert blocks (offs = ends)             -> (M, W) bf16
    act       the `act` family's variant over U live rows (perm -1 marks padding for the padded ops)
    FC2       torch grouped_mm                                                  -> (M, H) bf16
    combine   _combine_kernel: out[t] = sum_k probs[t, k] * y[row(t, k)] in fp32 -> (T, H) fp32

Layers: each of the Ly layers has its own router and expert weights and reads the same hidden
states x, so each routes differently and streams its own expert weights; its output goes to its
own slice of `out`. (A real step puts attention between MoE layers; this does not model it.)

Against the torch reference (float64 GEMMs, rounded to bf16 wherever the pipeline rounds: FC1
output, activation, FC2 output), each live output element out[t, h] must lie within

    2^-7 * sum_k probs[t, k] * |y_k[h]|   +   2^-4 * sum_k probs[t, k] * rms(y_k)

where y_k is the FC2 output row of the token's k-th local pair.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from moebench.core.family import Built, Check, cdiv, get_family, next_pow2
from moebench.errors import Unavailable
from moebench.families.act import PADDED_OPS
from moebench.families.act.kernels import _POISON_BITS as _ACT_POISON_BITS, _poisoned, activation_ref, check_rows
from moebench.families.count import kernels as counting
from moebench.families.count.kernels import _GUARD, _POISON as _COUNT_POISON
from moebench.families.layer import FAMILY, capacity_rows, expert_weight_bytes, widths
from moebench.sources import upstream

# Live pairs one program of the place kernel reads per step of its walk: the whole decode map
# (256 tokens x 8) in two steps, a 1024-wide prefix sum per step.
_PAIR_BLOCK = 1024
# Permuted rows per CTA of the permute copy at capacity (a row is H bf16 = 4 KB at H = 2048), and
# at most this many CTAs: 640 CTAs for the decode buffer (M = 2560), enough to cover 132 SMs.
_COPY_ROWS_PER_CTA = 4
_MAX_COPY_CTAS = 1024
# Tokens per CTA of the combine at capacity, and its cap: 128 CTAs at T = 256.
_COMBINE_TOKENS_PER_CTA = 2
_MAX_COMBINE_CTAS = 1024
# Columns per inner step of the row kernels: 1024 bf16 = 2 KB, 8 per thread at 4 warps.
_MAX_BLOCK_H = 1024
# fp32 poison of the layer output, as bits: 0x7EED7EED is ~1.58e38, finite, so two untouched
# rows compare equal (NaN would not) and no correct output comes near it.
_OUT_POISON_BITS = 0x7EED7EED
# The step's tolerance against the torch reference (see the module docstring): one bf16 ulp of
# each contribution, plus this fraction of the token's output scale.
_ULP_REL = 2.0 ** -7
_CARRIED = 2.0 ** -4


@triton.jit
def _expert_offsets_kernel(
    counts_ptr,  # (L,) int32 pairs per local expert (the count kernel's output)
    starts_ptr,  # (L,) int32 out: first row of each expert's block
    ends_ptr,  # (L,) int32 out: one past each block's aligned end; ends[L-1] = U; grouped_mm's offs
    num_local,  # L
    ALIGN: tl.constexpr,  # A
    LOCAL_POW2: tl.constexpr,  # next_pow2(L)
):
    """Grid: (1,). Each count rounded up to a multiple of ALIGN (an empty expert stays empty),
    then an inclusive prefix sum."""
    e = tl.arange(0, LOCAL_POW2)
    m = e < num_local
    c = tl.load(counts_ptr + e, mask=m, other=0)
    padded = (c + ALIGN - 1) // ALIGN * ALIGN
    ends = tl.cumsum(padded, 0)
    tl.store(starts_ptr + e, ends - padded, mask=m)
    tl.store(ends_ptr + e, ends, mask=m)


@triton.jit
def _place_pairs_kernel(
    routing_map_ptr,  # (T, K) int32 expert ids, row-major; rows >= V are stale
    valid_tokens_ptr,  # (1,) int32 V
    counts_ptr,  # (L,) int32
    starts_ptr,  # (L,) int32
    ends_ptr,  # (L,) int32
    dest_ptr,  # (T * K,) int32 out: each live pair's row; -1 for a pair routed off this rank
    perm_ptr,  # (M,) int32 out: each row's source token below U; -1 for an alignment-padding row
    local_start,  # S
    num_local,  # L
    cap_rows,  # M: no row at or past it is written, whatever the counts say
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGN_POW2: tl.constexpr,  # next_pow2(A): a block has fewer than A padding rows
):
    """Grid: (L,). Program e walks the live pairs in order, BLOCK at a time, and gives its expert's
    pairs consecutive rows from starts[e]: a pair's row is its rank among its expert's pairs (a
    prefix sum), so the permutation is the same on every run. Program 0 also marks the live
    pairs routed off this rank. The block's padding rows, from starts[e] + counts[e] to ends[e],
    are marked -1."""
    e = tl.program_id(0)
    n_pairs = tl.load(valid_tokens_ptr) * TOPK
    first = tl.load(starts_ptr + e)
    row = first
    for start in range(0, n_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < n_pairs
        local = tl.load(routing_map_ptr + offs, mask=live, other=-1) - local_start
        hit = (live & (local == e)).to(tl.int32)
        dest = row + tl.cumsum(hit, 0) - hit
        mine = (hit != 0) & (dest < cap_rows)
        tl.store(dest_ptr + offs, dest, mask=mine)
        tl.store(perm_ptr + dest, offs // TOPK, mask=mine)
        if e == 0:
            tl.store(dest_ptr + offs, -1, mask=live & ((local < 0) | (local >= num_local)))
        row += tl.sum(hit, 0)
    pad = first + tl.load(counts_ptr + e) + tl.arange(0, ALIGN_POW2)
    tl.store(perm_ptr + pad, -1, mask=(pad < tl.load(ends_ptr + e)) & (pad < cap_rows))


@triton.jit
def _gather_rows_kernel(
    x_ptr,  # (T, H) bf16 hidden states
    perm_ptr,  # (M,) int32 source token of each row; -1 = padding
    n_used_ptr,  # (1,) int32 U, read on device
    xp_ptr,  # (M, H) bf16 out: permuted hidden states; rows >= U are left untouched
    hidden,  # H
    NUM_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid: (NUM_BLOCKS,), fixed at capture from M. CTA p copies rows p, p + NUM_BLOCKS, ...
    below U; a padding row is written as zeros, so the GEMMs never read stale memory."""
    pid = tl.program_id(0)
    n_used = tl.load(n_used_ptr)
    # row pointers advance by a stride: 64-bit addresses without 64-bit row math
    dst = xp_ptr + pid.to(tl.int64) * hidden
    for row in range(pid, n_used, NUM_BLOCKS):
        tok = tl.load(perm_ptr + row)
        if tok >= 0:
            src = x_ptr + tok.to(tl.int64) * hidden
            for h in range(0, hidden, BLOCK_H):
                o = h + tl.arange(0, BLOCK_H)
                tl.store(dst + o, tl.load(src + o, mask=o < hidden), mask=o < hidden)
        else:
            for h in range(0, hidden, BLOCK_H):
                o = h + tl.arange(0, BLOCK_H)
                tl.store(dst + o, tl.zeros([BLOCK_H], dtype=dst.dtype.element_ty), mask=o < hidden)
        dst += NUM_BLOCKS * hidden


@triton.jit
def _combine_kernel(
    y_ptr,  # (M, H) bf16 FC2 output, permuted order
    probs_ptr,  # (T, K) fp32 routing weights
    dest_ptr,  # (T * K,) int32 each pair's row; -1 = routed off this rank
    valid_tokens_ptr,  # (1,) int32 V
    out_ptr,  # (T, H) fp32 out; rows >= V are left untouched
    hidden,  # H
    TOPK: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid: (NUM_BLOCKS,), fixed at capture from T. CTA p handles tokens p, p + NUM_BLOCKS, ...
    below V: out[t] = sum_k probs[t, k] * y[dest[t, k]] in fp32, k in order (no atomics: the
    same sum on every run). A token with no local pair gets zeros."""
    pid = tl.program_id(0)
    n_tok = tl.load(valid_tokens_ptr)
    out_row = out_ptr + pid.to(tl.int64) * hidden
    for tok in range(pid, n_tok, NUM_BLOCKS):
        for h in range(0, hidden, BLOCK_H):
            o = h + tl.arange(0, BLOCK_H)
            m = o < hidden
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for k in tl.static_range(TOPK):
                d = tl.load(dest_ptr + tok * TOPK + k)
                if d >= 0:
                    p = tl.load(probs_ptr + tok * TOPK + k)
                    acc += p * tl.load(y_ptr + d.to(tl.int64) * hidden + o, mask=m).to(tl.float32)
            tl.store(out_row + o, acc, mask=m)
        out_row += NUM_BLOCKS * hidden


# ----------------------------------------------------------------------------------- launchers: routing


def route(x: torch.Tensor, router: torch.Tensor, topk: int, routing_map: torch.Tensor, probs: torch.Tensor,
          top_values: torch.Tensor, top_indices: torch.Tensor) -> None:
    """Top-K routing as Qwen3 routes: softmax over all E logits in fp32, the K largest, renormalized
    to sum to 1. Writes routing_map (T, K) int32 and probs (T, K) fp32 in place (graph-safe). The
    torch reference calls this same function, so routing is not under test."""
    logits = x @ router.T
    torch.topk(torch.softmax(logits.float(), dim=-1), topk, dim=-1, out=(top_values, top_indices))
    routing_map.copy_(top_indices)
    torch.div(top_values, top_values.sum(dim=-1, keepdim=True), out=probs)


# ----------------------------------------------------------------------------------- grouped GEMM


def _grouped_mm_loop(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """a (M, K) bf16, b (G, K, N), offs (G,) int32 group ends -> (M, N); rows >= offs[-1] are left
    uninitialized, as grouped_mm leaves them. One bf16 matmul per group with the ends read on the
    host: for the CPU interpreter path only (a host read cannot be captured in a graph)."""
    out = torch.empty(a.shape[0], b.shape[-1], dtype=a.dtype, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ b[g]
        start = end
    return out


_CPU_GROUPED_MM: list = []


def _cpu_grouped_mm() -> Callable | None:
    """torch's grouped_mm where it has a CPU kernel (torch >= 2.9; 2.8 declares it but raises),
    found once by a probe on an aligned problem; else None."""
    if not _CPU_GROUPED_MM:
        fn = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
        try:
            a, b = torch.ones(16, 8, dtype=torch.bfloat16), torch.ones(2, 8, 8, dtype=torch.bfloat16)
            ok = fn is not None and torch.equal(fn(a, b, offs=torch.tensor([8, 16], dtype=torch.int32)), a @ b[0])
        except (RuntimeError, NotImplementedError):
            ok = False
        _CPU_GROUPED_MM.append(fn if ok else None)
    return _CPU_GROUPED_MM[0]


def grouped_mm_impl(device_type: str, *, loop: bool = False) -> tuple[Callable, str]:
    """The grouped GEMM a step runs, and its name for the record. On CUDA:
    torch.nn.functional.grouped_mm (torch >= 2.10), else the private torch._grouped_mm (2.8,
    2.9); without either the layer is unavailable. On the CPU: torch's grouped_mm where it has a
    CPU kernel (bit-exact with one bf16 matmul per group), else, or with `loop`, that per-group loop."""
    public = getattr(torch.nn.functional, "grouped_mm", None)
    if device_type == "cuda":
        # offs is keyword-only in torch.nn.functional.grouped_mm
        if public is not None:
            return (lambda a, b, offs: public(a, b, offs=offs)), "torch.nn.functional.grouped_mm"
        private = getattr(torch, "_grouped_mm", None)
        if private is not None:
            return (lambda a, b, offs: private(a, b, offs=offs)), "torch._grouped_mm"
        raise Unavailable(f"the layer step needs torch.nn.functional.grouped_mm (torch >= 2.10) or torch._grouped_mm "
                          f"(torch >= 2.8); this is torch {torch.__version__}")
    fn = None if loop else _cpu_grouped_mm()
    if fn is None:
        return _grouped_mm_loop, "per-group matmul loop (CPU)"
    return (lambda a, b, offs: fn(a, b, offs=offs)), "grouped_mm (CPU)"


# ----------------------------------------------------------------------------------- launchers: the step's own kernels


@dataclass
class _Geometry:
    """The step's own launches: fixed at capture from the capacity."""

    topk: int
    hidden: int
    local_start: int
    local: int
    align: int
    rows: int  # M
    copy_ctas: int
    combine_ctas: int
    block_h: int

    @classmethod
    def of(cls, params: dict) -> "_Geometry":
        T, M = params["buffer_tokens"], capacity_rows(params)
        return cls(params["topk"], params["hidden"], params["local_expert_start"], params["local_experts"],
                   params["align"], M, min(cdiv(M, _COPY_ROWS_PER_CTA), _MAX_COPY_CTAS),
                   min(cdiv(T, _COMBINE_TOKENS_PER_CTA), _MAX_COMBINE_CTAS),
                   min(next_pow2(params["hidden"]), _MAX_BLOCK_H))

def expert_offsets(inp: Inputs, g: _Geometry) -> None:
    _expert_offsets_kernel[(1,)](inp.counts, inp.starts, inp.ends, g.local, ALIGN=g.align,
                                 LOCAL_POW2=next_pow2(g.local))


def place_pairs(inp: Inputs, layer: int, g: _Geometry) -> None:
    _place_pairs_kernel[(g.local,)](inp.routing_map[layer], inp.valid, inp.counts, inp.starts, inp.ends, inp.dest,
                                    inp.perm, g.local_start, g.local, g.rows, TOPK=g.topk, BLOCK=_PAIR_BLOCK,
                                    ALIGN_POW2=next_pow2(g.align))


def gather_rows(inp: Inputs, g: _Geometry) -> None:
    _gather_rows_kernel[(g.copy_ctas,)](inp.x, inp.perm, inp.n_used, inp.permuted, g.hidden,
                                        NUM_BLOCKS=g.copy_ctas, BLOCK_H=g.block_h)


def combine(inp: Inputs, y: torch.Tensor, layer: int, g: _Geometry) -> None:
    _combine_kernel[(g.combine_ctas,)](y, inp.probs[layer], inp.dest, inp.valid, inp.out[layer], g.hidden,
                                       TOPK=g.topk, NUM_BLOCKS=g.combine_ctas, BLOCK_H=g.block_h)


# ----------------------------------------------------------------------------------- the variants under test


def _delegate(params: dict, name: str, shape: dict) -> tuple:
    """The count or act variant of this case as FAMILY.resolve resolved it (never resolved again
    here), with the shape this step gives it. Returns (family, params, sources)."""
    got = params.get(f"{name}_resolved")
    if got is None:
        raise ValueError(f"the layer step's {name} launch is not resolved: build a case from "
                         "FAMILY.resolve's parameters (they carry count_resolved and act_resolved)")
    q, sources = got
    return get_family(name), {**q, **shape}, sources


class _Step:
    """One case's layer step: the count launch of each layer and the activation, built through
    their families, and the closures that run a layer."""

    def __init__(self, inp: Inputs, params: dict, device):
        self.inp, self.params, self.device = inp, params, device
        self.g = _Geometry.of(params)
        W, N = widths(params)
        count, cq, self.count_from = _delegate(params, "count", {})  # resolved with the step's routing shape
        count_inputs = count.load().Inputs
        self.counters = [count.build(params["count_variant"], count_inputs(
            routing_map=inp.routing_map[l], valid=inp.valid, counts_buf=inp.counts_buf, counts=inp.counts,
            tokens=params["tokens"]), cq, device) for l in range(params["layers"])]
        act_shape = {"op": params["op"], "rows": inp.rows, "live_rows": inp.rows, "ffn": N, "in_cols": W,
                     "seed": params["seed"]}
        self.act, self.act_params, self.act_from = _delegate(params, "act", act_shape)
        self.act_inputs = self.act.load().Inputs
        # built once around the fixed FC1 buffer: its geometry, and an op the
        # variant does not implement fails here, before anything runs
        self.act_alone = self.activation(inp.fc1_out)
        self.gemm, self.gemm_name = grouped_mm_impl(inp.x.device.type)

    def activation(self, fc1_out: torch.Tensor) -> Built:
        """The act variant around an FC1 output. grouped_mm returns a new tensor each call (it has
        no out= form), so the launch is rebuilt around it each time. Act builders only make a
        closure: this costs host time per eager launch, and nothing in a captured graph."""
        inp = self.inp
        a = self.act_inputs(op=self.params["op"], x=fc1_out, live=inp.n_used, perm=inp.perm, out_buf=inp.act_out,
                            out=inp.act_out, work_rows=None, rows=inp.rows, live_rows=inp.rows,
                            n_cols=inp.act_out.shape[1], in_cols=fc1_out.shape[1])
        return self.act.build(self.params["act_variant"], a, self.act_params, self.device)

    def route(self, layer: int) -> None:
        inp = self.inp
        route(inp.x, inp.router[layer], self.params["topk"], inp.routing_map[layer], inp.probs[layer],
              inp.top_values, inp.top_indices)

    def up_to_fc1(self, layer: int) -> torch.Tensor:
        """route -> count -> offsets -> place -> permute -> FC1; returns the FC1 output."""
        inp, g = self.inp, self.g
        self.route(layer)
        self.counters[layer].reset()  # the count variant's own pre-launch state: its counters zeroed
        self.counters[layer].launch()
        expert_offsets(inp, g)
        place_pairs(inp, layer, g)
        gather_rows(inp, g)
        return self.gemm(inp.permuted, inp.fc1[layer].transpose(1, 2), inp.ends)

    def layer(self, layer: int) -> None:
        inp = self.inp
        self.activation(self.up_to_fc1(layer)).launch()
        y = self.gemm(inp.act_out, inp.fc2[layer].transpose(1, 2), inp.ends)
        combine(inp, y, layer, self.g)

    def geometry(self) -> tuple[dict, dict]:
        """(geometry, launch_from) of the whole step, for the record."""
        count = self.counters[0]
        geo = {"count_variant": self.params["count_variant"], "act_variant": self.params["act_variant"],
               **{f"count_{k}": v for k, v in count.geometry.items()},
               **{f"act_{k}": v for k, v in self.act_alone.geometry.items()},
               "rows": self.g.rows, "permute_ctas": self.g.copy_ctas, "combine_ctas": self.g.combine_ctas,
               "gemm": self.gemm_name}
        sources = {**{f"count_{k}": v for k, v in self.count_from.items()},
                   **{f"act_{k}": v for k, v in self.act_from.items()}}
        return geo, sources


# ----------------------------------------------------------------------------------- reference


def moe_ref(x: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor,
            params: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer on the live tokens, independently of the pipeline: per local expert, its pairs'
    rows through float64 GEMMs, rounded to bf16 where the pipeline rounds (FC1 out, activation,
    FC2 out), weighted and summed in float64. Returns (out (V, H) f64, the bound (V, H) f64 each
    element must lie within: see the module docstring)."""
    V, H = x.shape
    N, S = params["ffn"], params["local_expert_start"]
    out = torch.zeros(V, H, dtype=torch.float64, device=x.device)
    mag = torch.zeros(V, H, dtype=torch.float64, device=x.device)
    scale = torch.zeros(V, dtype=torch.float64, device=x.device)
    local = routing_map.long() - S
    for e in range(params["local_experts"]):
        t, k = (local == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        h = (x[t].double() @ fc1[e].double().T).to(torch.bfloat16)
        y = (activation_ref(h, params["op"], N).double() @ fc2[e].double().T).to(torch.bfloat16).double()
        p = probs[t, k].double()
        out.index_add_(0, t, p[:, None] * y)
        mag.index_add_(0, t, p[:, None] * y.abs())
        scale.index_add_(0, t, p * y.square().mean(dim=1).sqrt())
    return out, _ULP_REL * mag + _CARRIED * scale[:, None]


@dataclass
class Expected:
    scope: str
    routing_map: torch.Tensor  # (Ly, V, K) int32: torch's routing of each layer
    probs: torch.Tensor  # (Ly, V, K) fp32
    out: torch.Tensor | None = None  # step: (Ly, V, H) f64
    bound: torch.Tensor | None = None  # step: (Ly, V, H) f64, the allowed |out - expected|
    counts: torch.Tensor | None = None  # count: (L,) int32 on the CPU
    act: torch.Tensor | None = None  # act: (M, N) bf16 on the CPU, poison where no row is written
    act_rows: torch.Tensor | None = None  # act: (M,) bool on the CPU, rows the activation writes


def reference(inp: Inputs, params: dict) -> Expected:
    V, K, Ly = params["tokens"], params["topk"], params["layers"]
    maps, probs = torch.empty_like(inp.routing_map), torch.empty_like(inp.probs)
    tv, ti = torch.empty_like(inp.top_values), torch.empty_like(inp.top_indices)
    for l in range(Ly):
        route(inp.x, inp.router[l], K, maps[l], probs[l], tv, ti)
    exp = Expected(params["scope"], maps[:, :V], probs[:, :V])
    if params["scope"] == "step":
        outs = [moe_ref(inp.x[:V], maps[l, :V], probs[l, :V], inp.fc1[l], inp.fc2[l], params) for l in range(Ly)]
        exp.out = torch.stack([o for o, _ in outs])
        exp.bound = torch.stack([b for _, b in outs])
    elif params["scope"] == "count":
        exp.counts = counting.reference(counting.Inputs(maps[0], inp.valid, inp.counts_buf, inp.counts, V), params)
    else:
        # the activation alone runs on the FC1 output the step produced (inp.fc1_out, written when
        # the case was built), over the rows in use then; padded ops skip rows whose map entry is -1
        W, N = widths(params)
        n_used = int(inp.n_used.item())
        rows = torch.arange(inp.rows) < n_used
        if params["op"] in PADDED_OPS:
            rows &= inp.perm.cpu() >= 0
        act = _poisoned((inp.rows, N), "cpu")
        act[rows] = activation_ref(inp.fc1_out.cpu()[rows], params["op"], N)
        exp.act, exp.act_rows = act, rows
    return exp


# ----------------------------------------------------------------------------------- checks


def check(inp: Inputs, out: torch.Tensor, expected: Expected, params: dict) -> Check:
    V = params["tokens"]
    if expected.scope == "count":
        return counting.check(inp, out, expected.counts, params)
    if expected.scope == "act":
        return check_rows(out, expected.act, expected.act_rows, [])
    # the step: routing equal to torch's, rows past V untouched, live rows within the bound
    for l in range(params["layers"]):
        same = (inp.routing_map[l, :V] == expected.routing_map[l]).all(dim=1)
        if not bool(same.all()) or not torch.equal(inp.probs[l, :V], expected.probs[l]):
            return Check(False, f"layer {l}: routing differs from torch's on {int((~same).sum())}/{V} tokens "
                                "(the router is torch's; its GEMM is not reproducible here)")
    if not bool((out[:, V:].view(torch.int32) == _OUT_POISON_BITS).all()):
        return Check(False, "rows past the live tokens were written")
    got = out[:, :V].double()
    if bool(torch.isnan(got).any()):
        return Check(False, f"{int(torch.isnan(got).sum())} NaN elements in live rows")
    err = (got - expected.out).abs()
    bound = expected.bound
    over = err > bound
    if bool(over.any()):
        l, t, h = (int(i) for i in over.nonzero()[0])
        return Check(False, f"{int(over.sum())}/{err.numel()} elements beyond the bf16 bound (first: layer {l}, "
                            f"token {t}, column {h}: {float(got[l, t, h]):.6g}, reference "
                            f"{float(expected.out[l, t, h]):.6g} ± {float(bound[l, t, h]):.2g})")
    rel = err / torch.where(bound > 0, bound, torch.ones_like(bound))
    worst = float(rel.max()) if rel.numel() else 0.0
    exact = int((out[:, :V] == expected.out.float()).sum())
    return Check(True, f"within the bf16 bound (worst {worst:.2f} of it; {exact}/{err.numel()} elements equal the "
                       "fp64 reference rounded to fp32)")


def nonvacuity(inp: Inputs, out: torch.Tensor, params: dict) -> dict:
    V, scope = params["tokens"], params["scope"]
    if scope == "count":
        return counting.nonvacuity(inp, out, params)
    if scope == "act":
        written = (out.cpu().view(torch.int16) != _ACT_POISON_BITS).any(dim=1)
        return {"rows_written": int(written.sum()), "rows_in_use": int(inp.n_used.item())}
    live = out[:, :V]
    local = inp.routing_map[:, :V].long() - params["local_expert_start"]
    has_local = ((local >= 0) & (local < params["local_experts"])).any(dim=2)
    return {"tokens_with_local_experts": int(has_local.sum()), "nonzero_out": int((live != 0).sum()),
            "rows_in_use_last_layer": int(inp.n_used.item())}


def work(params: dict, geometry: dict, device) -> dict:
    """Byte model of a step: the expert weights a layer reads (experts with at least one pair:
    L (1 - (1 - K/E)^V) of them expected under uniform routing, all of them at decode), the
    router's, and the hidden states in and the fp32 output out. A kernel alone: none (its
    family's own sweep reads it against its floors)."""
    if params["scope"] != "step":
        return {"rows": geometry.get("rows")}
    V, K, E, L, H = (params[k] for k in ("tokens", "topk", "num_experts", "local_experts", "hidden"))
    populated = L * (1.0 - (1.0 - K / E) ** V)
    per_layer = expert_weight_bytes(params) * populated / L + E * H * 2 + V * H * (2 + 4)
    return {"bytes": int(params["layers"] * per_layer), "experts_populated_expected": round(populated, 2),
            "layers": params["layers"], "rows": geometry.get("rows")}


# ----------------------------------------------------------------------------------- inputs

# The fields of Inputs a step writes besides its output (the case pipeline restores them before each
# variant but does not call a write to them a damaged input): the routing, counts, offsets,
# permutation and GEMM buffers. x, valid, router, fc1 and fc2 are read only.
WORKSPACE = ("routing_map", "probs", "top_values", "top_indices", "counts_buf", "counts", "starts", "ends", "n_used",
             "dest", "perm", "permuted", "fc1_out", "act_out", "out")



@dataclass
class Inputs:
    x: torch.Tensor  # (T, H) bf16; rows >= V are drawn too, and must not matter
    valid: torch.Tensor  # (1,) int32 V
    router: torch.Tensor  # (Ly, E, H) bf16
    fc1: torch.Tensor  # (Ly, L, W, H) bf16: (out, in), megatron-core's stacked fc1_weight layout
    fc2: torch.Tensor  # (Ly, L, H, N) bf16
    routing_map: torch.Tensor  # (Ly, T, K) int32, each layer's top-K experts (written by the step)
    probs: torch.Tensor  # (Ly, T, K) fp32, their renormalized weights
    top_values: torch.Tensor  # (T, K) fp32 scratch
    top_indices: torch.Tensor  # (T, K) int64 scratch
    counts_buf: torch.Tensor  # (L + 2 * _GUARD,) int32; the counts are the middle
    counts: torch.Tensor  # (L,) int32 view
    starts: torch.Tensor  # (L,) int32
    ends: torch.Tensor  # (L,) int32
    n_used: torch.Tensor  # (1,) int32 view of ends[L - 1]
    dest: torch.Tensor  # (T * K,) int32
    perm: torch.Tensor  # (M,) int32
    permuted: torch.Tensor  # (M, H) bf16
    fc1_out: torch.Tensor  # (M, W) bf16: the input of the activation alone (scope act)
    act_out: torch.Tensor  # (M, N) bf16
    out: torch.Tensor  # (Ly, T, H) fp32
    rows: int  # M


def build_inputs(params: dict, device: str, set_index: int = 0) -> Inputs:
    """Seeded random hidden states and weights, drawn on the device (a 48-layer case holds ~14 GB
    of expert weights). Scales: x ~ N(0, 1); router and FC1 ~ N(0, 1/H), so logits and FC1
    outputs are ~N(0, 1), the activation's curved range; FC2 ~ N(0, 1/N)."""
    seed = params["seed"] * 1_000_003 + set_index
    g = torch.Generator(device=device).manual_seed(seed)
    T, H, E, K = params["buffer_tokens"], params["hidden"], params["num_experts"], params["topk"]
    L, Ly = params["local_experts"], params["layers"]
    W, N = widths(params)
    M = capacity_rows(params)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16).mul_(std)

    def empty(*shape, dtype):
        return torch.empty(*shape, dtype=dtype, device=device)

    x = randn(T, H)
    router = randn(Ly, E, H, std=H ** -0.5)
    fc1 = randn(Ly, L, W, H, std=H ** -0.5)
    fc2 = randn(Ly, L, H, N, std=N ** -0.5)
    counts_buf = torch.full((L + 2 * _GUARD,), _COUNT_POISON, dtype=torch.int32, device=device)
    ends = torch.zeros(L, dtype=torch.int32, device=device)
    out = empty(Ly, T, H, dtype=torch.float32)
    out.view(torch.int32).fill_(_OUT_POISON_BITS)
    return Inputs(
        x=x, valid=torch.tensor([params["tokens"]], dtype=torch.int32, device=device), router=router, fc1=fc1,
        fc2=fc2, routing_map=torch.zeros(Ly, T, K, dtype=torch.int32, device=device),
        probs=torch.zeros(Ly, T, K, dtype=torch.float32, device=device),
        top_values=empty(T, K, dtype=torch.float32), top_indices=empty(T, K, dtype=torch.int64),
        counts_buf=counts_buf, counts=counts_buf[_GUARD:_GUARD + L],
        starts=torch.zeros(L, dtype=torch.int32, device=device), ends=ends, n_used=ends[L - 1:],
        dest=torch.full((T * K,), -1, dtype=torch.int32, device=device),
        perm=torch.full((M,), -1, dtype=torch.int32, device=device),
        permuted=torch.zeros(M, H, dtype=torch.bfloat16, device=device),
        fc1_out=torch.zeros(M, W, dtype=torch.bfloat16, device=device),
        act_out=torch.zeros(M, N, dtype=torch.bfloat16, device=device), out=out, rows=M)


def input_bytes(params: dict) -> int:
    """Everything build_inputs allocates, plus the two GEMM outputs a step allocates."""
    T, H, E, K = params["buffer_tokens"], params["hidden"], params["num_experts"], params["topk"]
    L, Ly, M = params["local_experts"], params["layers"], capacity_rows(params)
    W, N = widths(params)
    return (T * H * 2 + Ly * (E * H * 2 + expert_weight_bytes(params) + T * K * 8 + T * H * 4)
            + T * K * 16 + (L + 2 * _GUARD) * 4 + L * 8 + M * 4 + M * (H + W + N) * 2 + M * (W + H) * 2)


# ----------------------------------------------------------------------------------- variants


def _poison_out(inp: Inputs) -> Callable[[], None]:
    def reset():
        inp.out.view(torch.int32).fill_(_OUT_POISON_BITS)

    return reset


@FAMILY.builds("step")
def build_step(inp: Inputs, params: dict, device) -> Built:
    step = _Step(inp, params, device)
    geometry, sources = step.geometry()
    scope = params["scope"]
    if scope == "step":
        def launch():
            for l in range(params["layers"]):
                step.layer(l)

        return Built(launch, inp.out, _poison_out(inp), geometry, launch_from=sources)
    if scope == "count":
        step.route(0)  # the layer's routing map: what the count kernel alone counts
        return Built(step.counters[0].launch, inp.counts, step.counters[0].reset, geometry, launch_from=sources)
    inp.fc1_out.copy_(step.up_to_fc1(0))  # the layer's FC1 output: what the activation alone reads
    return Built(step.act_alone.launch, inp.act_out, step.act_alone.reset, geometry, launch_from=sources)


@FAMILY.builds("mcore")
def build_mcore(inp: Inputs, params: dict, device) -> Built:
    fused = upstream.load("fused_moe")
    if params["op"] != "squared_relu" or params["scope"] != "step":
        raise ValueError("the mcore arm runs megatron-core's whole fused MoE, whose BF16 path implements squared_relu "
                         f"only: give it op: squared_relu and scope: step (got op {params['op']}, scope "
                         f"{params['scope']})")
    act_type = sys.modules[fused.__module__].ActivationType.SQUARED_RELU
    takes_out = "out" in inspect.signature(fused).parameters
    K, L, S = params["topk"], params["local_experts"], params["local_expert_start"]

    def launch():
        for l in range(params["layers"]):
            route(inp.x, inp.router[l], K, inp.routing_map[l], inp.probs[l], inp.top_values, inp.top_indices)
            kw: dict[str, Any] = dict(hidden_states=inp.x, probs=inp.probs[l], fc1_weight=inp.fc1[l],
                                      fc2_weight=inp.fc2[l], activation_type=act_type, num_local_experts=L,
                                      local_expert_start=S, valid_tokens=inp.valid, routing_map=inp.routing_map[l])
            if takes_out:
                fused(**kw, out=inp.out[l])
            else:  # an older megatron-core: one copy more per layer
                inp.out[l, :params["tokens"]].copy_(fused(**kw)[:params["tokens"]])

    geometry = {"source": upstream.status("fused_moe").source, "align": 16, "rows": capacity_rows(params),
                "writes_out_in_place": takes_out}
    return Built(launch, inp.out, _poison_out(inp), geometry,
                 inexact="megatron-core claims permuted rows and sums the top-k contributions with atomics, so its "
                         "row order and fp32 summation order vary from run to run")


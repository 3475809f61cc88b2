"""Row-parallel MoE activations (seed 001): SiLU-mul over a live-row bound, and the padded
SwiGLU / squared-ReLU kernels, each launched as NUM_BLOCKS CTAs that stride over rows.

Shapes: M = rows (capture-time capacity; the grid is derived from it), V = live_rows (valid
this step, an int32 device scalar read in-kernel), N = output width (ffn), W = input width
(2N gate | up for silu_mul_bounded and swiglu, N for squared_relu), NB = NUM_BLOCKS.
The padded ops also read P, an (M,) int32 permutation map in which -1 marks a padding row.

Every row is processed in BLOCK_N-column chunks: fp32 math, one bf16 rounding at the store.
Rows >= V (and padding rows) are never written. Every output element is a function of its own
row's inputs only, with no cross-CTA reduction, so the row-to-CTA mapping cannot change a single
bit: every NB is bit-exact with every other. Against the float32 torch reference the bound is 1
bf16 ulp: on the GPU the store rounds to nearest even like torch and only tl.sigmoid's fp32
rounding can differ; the Triton interpreter converts fp32 -> bf16 by truncation, so there about
half the elements sit 1 ulp below torch.

The kill switch: $MCORE_MOE_ACTIVATION_GRID_CAP=512 gives min(next_pow2(M), 512), which is the
legacy min(M, 512) for every M >= 512 and every power-of-two M, but not for a smaller M that
is not a power of two (M = 100: 128 CTAs, legacy 100). The output is identical either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.core.family import Built, Check, cdiv, next_pow2
from moebench.families.act import FAMILY, GATED_OPS, PADDED_OPS, widths
from moebench.sources import upstream

# Columns per inner-loop chunk: the whole row when it fits (N = 768 -> 1024, one masked chunk),
# else 1024-column chunks, which keep a 4-warp CTA at 8 bf16 (16 B) per thread per load.
_MAX_BLOCK_N = 1024
# The pre-PR geometry: NUM_BLOCKS = min(M, 512).
_LEGACY_BLOCKS = 512
# Output poison, as bf16 bits: 0x7EED is ~1.6e38, finite (so torch.equal of two untouched rows
# holds, where NaN != NaN would not) and far beyond anything the ops make of N(0, 2^2) inputs.
_POISON_BITS = 0x7EED
# Poisoned rows on each side of the output; a write with a wrong row stride lands in them.
_GUARD_ROWS = 2
# Inputs are N(0, _INPUT_STD^2) in bf16: covers sigmoid's curved range and both signs of ReLU.
_INPUT_STD = 2.0
# Allowed distance from the float32 torch reference, in bf16 ulps (see the module docstring).
_ULP_BOUND = 1


@triton.jit
def _act_row(
    x_row,  # (W,) bf16 pointer: gate in [0, N), up in [N, 2N) when GATED
    out_row,  # (N,) bf16 pointer
    n_cols,  # N
    GATED: tl.constexpr,  # SiLU(gate) * up; else squared ReLU
    BLOCK_N: tl.constexpr,
):
    """One row in BLOCK_N-column chunks: fp32 math, one bf16 rounding at the store."""
    for start in tl.range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        if GATED:
            g = tl.load(x_row + offs, mask=mask).to(tl.float32)
            u = tl.load(x_row + n_cols + offs, mask=mask).to(tl.float32)
            y = g * tl.sigmoid(g) * u
        else:
            r = tl.maximum(tl.load(x_row + offs, mask=mask).to(tl.float32), 0.0)
            y = r * r
        tl.store(out_row + offs, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _act_rows_kernel(
    x_ptr,  # (M, W) bf16, token-major
    out_ptr,  # (M, N) bf16; rows >= V and padding rows are left untouched
    n_rows_ptr,  # (1,) int32 V, read on device (graph-safe)
    perm_ptr,  # (M,) int32 permutation map, -1 = padding row (read when PADDED)
    n_cols,  # N
    max_rows,  # M: the loop runs to the capacity
    GATED: tl.constexpr,
    PADDED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
):
    """Grid: (NUM_BLOCKS,), fixed at capture from M. A CTA with pid >= V returns at once; CTA p
    visits rows p, p + NUM_BLOCKS, ... below M and works on those below V (and not padding)."""
    pid = tl.program_id(0)
    n_rows = tl.load(n_rows_ptr)
    if pid >= n_rows:
        return
    in_stride = 2 * n_cols if GATED else n_cols
    for row in tl.range(pid, max_rows, NUM_BLOCKS):
        if row < n_rows:
            if PADDED:
                if tl.load(perm_ptr + row) >= 0:
                    _act_row(x_ptr + row * in_stride, out_ptr + row * n_cols, n_cols, GATED, BLOCK_N)
            else:
                _act_row(x_ptr + row * in_stride, out_ptr + row * n_cols, n_cols, GATED, BLOCK_N)


@triton.jit
def _act_rows_live_bound_kernel(
    x_ptr,  # (M, W) bf16
    out_ptr,  # (M, N) bf16; rows >= V and padding rows are left untouched
    n_rows_ptr,  # (1,) int32 V
    perm_ptr,  # (M,) int32 permutation map (read when PADDED)
    n_cols,  # N
    in_stride,  # W
    GATED: tl.constexpr,
    PADDED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
):
    """Grid: (NUM_BLOCKS,), fixed at capture from M. CTA p handles rows p, p + NUM_BLOCKS, ...
    below V only: the loop bound is the live count, not the capacity."""
    pid = tl.program_id(0)
    n_rows = tl.load(n_rows_ptr)
    # row pointers advance by a stride each iteration: 64-bit addresses without 64-bit row math
    x_row = x_ptr + pid.to(tl.int64) * in_stride
    out_row = out_ptr + pid.to(tl.int64) * n_cols
    for row in tl.range(pid, n_rows, NUM_BLOCKS):
        if PADDED:
            if tl.load(perm_ptr + row) >= 0:
                _act_row(x_row, out_row, n_cols, GATED, BLOCK_N)
        else:
            _act_row(x_row, out_row, n_cols, GATED, BLOCK_N)
        x_row += NUM_BLOCKS * in_stride
        out_row += NUM_BLOCKS * n_cols


@triton.jit
def _silu_mul_tiled_kernel(
    x_ptr,  # (M, 2N) bf16, token-major: gate | up
    out_ptr,  # (M, N) bf16; rows >= V are left untouched
    live_rows_ptr,  # (1,) int32 V, read on device (graph-safe)
    in_stride,  # W = 2N
    cap_rows,  # M: bounds the speculative first tile
    N_COLS: tl.constexpr,  # N: a constexpr, so `up` sits at a known, aligned offset from `gate`
    TILE_ROWS: tl.constexpr,
    TILE_COLS: tl.constexpr,
    PREFETCH: tl.constexpr,  # load the first tile against M, alongside the live-row load
):
    """Grid: (programs,), fixed at capture from M and the grid cap. The live prefix is cut into
    TILE_ROWS x TILE_COLS tiles taken round-robin, so every program has work while tiles remain
    and each thread moves whole 16-byte vectors (TILE_COLS contiguous bf16 per row)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    col_tiles = (N_COLS + TILE_COLS - 1) // TILE_COLS
    r = tl.arange(0, TILE_ROWS)
    c = tl.arange(0, TILE_COLS)
    first = pid
    if PREFETCH:
        # the first tile is read against the capacity M, so its load does not wait for the
        # live-row load; only the store is bounded by the live rows. Rows past V are read (they
        # are allocated) but never written.
        rows = (pid // col_tiles) * TILE_ROWS + r
        cols = (pid % col_tiles) * TILE_COLS + c
        rows64 = rows.to(tl.int64)
        src = x_ptr + rows64[:, None] * in_stride + cols[None, :]
        cap_mask = (rows < cap_rows)[:, None] & (cols < N_COLS)[None, :]
        g = tl.load(src, mask=cap_mask, other=0.0).to(tl.float32)
        u = tl.load(src + N_COLS, mask=cap_mask, other=0.0).to(tl.float32)
        n_rows = tl.load(live_rows_ptr)
        y = g * tl.sigmoid(g) * u
        mask = (rows < n_rows)[:, None] & (cols < N_COLS)[None, :]
        tl.store(out_ptr + rows64[:, None] * N_COLS + cols[None, :], y.to(tl.bfloat16), mask=mask)
        first = pid + nprog
    else:
        n_rows = tl.load(live_rows_ptr)
    n_tiles = tl.cdiv(n_rows, TILE_ROWS) * col_tiles
    for t in range(first, n_tiles, nprog):
        rows = (t // col_tiles) * TILE_ROWS + r
        cols = (t % col_tiles) * TILE_COLS + c
        mask = (rows < n_rows)[:, None] & (cols < N_COLS)[None, :]
        rows64 = rows.to(tl.int64)
        src = x_ptr + rows64[:, None] * in_stride + cols[None, :]
        g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(src + N_COLS, mask=mask, other=0.0).to(tl.float32)
        y = g * tl.sigmoid(g) * u
        tl.store(out_ptr + rows64[:, None] * N_COLS + cols[None, :], y.to(tl.bfloat16), mask=mask)


# ----------------------------------------------------------------------------------- launchers


def act_rows(inp: Inputs, num_blocks: int, block_n: int, num_warps: int):
    """The seed kernel (capacity-bound loop, early exit), any op: its last argument is M."""
    return _rows_launch(_act_rows_kernel, inp, inp.rows, num_blocks, block_n, num_warps)


def act_rows_live_bound(inp: Inputs, num_blocks: int, block_n: int, num_warps: int):
    """The live-bounded loop, any op: its last argument is the input stride W."""
    return _rows_launch(_act_rows_live_bound_kernel, inp, inp.in_cols, num_blocks, block_n, num_warps)


def _rows_launch(kernel, inp: Inputs, last: int, num_blocks: int, block_n: int, num_warps: int):
    # the flat op reads no map; any int32 tensor will do for the unused pointer
    args = (inp.x, inp.out, inp.live, inp.live if inp.perm is None else inp.perm, inp.n_cols, last)
    consts = dict(GATED=inp.op in GATED_OPS, PADDED=inp.op in PADDED_OPS, BLOCK_N=block_n, NUM_BLOCKS=num_blocks)

    def launch():
        kernel[(num_blocks,)](*args, **consts, num_warps=num_warps)

    return launch


# Megatron's kernels by op, and their arguments by name (input, output, [map,] count, N, M); a
# renamed argument upstream makes the variant unavailable with the reason.
_UPSTREAM = {"silu_mul_bounded": ("silu_mul_bounded", ("input_ptr", "output_ptr", "n_rows_ptr", "N", "max_rows")),
             "swiglu": ("swiglu", ("input_ptr", "output_ptr", "src_idx_ptr", "n_used_ptr", "N", "max_rows")),
             "squared_relu": ("squared_relu", ("input_ptr", "output_ptr", "src_idx_ptr", "n_used_ptr", "N",
                                               "max_rows"))}


def act_rows_upstream(inp: Inputs, num_blocks: int, block_n: int, num_warps: int):
    name, names = _UPSTREAM[inp.op]
    kernel = upstream.load(name)
    upstream.require_args(kernel, names + ("BLOCK_N", "NUM_BLOCKS"), inp.op)
    values = (inp.x, inp.out, inp.live, inp.n_cols, inp.rows) if inp.op not in PADDED_OPS else (
        inp.x, inp.out, inp.perm, inp.live, inp.n_cols, inp.rows)
    kw = dict(zip(names, values))

    def launch():
        kernel[(num_blocks,)](**kw, BLOCK_N=block_n, NUM_BLOCKS=num_blocks, num_warps=num_warps)

    return launch


def block_n(n_cols: int) -> int:
    return min(next_pow2(n_cols), _MAX_BLOCK_N)


def capped_blocks(rows: int, cap: int) -> int:
    """The PR's geometry: one CTA per row, rounded up to a power of two (NUM_BLOCKS is a
    tl.constexpr, so a raw row count would cost one JIT compile per M), capped."""
    return min(next_pow2(rows), cap)


def legacy_blocks(rows: int) -> int:
    return min(rows, _LEGACY_BLOCKS)


def tiled_programs(params: dict, tile_rows: int, tile_cols: int, n_cols: int) -> int:
    """Programs of the tiled kernel: the tiles the capacity M could hold, capped by grid_cap."""
    return max(1, min(params["grid_cap"], cdiv(params["rows"], tile_rows) * cdiv(n_cols, tile_cols)))


# ----------------------------------------------------------------------------------- reference


def activation_ref(x: torch.Tensor, op: str, n_cols: int) -> torch.Tensor:
    """(M, W) bf16 -> (M, N) bf16: float32 math, one bf16 rounding, as the kernels do it."""
    xf = x.float()
    if op in GATED_OPS:
        g, u = xf[:, :n_cols], xf[:, n_cols:2 * n_cols]
        y = g * torch.sigmoid(g) * u
    else:
        r = torch.relu(xf[:, :n_cols])
        y = r * r
    return y.to(torch.bfloat16)


def reference(inp: Inputs, params: dict) -> torch.Tensor:
    """The whole expected output: the torch activation on the rows that do work, the poison on
    every other row (rows >= V, padding rows). Computed on the CPU in float32 (one rounding, as the
    kernels round), then placed where the output lives, so the check runs there."""
    x = inp.x.cpu()
    exp = _poisoned((inp.rows, inp.n_cols), "cpu")
    work = inp.work_rows
    exp[work] = activation_ref(x[work], inp.op, inp.n_cols)
    return exp.to(inp.out.device)


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """bf16 -> int32 on a line where adjacent floats differ by 1 (sign-magnitude unfolded)."""
    b = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(b < 0, -(b & 0x7FFF), b)


def check(inp: Inputs, out: torch.Tensor, expected: torch.Tensor, params: dict) -> Check:
    """Rows that do no work still hold the poison, bit for bit; every live row was written and
    is within _ULP_BOUND bf16 ulps of the float32 torch reference. Integer comparisons only, on
    the device the output is on."""
    guards = torch.cat([inp.out_buf[:_GUARD_ROWS], inp.out_buf[-_GUARD_ROWS:]])
    guarded = bool((guards.view(torch.int16) == _POISON_BITS).all())
    return check_rows(out, expected, inp.work_rows, [] if guarded else ["wrote outside the output (guard rows)"])


def check_rows(out: torch.Tensor, expected: torch.Tensor, work: torch.Tensor, problems: list) -> Check:
    """check without the guard rows: the rows in `work` against `expected`, the others poisoned.
    `problems` holds those found before (the layer's act scope has none: its output has no guards)."""
    dev = out.device
    bits = out.view(torch.int16)
    work = work.to(dev)
    expected = expected.to(dev)  # a no-op where the reference already lives there
    stray = int((bits[~work] != _POISON_BITS).any(dim=1).sum())
    if stray:
        problems.append(f"{stray} rows past the live bound or padded were written")
    unwritten = int((bits[work] == _POISON_BITS).all(dim=1).sum())
    if unwritten:
        problems.append(f"{unwritten}/{int(work.sum())} live rows never written")
    live_out = out[work]
    nan = int(torch.isnan(live_out).sum())
    if nan:
        problems.append(f"{nan} NaN elements in live rows")
    ulps = (ordered_bits(live_out) - ordered_bits(expected[work])).abs()
    worst = int(ulps.max()) if ulps.numel() else 0
    differ = int((ulps > 0).sum())
    spread = f"({differ}/{ulps.numel()} elems differ)"
    if worst > _ULP_BOUND:
        problems.append(f"max {worst} ulp > {_ULP_BOUND} {spread}")
    if problems:
        return Check(False, "; ".join(problems))
    return Check(True, "exact" if worst == 0 else f"max {worst} ulp {spread}")


def nonvacuity(inp: Inputs, out: torch.Tensor, params: dict) -> dict:
    bits = out.view(torch.int16)
    work = inp.work_rows.to(out.device)
    written = (bits != _POISON_BITS).any(dim=1)
    live_out = out[work]
    return {
        "rows_written": int(written.sum()),
        "rows_poisoned_ok": int((~written & ~work).sum()),
        "nonzero_out": int((live_out != 0).sum()),
    }


def work(params: dict, geometry: dict, device) -> dict:
    """Byte and occupancy model. Rows that do work read W and write N bf16 values; the padded
    ops read one map entry per row below V. The live-row scalar is counted once (every CTA
    reads the same 4 bytes, an L2 hit after the first)."""
    live = params["live_rows"]
    padded = params["op"] in PADDED_OPS
    active = live - padded_below(live, params["pad_frac"]) if padded else live
    nb = geometry["num_blocks"]
    # a capacity-bound loop visits every row slot below M (each live CTA walks cdiv(M, NB) of
    # them, guarding with row < V); a live-bound loop stops at V
    bound = params["rows"] if geometry.get("loop_bound") == "capacity" else live
    return {
        "bytes": active * (geometry["in_cols"] + geometry["n_cols"]) * 2 + 4 + (live * 4 if padded else 0),
        "ctas": nb,
        "ctas_with_work": min(nb, active),
        "threads_per_cta": geometry["num_warps"] * 32,
        "rows_active": active,
        "rows_per_cta": cdiv(live, nb),
        "loop_iters_per_cta": cdiv(bound, nb) if live else 0,
        "col_blocks": cdiv(geometry["n_cols"], geometry["block_n"]),
    }


# ----------------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    op: str
    x: torch.Tensor  # (M, W) bf16
    live: torch.Tensor  # (1,) int32 V
    perm: torch.Tensor | None  # (M,) int32, -1 = padding (padded ops only)
    out_buf: torch.Tensor  # (M + 2 * _GUARD_ROWS, N) bf16; the output is the middle
    out: torch.Tensor  # (M, N) bf16 view
    work_rows: torch.Tensor  # (M,) bool on the CPU: rows a correct kernel writes
    rows: int
    live_rows: int
    n_cols: int
    in_cols: int


def _poisoned(shape: tuple, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=torch.bfloat16, device=device)
    t.view(torch.int16).fill_(_POISON_BITS)
    return t


def padding_rows(rows: int, frac: float) -> torch.Tensor:
    """(rows,) bool: row i is padding when floor((i + 1) f) > floor(i f). That spreads the
    padding rows evenly, and exactly floor(L f) of them lie below any L, which `work` relies on."""
    i = torch.arange(rows + 1, dtype=torch.float64)
    steps = torch.floor(i * frac)
    return (steps[1:] - steps[:-1]) > 0


def padded_below(live: int, frac: float) -> int:
    return math.floor(live * frac)


def build_inputs(params: dict, device: str, set_index: int = 0) -> Inputs:
    seed = params["seed"] * 1_000_003 + set_index
    g = torch.Generator().manual_seed(seed)
    op, M, V = params["op"], params["rows"], params["live_rows"]
    in_cols, n_cols = widths(params)
    # every row is drawn, past V too: a kernel that ignores the bound writes them and fails
    x = (torch.randn(M, in_cols, generator=g) * _INPUT_STD).to(torch.bfloat16)
    work = torch.arange(M) < V
    perm = None
    if op in PADDED_OPS:
        perm = torch.randint(0, M, (M,), generator=g, dtype=torch.int32)
        pad = padding_rows(M, params["pad_frac"])
        perm[pad] = -1
        work &= ~pad
        perm = perm.to(device)
    out_buf = _poisoned((M + 2 * _GUARD_ROWS, n_cols), device)
    live = torch.tensor([V], dtype=torch.int32, device=device)
    return Inputs(op, x.to(device), live, perm, out_buf, out_buf[_GUARD_ROWS:_GUARD_ROWS + M], work,
                  M, V, n_cols, in_cols)


def input_bytes(params: dict) -> int:
    in_cols, n_cols = widths(params)
    M = params["rows"]
    maps = M * 4 if params["op"] in PADDED_OPS else 0
    return M * in_cols * 2 + (M + 2 * _GUARD_ROWS) * n_cols * 2 + 4 + maps


def touched_bytes(params: dict) -> int:
    """Bytes one launch actually touches (live rows only): what the cold-L2 rotation must size
    against, since the rows past the live bound are allocated but never read."""
    in_cols, n_cols = widths(params)
    live = params["live_rows"]
    maps = live * 4 if params["op"] in PADDED_OPS else 0
    return live * (in_cols + n_cols) * 2 + 4 + maps


# ----------------------------------------------------------------------------------- variants


def _reset(inp: Inputs):
    def reset():
        inp.out_buf.view(torch.int16).fill_(_POISON_BITS)

    return reset


def _built(inp: Inputs, launcher, num_blocks: int, cap: int, num_warps: int, loop: str) -> Built:
    bn = block_n(inp.n_cols)
    launch = launcher(inp, num_blocks, bn, num_warps)
    geometry = {"num_blocks": num_blocks, "grid_cap": cap, "block_n": bn, "num_warps": num_warps,
                "n_cols": inp.n_cols, "in_cols": inp.in_cols, "loop_bound": loop}
    return Built(launch, inp.out, _reset(inp), geometry)


@FAMILY.builds("capped", "shipped")
def build_capped(inp: Inputs, params: dict, device) -> Built:
    cap = params["grid_cap"]
    return _built(inp, act_rows, capped_blocks(params["rows"], cap), cap, params["num_warps"], "capacity")


@FAMILY.builds("legacy")
def build_legacy(inp: Inputs, params: dict, device) -> Built:
    return _built(inp, act_rows, legacy_blocks(params["rows"]), _LEGACY_BLOCKS, params["num_warps"],
                  "capacity")


@FAMILY.builds("live-bound")
def build_live_bound(inp: Inputs, params: dict, device) -> Built:
    cap = params["grid_cap"]
    return _built(inp, act_rows_live_bound, capped_blocks(params["rows"], cap), cap,
                  params["num_warps"], "live")


@FAMILY.builds("upstream")
def build_upstream(inp: Inputs, params: dict, device) -> Built:
    cap = params["grid_cap"]
    return _built(inp, act_rows_upstream, capped_blocks(params["rows"], cap), cap, params["num_warps"],
                  "capacity")


@FAMILY.builds("tiled")
def build_tiled(inp: Inputs, params: dict, device) -> Built:
    if inp.op != "silu_mul_bounded":
        raise ValueError(f"the tiled variant implements op silu_mul_bounded only, not {inp.op}")
    tr, tc, nw = params["tile_rows"], params["tile_cols"], params["num_warps"]
    pre = bool(params.get("prefetch") or 0)
    grid = tiled_programs(params, tr, tc, inp.n_cols)
    args = (inp.x, inp.out, inp.live, inp.in_cols, inp.rows)
    n = inp.n_cols

    def launch():
        _silu_mul_tiled_kernel[(grid,)](*args, N_COLS=n, TILE_ROWS=tr, TILE_COLS=tc, PREFETCH=pre, num_warps=nw)

    geometry = {"num_blocks": grid, "grid_cap": params["grid_cap"], "block_n": tc, "tile_rows": tr,
                "num_warps": nw, "prefetch": int(pre), "n_cols": n, "in_cols": inp.in_cols, "loop_bound": "live"}
    return Built(launch, inp.out, _reset(inp), geometry)

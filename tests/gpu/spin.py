"""A kernel of known duration, to test the timer against (tests/gpu, scripts/nvbench_gap.py).

One program of one warp spins on the SM's cycle counter (`%clock64`) for a given number of
cycles. The cycle rate comes from the GPU's global timer (`%globaltimer`, nanoseconds): a long
spin reads both counters at its start and end. The global timer ticks coarsely (up to a
microsecond on some parts), too coarsely to spin on for 2 µs, but over a spin of a few
milliseconds its tick is a small fraction; the cycle counter is exact but runs at the SM clock,
which the calibration measures. So `cycles = T_ns * cycles_per_ns` spins T.

GPU only: the interpreter has no inline assembly.
"""

from __future__ import annotations

import triton
import triton.language as tl

# A calibration spin this long reads the global timer's coarsest known tick (1 µs) as 0.05%.
CALIBRATION_NS = 2_000_000


@triton.jit
def _clock64():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _spin_kernel(
    out_ptr,  # (2,) int64: cycles spun, global-timer ns elapsed (written when RECORD)
    cycles,  # how long to spin, in SM cycles
    RECORD: tl.constexpr,
):
    """Grid: (1,), one warp. Spin until the cycle counter has advanced `cycles`."""
    if RECORD:
        t0 = _globaltimer()
    c0 = _clock64()
    c = c0
    while c - c0 < cycles:
        c = _clock64()
    if RECORD:
        t1 = _globaltimer()
        tl.store(out_ptr, c - c0)
        tl.store(out_ptr + 1, t1 - t0)


def spin_launch(out, cycles: int, record: bool = False):
    """A zero-argument launch of the spin (`out`: a (2,) int64 CUDA tensor)."""

    def launch():
        _spin_kernel[(1,)](out, cycles, RECORD=record, num_warps=1)

    return launch


def cycles_per_ns(out, spin_ns: int = CALIBRATION_NS, guess_ghz: float = 2.0) -> float:
    """The SM cycle rate now: spin about `spin_ns` (at a guessed clock) and divide the cycles spun
    by the global-timer nanoseconds it took."""
    import torch

    launch = spin_launch(out, int(spin_ns * guess_ghz), record=True)
    launch()  # compile, and wake the clock
    torch.cuda.synchronize()
    launch()
    torch.cuda.synchronize()
    spun, ns = (int(v) for v in out.tolist())
    return spun / ns

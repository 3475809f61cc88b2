"""The contract between a kernel family and the runner.

A variant builder takes the inputs of one case and returns a `Built`: a zero-argument launch
closure (allocation already done, so the closure can be captured in a CUDA graph), the output
it writes, a reset that restores the pre-launch state (zero counters, poison outputs), the
launch geometry for the record, and the key of the JIT specialization it compiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from moebench.errors import UsageError


@dataclass
class Built:
    launch: Callable[[], None]
    output: Any  # torch.Tensor checked after a launch
    reset: Callable[[], None]
    geometry: dict[str, Any] = field(default_factory=dict)
    compile_key: tuple = ()


@dataclass
class Check:
    ok: bool
    detail: str = ""


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def env_pow2(name: str, default: int) -> int:
    """A power-of-two knob from the environment (the seed PRs' kill switches)."""
    import os

    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise UsageError(f"${name}: expected a power of two, got {raw!r}") from None
    if v <= 0 or v & (v - 1):
        raise UsageError(f"${name}: expected a power of two, got {v}")
    return v

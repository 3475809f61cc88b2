"""Code placements: each placement group launches its own load of every Triton kernel it uses.

Why (results/h200/TIMER.md, "Between processes"): on an H200 one count case read 4.94, 5.46 and
5.79 µs in fresh processes of one machine while its 4 placement groups (256 data placements)
agreed within 0.5% inside each process. What all groups of a case share inside one process, and
nothing else does, is the kernel's binary: loaded once per process, at an address the process's
allocation history decides. Loading the same binary again puts its code elsewhere
(scripts/code_probe.py moved tokens 4096 / BLOCK 512 by 4% between loads). So group g > 0
captures its graph with a load of its own of every Triton kernel group 0 launched; the graph
bakes the function handle in, its replays run that copy of the code, and the spread between code
placements shows in the interval between groups like the data placements' spread does.

Triton internals used (triton 3.6 and 3.9): `CompiledKernel.run` is a property read on every
launch, and `JITFunction.run` passes `kernel.function` to the launcher, so swapping a compiled
kernel's `function` while a graph is captured changes what that graph launches, and nothing else.
Off switch: `timing.code_placement: shared` (every group launches the process's one load).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

_TRACKING: list[set] = []  # the kernels launched while a `tracking` block is open
_PATCHED = False
_LOADS: dict[tuple[int, int], object] = {}  # (id(kernel), g) -> function handle of load g
_MODULES: list = []  # the modules of those loads, alive as long as the process (a few KB each)


def _patch() -> bool:
    """Make CompiledKernel.run record its kernel while tracking. False where Triton has no such
    class (then nothing is reloaded: e.g. under the interpreter, where nothing is compiled)."""
    global _PATCHED
    if _PATCHED:
        return True
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return False
    prop = CompiledKernel.__dict__.get("run")
    if not isinstance(prop, property):
        return False

    def run(self):
        for seen in _TRACKING:
            seen.add(self)
        return prop.fget(self)

    CompiledKernel.run = property(run)
    _PATCHED = True
    return True


@contextmanager
def tracking() -> Iterator[set]:
    """The compiled Triton kernels launched inside the block."""
    seen: set = set()
    if not _patch():
        yield seen
        return
    _TRACKING.append(seen)
    try:
        yield seen
    finally:
        _TRACKING.remove(seen)


def _load(kernel, g: int):
    key = (id(kernel), g)
    if key not in _LOADS:
        import torch
        from triton.runtime.driver import driver

        module, function, *_ = driver.active.utils.load_binary(
            kernel.name, kernel.kernel, kernel.metadata.shared, torch.cuda.current_device())
        _MODULES.append((kernel, module))  # the kernel too: its id stays unique while the load lives
        _LOADS[key] = function
    return _LOADS[key]


@contextmanager
def placed(kernels: set, g: int) -> Iterator[None]:
    """Inside the block, `kernels` launch their g-th load (g = 0: the process's own)."""
    if g == 0 or not kernels:
        yield
        return
    saved = [(k, k.function) for k in kernels]
    try:
        for k, _ in saved:
            k.function = _load(k, g)
        yield
    finally:
        for k, f in saved:
            k.function = f


class CodePlacements:
    """What time_groups calls around each group's capture: group 0 records the kernels its
    closures launch; group g > 0 captures with load g of each of them."""

    def __init__(self) -> None:
        self.kernels: set = set()

    @contextmanager
    def __call__(self, g: int) -> Iterator[None]:
        if g == 0:
            with tracking() as seen:
                yield
            self.kernels = seen
            return
        with placed(self.kernels, g):
            yield

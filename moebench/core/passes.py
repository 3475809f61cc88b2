"""Passes: measurements beside moebench's own timing, registered on the run driver
(moebench.core.driver), the way tritonbench registers metrics. This module is the contract and the
registry; the built-in passes (the cross-check timers, the hardware counters) live in
moebench.passes, a floor above, loaded by name on first use as the built-in families are.

A pass is a module-level subclass of `Pass` (the workers get their passes pickled), registered
with `@register`, in moebench.passes or a plugin file. It declares

- `name`: what `--cross-check NAME` asks for, and what the provenance lists when it ran;
- where it can run: `cuda_only` (needs a timed run on a CUDA device), `in_workers` (can run inside
  the per-GPU workers of `--devices`); `select` refuses any other combination with a UsageError
  (exit 2) before the first case, so a pass listed in the provenance always ran;
- `keeps_graphs`: the timer keeps each case's captured graphs (and the copies they read) for it;
- `announce`: the progress line while its `after_all` runs; `unavailable()`: why it cannot run on
  this machine (a missing package), or None;

and implements either hook or both:

- `after_case(ctx: CaseDone)`: right after a case was timed (untimed: after its checks), in the
  process that ran it (a worker, with `--devices`);
- `after_all(ctx: AfterAll)`: after every case, in the driver's process, in registration order
  (nvbench before the profiler: CUPTI disturbs later replays); it may add fields to any record
  (entries of `record.cross`, or a dict of its own on `work` or `cross`);
- `release()`: drop what it kept; the driver calls it after `after_all`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from moebench.core.records import Record
from moebench.errors import UsageError

BUILTIN = "moebench.passes"  # the package whose import registers the built-in passes


@dataclass
class CaseDone:
    """What a pass's after_case hook sees: one case right after it was timed (or checked, untimed)."""

    case: Any
    record: Record
    builts: list  # group 0's Built closures (one per placement of its rotation); untimed: the checked one
    timed: bool = True
    graphs: list = field(default_factory=list)  # the captured graphs, when a pass asked to keep them
    held: list = field(default_factory=list)  # the copies (and pools) group 0 and the kept graphs read
    pools: Any = None  # the memory pools of the case's input sets (private placements)
    launches_per_graph: int = 0


@dataclass
class AfterAll:
    """What a pass's after_all hook sees: the whole run."""

    spec: Any
    device: Any
    options: Any
    cases: list
    records: list[Record]
    pipeline: Any = None  # the driver's CasePipeline (None when the cases ran in workers)
    environ: dict = field(default_factory=dict)  # the run's environment (the kill switches), as the cases read it


class Pass:
    name: ClassVar[str] = ""
    cuda_only: ClassVar[bool] = True
    in_workers: ClassVar[bool] = True
    keeps_graphs: ClassVar[bool] = False
    announce: ClassVar[str | None] = None

    def unavailable(self) -> str | None:
        return None

    def after_case(self, ctx: CaseDone) -> None:  # noqa: B027 - optional hook
        pass

    def after_all(self, ctx: AfterAll) -> None:  # noqa: B027 - optional hook
        pass

    def release(self) -> None:  # noqa: B027 - optional hook
        pass

    @classmethod
    def has_after_all(cls) -> bool:
        return cls.after_all is not Pass.after_all


PASSES: dict[str, type[Pass]] = {}


def catalogue() -> dict[str, type[Pass]]:
    """Every registered pass by name, in registration order: the built-in ones (importing
    moebench.passes registers them, once per process) first, then any a plugin registered."""
    importlib.import_module(BUILTIN)
    return PASSES


def register(cls: type[Pass]) -> type[Pass]:
    """Register a pass class under its name (a later registration of the same name replaces it)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: a pass needs a name")
    if not cls.__module__.startswith(BUILTIN + "."):
        catalogue()  # the built-in passes first: their order is the order after_all hooks run in
    PASSES[cls.name] = cls
    return cls


def select(names, *, backend: str, timed: bool, workers: bool) -> list[Pass]:
    """Fresh instances of the named passes, in registration order; the one check of `--cross-check`:
    a UsageError naming the first that is unknown, cannot run on this machine (`unavailable`: a
    missing package), or cannot run where these cases run (the interpreter, an untimed run, per-GPU
    workers)."""
    wanted, known = list(dict.fromkeys(names)), catalogue()
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(f"--cross-check: unknown {', '.join(map(repr, unknown))}; expected {', '.join(known)}")
    out = []
    for name, cls in known.items():
        if name not in wanted:
            continue
        why = cls().unavailable()
        if why:
            raise UsageError(why)
        if cls.cuda_only and (backend != "cuda" or not timed):
            where = "an untimed run" if backend == "cuda" else f"this run ({backend}: the Triton interpreter, " \
                    "correctness only)" if backend == "interpret" else f"this run ({backend})"
            raise UsageError(f"--cross-check {name}: needs timings on a CUDA device, and {where} has none; "
                             f"drop --cross-check {name}")
        if workers and not cls.in_workers:
            raise UsageError(f"--cross-check {name}: cannot run with --devices (its pass needs every case's graphs "
                             "in one process); drop --devices or the cross-check")
        out.append(cls())
    return out

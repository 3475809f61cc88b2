"""Timing core: CUDA-graph replay of zero-argument launch closures. Knows nothing about MoE; the
method is docs/method.md, 'The timer'. `time_groups` (`time_graph`: one group) returns raw
per-launch samples, replay time / launches, so the gap between graph nodes is in them (statistics
live in moebench.core.stats); launch i of a graph is closure i % len(closures). The empty kernel a
launch is read against (`empty_launch`) lives here too; the cross-check timers are in
moebench.passes.timers.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import triton

Launch = Callable[[], None]
# capture(fresh=True) runs a full garbage collection only when the allocator holds more than this
# share of the device's memory
FULL_GC_RESERVED_SHARE = 0.25


@dataclass
class Samples:
    per_launch_us: list[float]  # every replay of every group, in the order they ran
    launches_per_graph: int
    replays: int
    wall_s: float
    stopped_by: str  # "noise" | "max_replays" | "max_seconds" | "max_groups"
    groups: list[list[float]] = field(default_factory=list)  # per-launch samples of each group
    graphs: list = field(default_factory=list, repr=False)  # the captured graphs, when kept


def capture(fns: Sequence[Launch], launches: int, warmup: int, fresh: bool = True):
    """Warm up on a side stream (`warmup` rounds of every closure), then capture `launches`
    launches into one CUDA graph. `fresh`: before capturing, hand the allocator's free cached
    blocks back to the driver, as `torch.cuda.graph` does on entering; `time_groups` does that for
    a case's first graph only (its further graphs come right after, with nothing freed between).
    `torch.cuda.graph` also runs a full garbage collection first; here the young generations are
    collected, and the whole heap only when the allocator holds over a quarter of the device's
    memory (cycles could hold input copies)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if fresh:
        gc.collect(1)
        if torch.cuda.memory_reserved() > FULL_GC_RESERVED_SHARE * torch.cuda.get_device_properties(
                torch.cuda.current_device()).total_memory:
            gc.collect()
        torch.cuda.empty_cache()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            for i in range(launches):
                fns[i % len(fns)]()
        finally:
            graph.capture_end()
    torch.cuda.synchronize()
    return graph


def time_groups(
    make_group: Callable[[int], Sequence[Launch]],
    *,
    min_groups: int = 1,
    max_groups: int = 1,
    launches_per_graph: int = 200,
    warmup: int = 5,
    min_replays: int = 20,
    max_replays: int = 4000,
    max_seconds: float = 1.0,
    batch: int = 20,
    stop: Callable[[list[float]], bool] | None = None,
    enough: Callable[[list[list[float]]], bool] | None = None,
    keep: bool = False,
) -> Samples:
    """Time one graph per group of closures, `make_group(g)` giving group g's closures (each group
    its own buffer placements). A round replays, `batch` times each and in turn, every group that
    still needs samples (fewer than `min_replays`, or `stop(group)` false: its own noise too high),
    so a drift in the device's state lands on those groups alike.

    When no group needs samples, `enough(groups)` decides: stop, or add a group (up to
    `max_groups`, and only within `max_seconds`) and go on. Without `enough` the groups present are
    enough. A replay cap per group or the time cap ends the run earlier. With `keep` the graphs
    stay alive in the result (for a later cross-check)."""
    graphs: list = []
    groups: list[list[float]] = []
    order: list[float] = []

    def add() -> None:
        # the first graph warms its closures `warmup` rounds (the case's first launches of its
        # placements); a further group's closures are the same kernels, compiled and loaded, over
        # fresh copies: one round before capture, then the same `warmup` replays of its graph
        first = not graphs
        g = capture(make_group(len(graphs)), launches_per_graph, warmup if first else 1, fresh=first)
        for _ in range(max(1, warmup)):
            g.replay()
        torch.cuda.synchronize()
        graphs.append(g)
        groups.append([])

    def needs(got: list[float]) -> bool:
        return len(got) < max_replays and (len(got) < min_replays or stop is None or not stop(got))

    for _ in range(max(1, min_groups)):
        add()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
    t0 = time.perf_counter()
    stopped_by = "max_replays"
    while True:
        active = [(graph, got) for graph, got in zip(graphs, groups) if needs(got)]
        if not active:
            if all(len(g) >= max_replays for g in groups):
                break
            if enough is None or enough(groups):
                stopped_by = "noise"
                break
            if len(graphs) >= max_groups:
                stopped_by = "max_groups"
                break
            if time.perf_counter() - t0 > max_seconds:
                stopped_by = "max_seconds"
                break
            add()
            continue
        if time.perf_counter() - t0 > max_seconds and all(len(g) >= min_replays for g in groups):
            stopped_by = "max_seconds"
            break
        for graph, got in active:
            n = min(batch, max_replays - len(got))
            for i in range(n):
                starts[i].record()
                graph.replay()
                ends[i].record()
            ends[n - 1].synchronize()
            new = [starts[i].elapsed_time(ends[i]) * 1e3 / launches_per_graph for i in range(n)]
            got.extend(new)
            order.extend(new)
    wall = time.perf_counter() - t0
    # kept for a later cross-check: the first min_groups graphs only (groups added past them would
    # hold every case's extra placements in memory until the end of the sweep)
    kept = graphs[:max(1, min_groups)] if keep else []
    del graphs
    return Samples(order, launches_per_graph, len(order), wall, stopped_by, groups, kept)


def time_graph(fns: Sequence[Launch], **kw) -> Samples:
    """`time_groups` with the one group `fns` (the same keywords)."""
    return time_groups(lambda g: fns, **kw)


def time_events(fn: Launch, *, iters: int = 10, warmup: int = 2) -> list[float]:
    """Plain event timing of one closure, in microseconds per call (for long, bandwidth-bound work
    such as the copy ceiling, where graph replay buys nothing)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    return out


@triton.jit
def _empty_kernel(x_ptr):  # (1,) int32, never touched
    pass


def empty_launch(x, grid: int) -> Launch:
    """The empty kernel, the floor a launch-bound number is read against: captured and replayed
    exactly like a measured kernel, so its time is the cost of a graph node that does nothing
    (launch, schedule `grid` CTAs, retire)."""

    def launch():
        _empty_kernel[(grid,)](x, num_warps=4)

    return launch

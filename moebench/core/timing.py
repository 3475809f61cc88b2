"""Timing core: CUDA-graph replay of zero-argument launch closures. Knows nothing about MoE.

`time_graph` captures `launches_per_graph` launches in one CUDA graph (on a side stream, after
a warm-up that also triggers any JIT compile), replays it, and times each replay with a pair
of CUDA events. It returns raw per-launch samples (replay time / launches); statistics live in
`moebench.core.stats`. A launch time measured this way includes the gap between graph nodes, which
a profiler's kernel duration does not.

With several closures (cold-L2 rotation: one per input-buffer set) launch i of the graph is
closure i % len(closures), so consecutive launches touch different buffers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

Launch = Callable[[], None]


@dataclass
class Samples:
    per_launch_us: list[float]
    launches_per_graph: int
    replays: int
    wall_s: float
    stopped_by: str  # "noise" | "max_replays" | "max_seconds"


def _torch():
    import torch

    return torch


def capture(fns: Sequence[Launch], launches: int, warmup: int):
    """Warm up on a side stream, then capture `launches` launches into one CUDA graph."""
    torch = _torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for i in range(launches):
            fns[i % len(fns)]()
    torch.cuda.synchronize()
    return graph


def time_graph(
    fns: Sequence[Launch],
    *,
    launches_per_graph: int = 200,
    warmup: int = 5,
    min_replays: int = 20,
    max_replays: int = 4000,
    max_seconds: float = 1.0,
    batch: int = 20,
    stop: Callable[[list[float]], bool] | None = None,
) -> Samples:
    """Replay a graph of `launches_per_graph` launches until `stop(samples)` says enough
    (checked after each batch, once `min_replays` are in), or a replay/time cap is hit."""
    torch = _torch()
    graph = capture(fns, launches_per_graph, warmup)
    for _ in range(max(1, warmup)):
        graph.replay()
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
    samples: list[float] = []
    t0 = time.perf_counter()
    stopped_by = "max_replays"
    while len(samples) < max_replays:
        n = min(batch, max_replays - len(samples))
        for i in range(n):
            starts[i].record()
            graph.replay()
            ends[i].record()
        ends[n - 1].synchronize()
        samples.extend(starts[i].elapsed_time(ends[i]) * 1e3 / launches_per_graph for i in range(n))
        if len(samples) >= min_replays:
            if stop is not None and stop(samples):
                stopped_by = "noise"
                break
            if time.perf_counter() - t0 > max_seconds:
                stopped_by = "max_seconds"
                break
    wall = time.perf_counter() - t0
    del graph
    return Samples(samples, launches_per_graph, len(samples), wall, stopped_by)


def time_events(fn: Launch, *, iters: int = 10, warmup: int = 2) -> list[float]:
    """Plain event timing of one closure, in microseconds per call (for long, bandwidth-bound work
    such as the copy ceiling, where graph replay buys nothing)."""
    torch = _torch()
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


def dobench_cudagraph_us(fn: Launch, rep_ms: int = 200) -> float:
    """Independent cross-check: triton.testing.do_bench_cudagraph's median, in µs per launch."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")) * 1e3


def profiler_kernel_us(fns: Sequence[Launch], launches_per_graph: int, replays: int = 20) -> float | None:
    """Kernel time per launch as the PyTorch profiler (CUPTI) records it over graph replays: pure
    kernel time, without the gap between graph nodes that replay timing includes. A launch of
    several kernels (a whole layer step) counts the sum of its kernels."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    import warnings

    graph = capture(fns, launches_per_graph, warmup=1)
    graph.replay()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's per-cycle notice
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
    total = 0.0
    for evt in prof.key_averages():
        name = evt.key.lower()
        if "memcpy" in name or "memset" in name or "cudagraph" in name:
            continue
        t = getattr(evt, "self_device_time_total", None)
        if t is None:
            t = getattr(evt, "self_cuda_time_total", 0.0)
        if t and evt.count:
            total += t
    del graph
    return total / (replays * launches_per_graph) if total else None

"""Timing core: CUDA-graph replay of zero-argument launch closures. Knows nothing about MoE; the
method is docs/method.md, 'The timer'. `time_groups` (`time_graph`: one group) returns raw
per-launch samples, replay time / launches, so the gap between graph nodes is in them (statistics
live in moebench.core.stats); launch i of a graph is closure i % len(closures). The empty kernel a
launch is read against (`empty_launch`) and the cross-checks live here too: triton's
do_bench_cudagraph, the PyTorch profiler's kernel time, and NVIDIA's nvbench.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import triton
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench_cudagraph

from moebench.core.text import one_line

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


# ----------------------------------------------------------------------------------- cross-checks


def dobench_cudagraph_us(fn: Launch) -> float:
    """Independent cross-check: triton.testing.do_bench_cudagraph's median, in µs per launch."""
    return float(do_bench_cudagraph(fn, rep=200, return_mode="median")) * 1e3


def profiler_kernel_us(fns: Sequence[Launch], launches_per_graph: int) -> float | None:
    """Kernel time per launch as the PyTorch profiler (CUPTI) records it over graph replays: pure
    kernel time, without the gap between graph nodes that replay timing includes. A launch of
    several kernels (a whole layer step) counts the sum of its kernels."""
    replays = 20
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
        t = evt.self_device_time_total
        if t and evt.count:
            total += t
    del graph
    return total / (replays * launches_per_graph) if total else None


# nvbench (cuda-bench, `import cuda.bench`) times each graph with its own measurements: "cold" (the
# L2 flushed before every replay, one replay per sample, synchronized) and "batch" (replays back to
# back behind a blocking kernel), and stops by its own criterion (stdrel: the relative standard
# deviation of the cold samples under --max-noise, after --min-time of accumulated GPU time).
# Its default of 0.5 s of GPU time per measurement is cut to 0.1 s here.
NVBENCH_MIN_TIME_S = 0.1
NVBENCH_BATCH_TIME_S = 0.1
NVBENCH_MAX_NOISE_PCT = 0.5  # nvbench's own default
NVBENCH_TIMEOUT_S = 10.0  # per measurement, wall time; nvbench's default is 15
_NVBENCH_RAN = False  # cuda.bench runs its registered benchmarks once per process


def nvbench_unavailable() -> str | None:
    """Why nvbench cannot run here, or None. Loading `cuda.bench`'s native module needs the
    cuda-bench wheel and a cuda-bindings package of the CUDA runtime's major version."""
    try:
        import cuda.bench as bench

        bench.State  # noqa: B018 - the attribute loads the native extension
    except Exception as e:  # noqa: BLE001 - any failure to load is the answer
        return f"{type(e).__name__}: {one_line(e)}"
    if _NVBENCH_RAN:
        return "cuda.bench already ran its benchmarks in this process (it runs them once per process)"
    return None


@dataclass
class NvbenchItem:
    """One graph for nvbench: `replay()` enqueues it on the current stream; `launches` kernel launches
    per replay turn nvbench's per-replay times into per-launch times."""

    replay: Callable[[], None]
    launches: int


def nvbench_graphs(items: Sequence[NvbenchItem], device_index: int = 0, log_dir: Path | None = None) -> list[dict]:
    """Run nvbench once over every graph; per item, its per-launch times in µs and its noise:
    {cold_us, batch_us, cold_noise_pct, cold_samples, batch_samples} (missing where nvbench skipped
    a measurement). nvbench's console output goes to `log_dir/nvbench.log` (library code never
    prints); its JSON results to `log_dir/nvbench.json` (default: $MOEBENCH_NVBENCH_DIR, else a
    temporary folder)."""
    global _NVBENCH_RAN
    problem = nvbench_unavailable()
    if problem:
        raise RuntimeError(f"nvbench: {problem}")
    import cuda.bench as bench

    log_dir = Path(log_dir or os.environ.get("MOEBENCH_NVBENCH_DIR") or tempfile.mkdtemp(prefix="moebench-nvbench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    json_path, log_path = log_dir / "nvbench.json", log_dir / "nvbench.log"

    def graph_bench(state) -> None:
        item = items[state.get_int64("graph")]
        dev = state.get_device()

        def launcher(launch) -> None:
            stream = torch.cuda.ExternalStream(stream_ptr=launch.get_stream().addressof(), device=dev)
            with torch.cuda.stream(stream):
                item.replay()

        state.exec(launcher)

    b = bench.register(graph_bench)
    b.set_name("moebench_graph")
    b.add_int64_axis("graph", list(range(len(items))))
    argv = ["moebench-nvbench", "--devices", str(device_index), "--json", str(json_path), "--quiet",
            "--min-time", str(NVBENCH_MIN_TIME_S), "--max-noise", str(NVBENCH_MAX_NOISE_PCT),
            "--batch-target-time", str(NVBENCH_BATCH_TIME_S), "--timeout", str(NVBENCH_TIMEOUT_S)]
    _NVBENCH_RAN = True
    torch.cuda.synchronize()
    with _fds_to(log_path):
        bench.run_all_benchmarks(argv)
    torch.cuda.synchronize()
    return _nvbench_results(json.loads(json_path.read_text()), items)


def _nvbench_results(doc: dict, items: Sequence[NvbenchItem]) -> list[dict]:
    """Per item, nvbench's cold and batch per-launch times (its summaries are seconds per replay)."""
    out: list[dict] = [{} for _ in items]
    for bench_doc in doc.get("benchmarks", []):
        for st in bench_doc.get("states", []):
            idx = None
            for ax in st.get("axis_values") or []:
                if ax.get("name") == "graph":
                    idx = int(ax.get("value", ax.get("input_string")))
            if idx is None and "graph=" in str(st.get("name", "")):  # "Device=0 graph=3"
                idx = int(str(st["name"]).split("graph=")[1].split()[0])
            if idx is None or not 0 <= idx < len(items) or st.get("is_skipped"):
                continue
            vals = {}
            for s in st.get("summaries", []) or []:
                for d in s.get("data", []):
                    if d.get("name") == "value":
                        vals[s.get("tag")] = d.get("value")
            k = items[idx].launches
            row = out[idx]
            for tag, key in (("nv/cold/time/gpu/mean", "cold_us"), ("nv/batch/time/gpu/mean", "batch_us")):
                if vals.get(tag) is not None:
                    row[key] = float(vals[tag]) * 1e6 / k
            if vals.get("nv/cold/time/gpu/stdev/relative") is not None:
                row["cold_noise_pct"] = 100 * float(vals["nv/cold/time/gpu/stdev/relative"])
            for tag, key in (("nv/cold/sample_size", "cold_samples"), ("nv/batch/sample_size", "batch_samples")):
                if vals.get(tag) is not None:
                    row[key] = int(float(vals[tag]))
    return out


class _fds_to:
    """Point the process's stdout and stderr file descriptors at a file for a while: nvbench's C++
    side writes to them directly."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass
        self.f = open(self.path, "ab")
        self.saved = [os.dup(1), os.dup(2)]
        os.dup2(self.f.fileno(), 1)
        os.dup2(self.f.fileno(), 2)
        return self

    def __exit__(self, *exc):
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        self.f.close()

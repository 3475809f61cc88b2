"""The timers the cross-check passes (moebench.passes.crosscheck) read moebench's own numbers
against: triton's do_bench_cudagraph, the PyTorch profiler's kernel time (CUPTI) over graph
replays, and NVIDIA's nvbench (cuda-bench, `import cuda.bench`) over the graphs moebench timed."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench_cudagraph

from moebench.core.text import one_line
from moebench.core.timing import Launch, capture



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

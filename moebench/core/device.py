"""What machine a sweep runs on, and the ceilings its numbers are read against.

Properties are fetched lazily, once; nothing here touches the device at import time.
Ceilings (copy bandwidth from DRAM and from L2, the empty-kernel floor) are measured on
demand and cached per device in `OUT/<slug>/device.json`, which sweeps reuse.

Every run writes to `OUT/<slug>/`: the GPU's slug (`h200`), `cpu-interpreter` for kernels checked
under the Triton interpreter, and `host` for host-only families, which launch no kernel.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moebench import tritonpatch
from moebench.core.store import atomic_write_text
from moebench.core.stats import median, noise_below, summarize
from moebench.core.text import slugify
from moebench.errors import BackendError
from moebench.sources.upstream import installed_version

CEILINGS_VERSION = 3  # bump when the measurement below changes


@dataclass
class DeviceInfo:
    backend: str  # "cuda" | "interpret"
    name: str
    slug: str
    sm_count: int
    l2_bytes: int
    max_threads_per_sm: int
    total_mem_bytes: int
    compute_capability: str
    driver: str | None
    cuda: str | None
    torch: str
    triton: str | None
    python: str
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    # this GPU's UUID (GPU-...): two GPUs of one model can time a kernel differently (compare says so)
    uuid: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:  # noqa: BLE001 - a broken triton install is reported, not raised
        return None


def want_interpreter(requested: bool | None) -> bool:
    """Decide the backend: --interpret forces the CPU interpreter; otherwise CUDA if present."""
    if requested:
        return True
    if tritonpatch.interpreting():
        return True
    import torch

    return not torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def nvml_clocks(index: int = 0) -> dict[str, int | None]:
    """Current and max SM / memory clocks in MHz (None where NVML is not available)."""
    nv = _nvml()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        return {
            "sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "sm_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        }
    except Exception:  # noqa: BLE001 - no NVML (nv is None), or it cannot read this GPU
        return {"sm_mhz": None, "mem_mhz": None, "sm_max_mhz": None, "mem_max_mhz": None}


def nvml_driver() -> str | None:
    try:
        v = _nvml().nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - no NVML, or it cannot say
        return None


# The interpreter's stand-in machine: kernels are checked as if on a 132-SM GPU (an H200), so
# persistent grids have the same shape they will have there.
INTERPRET_SMS = 132


@functools.lru_cache(maxsize=None)
def detect(interpret: bool) -> DeviceInfo:
    import torch

    if interpret:
        return DeviceInfo(
            backend="interpret", name="CPU (Triton interpreter)", slug="cpu-interpreter",
            sm_count=INTERPRET_SMS, l2_bytes=0, max_threads_per_sm=2048, total_mem_bytes=0,
            compute_capability="-", driver=None, cuda=None, torch=torch.__version__,
            triton=triton_version(), python=platform.python_version())
    if not torch.cuda.is_available():
        raise BackendError("no CUDA device is visible; run with --interpret for a CPU correctness run")
    tritonpatch.install_key_cache()  # Triton's cache key, kept between processes
    idx = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    clocks = nvml_clocks(idx)
    return DeviceInfo(
        backend="cuda", name=p.name, slug=slugify(p.name), sm_count=p.multi_processor_count,
        l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        max_threads_per_sm=int(getattr(p, "max_threads_per_multi_processor", 2048)),
        total_mem_bytes=int(p.total_memory), compute_capability=f"{p.major}.{p.minor}",
        driver=nvml_driver(), cuda=torch.version.cuda, torch=torch.__version__,
        triton=triton_version(), python=platform.python_version(),
        sm_clock_max_mhz=clocks["sm_max_mhz"], mem_clock_max_mhz=clocks["mem_max_mhz"], uuid=gpu_uuid(p))


def gpu_uuid(props) -> str | None:
    """NVML's spelling of a device's UUID (GPU-xxxxxxxx-...), from torch's device properties."""
    raw = str(getattr(props, "uuid", "") or "").strip()
    if not raw:
        return None
    return raw if raw.upper().startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


@functools.lru_cache(maxsize=None)
def host_device() -> DeviceInfo:
    """Where a host-only family runs: this machine's Python, no kernel launched, nothing timed."""
    return DeviceInfo(
        backend="host", name=f"host ({platform.machine() or 'cpu'}, no kernel launched)", slug="host", sm_count=0,
        l2_bytes=0, max_threads_per_sm=0, total_mem_bytes=0, compute_capability="-", driver=None, cuda=None,
        torch=installed_version("torch"), triton=installed_version("triton"), python=platform.python_version())


def require_triton() -> None:
    if triton_version() is None:
        raise BackendError("triton is not importable; install it (pip install triton) to run kernels")


# ------------------------------------------------------------------------------- ceilings


def measure_ceilings(info: DeviceInfo) -> dict[str, Any]:
    """Copy bandwidth far past L2 (DRAM) and well inside it (L2), and the empty-kernel floor at
    grid 1 and grid = SM count. Bandwidth counts bytes read + written."""
    import torch

    from moebench.core.timing import empty_launch, time_events, time_graph

    def replayed(fn):  # 200 launches of `fn` per graph, replayed until the median's noise is under 0.5%
        return summarize(time_graph([fn], launches_per_graph=200, stop=noise_below(0.005)).per_launch_us)

    out: dict[str, Any] = {"version": CEILINGS_VERSION, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    # DRAM: 2 GiB source, far past any L2; plain event timing (each copy is ~1 ms).
    n = 1 << 30  # bf16 elements -> 2 GiB
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
    dst = torch.empty_like(src)
    us = time_events(lambda: dst.copy_(src), iters=20, warmup=3)
    out["copy_dram_bytes"] = 2 * src.numel() * 2
    out["copy_dram_us"] = median(us)
    out["copy_dram_gbps"] = out["copy_dram_bytes"] / (median(us) * 1e-6) / 1e9
    del src, dst
    # L2: a copy whose source + destination fit comfortably in L2, replayed in a graph.
    l2 = info.l2_bytes or (50 << 20)
    m = max(1 << 16, (l2 // 4) // 2)  # bf16 elements; src + dst = l2 / 2... well inside L2
    src = torch.empty(m, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
    dst = torch.empty_like(src)
    s = replayed(lambda: dst.copy_(src))
    out["copy_l2_bytes"] = 2 * m * 2
    out["copy_l2_us"] = s.median_us
    out["copy_l2_gbps"] = out["copy_l2_bytes"] / (s.median_us * 1e-6) / 1e9
    del src, dst
    x = torch.zeros(1, dtype=torch.int32, device="cuda")
    for name, grid in (("empty_us", 1), ("empty_sms_us", info.sm_count)):
        s = replayed(empty_launch(x, grid))
        out[name] = s.median_us
        out[name.replace("_us", "_iqr_us")] = s.iqr_us
    torch.cuda.synchronize()
    return out


def ceilings_path(results_root: Path, info: DeviceInfo) -> Path:
    return results_root / info.slug / "device.json"


def _cached_ceilings(path: Path, info: DeviceInfo) -> dict[str, Any] | None:
    """The ceilings cached at `path` when they are this device's and of this version, else None."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    c = doc.get("ceilings", {}) if isinstance(doc, dict) else {}
    if (isinstance(c, dict) and c.get("version") == CEILINGS_VERSION and doc.get("device", {}).get("name") == info.name
            and doc.get("device", {}).get("driver") == info.driver):
        return c
    return None


def measure_in_child(path: Path, *, timeout: float = 600.0) -> str | None:
    """Measure the ceilings in a child process (moebench.core.ceilings_child) that writes `path`.
    Returns None when it did, else why not (its last line of stderr)."""
    try:
        r = subprocess.run([sys.executable, "-m", "moebench.core.ceilings_child", str(path)], capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    if r.returncode != 0:
        tail = [x for x in (r.stderr or "").strip().splitlines() if x.strip()]
        return f"exit {r.returncode}: {tail[-1] if tail else 'no message'}"
    return None


def load_or_measure_ceilings(info: DeviceInfo, results_root: Path, *, remeasure: bool = False,
                             child: bool = False, note=None) -> dict[str, Any]:
    """The cached ceilings of this device, measured first if missing, stale or asked for. `child`: a
    timed run measures them in a child process (measure_in_child), so that its own memory starts the
    same whether or not they were cached; if the child fails they are measured here and `note` says
    so."""
    if info.backend != "cuda":
        return {}
    path = ceilings_path(results_root, info)
    if path.exists() and not remeasure:
        c = _cached_ceilings(path, info)
        if c is not None:
            return c
    if child:
        why = measure_in_child(path)
        c = _cached_ceilings(path, info) if why is None else None
        if c is not None:
            return c
        if note is not None:
            note(f"device ceilings: measuring them in a child process failed ({why or 'it wrote no ceilings'}); "
                 "measured in this process instead, which can move some count cases by ~9% (results/h200/TIMER.md)")
    c = measure_ceilings(info)
    # where they were measured travels with them into every record's provenance: a run whose own
    # process measured them is the one to distrust
    c["measured_in"] = "the timed process (its child failed)" if child else "a process of its own (moebench device)"
    write_ceilings(path, info, c)
    return c


def write_ceilings(path: Path, info: DeviceInfo, ceilings: dict[str, Any]) -> None:
    """The ceilings file (`moebench device`, a timed run, the child that measures for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"device": info.to_dict(), "ceilings": ceilings}, indent=2) + "\n")

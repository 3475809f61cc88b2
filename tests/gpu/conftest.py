"""The GPU suite (`pytest -m gpu tests/gpu`, with TRITON_INTERPRET=0 on a CUDA machine): the
instrument tested on the device itself. Skipped without CUDA (tests/conftest.py).

Each test writes what it measured through the `gpu_log` fixture. With $MOEBENCH_GPU_LOG set, the
session ends by writing that file: commit and device first, then every test's outcome with its
measurements (scripts/gpu-tests.sh writes results/<device>/gpu-tests.txt this way).

The profiler test runs last: once CUPTI has started in a process, later CUDA-event timings of
that process can read high (results/h200/TIMER.md), and the other tests time with events.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LINES: dict[str, list[str]] = {}
_OUTCOMES: list[tuple[str, str, float, str]] = []  # nodeid, outcome, seconds, skip reason
_T0 = time.time()


@pytest.fixture
def gpu_log(request):
    """gpu_log(text): one line of what this test measured, for the log."""
    lines = _LINES.setdefault(request.node.nodeid, [])
    return lines.append


def _ours(nodeid: str) -> bool:
    return nodeid.startswith("tests/gpu/") or "/tests/gpu/" in nodeid


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda it: _ours(it.nodeid) and "profiler" in it.nodeid)  # stable: profiler tests last


def pytest_runtest_logreport(report):
    if not _ours(report.nodeid):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2])
        elif report.failed:
            reason = str(report.longreprtext).strip().splitlines()[-1] if report.longreprtext else ""
        _OUTCOMES.append((report.nodeid, report.outcome, report.duration, reason))


def _commit() -> str:
    from moebench.core.provenance import git_commit  # $MOEBENCH_COMMIT, else moebench's own HEAD only

    return git_commit() or "unknown"


def _device_lines() -> list[str]:
    try:
        import torch

        from moebench.core.device import detect, nvml_clocks

        d = detect(False)
        clk = nvml_clocks(torch.cuda.current_device())
        return [f"device: {d.name}, {d.sm_count} SMs, L2 {d.l2_bytes / 2**20:.0f} MiB, compute capability "
                f"{d.compute_capability}, SM clock max {d.sm_clock_max_mhz} MHz (now {clk.get('sm_mhz')} MHz)",
                f"software: driver {d.driver}, CUDA {d.cuda}, torch {d.torch}, triton {d.triton}, python {d.python}"]
    except Exception as e:  # noqa: BLE001 - the log still gets written
        return [f"device: unknown ({type(e).__name__}: {e})", f"software: python {platform.python_version()}"]


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MOEBENCH_GPU_LOG")
    if not path or not _OUTCOMES:
        return
    counts: dict[str, int] = {}
    for _, outcome, _, _ in _OUTCOMES:
        counts[outcome] = counts.get(outcome, 0) + 1
    out = ["# moebench GPU suite (pytest -m gpu tests/gpu)", "",
           f"commit: {_commit()}", *_device_lines(),
           f"run: {time.strftime('%Y-%m-%dT%H:%M:%S%z', time.localtime(_T0))}, {time.time() - _T0:.1f} s, "
           + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), ""]
    for nodeid, outcome, secs, reason in _OUTCOMES:
        out.append(f"{outcome.upper():7s} {nodeid} ({secs:.2f} s)" + (f": {reason}" if reason else ""))
        out += [f"    {line}" for line in _LINES.get(nodeid, [])]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(out) + "\n")

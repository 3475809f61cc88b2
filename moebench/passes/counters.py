"""Hardware counters per case: what Nsight Compute measured when a case's launch ran in a
CUDA graph, a bound verdict stated with the numbers that decide it, and the family's work model
checked against the traffic the L2 saw (docs/counters.md: how, what a record gets, the aggregation
over a case's kernels). Torch-free: the run (a child process, moebench.passes.counters_child, under
the tool), the parser and the verdict. The `counters` pass (`Counters`, at the end) calls `collect`
after all timing; the tool is `Ncu` (a test hands in another with its methods).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from moebench.core.family import switch_variables
from moebench.core.passes import AfterAll, Pass, register
from moebench.core.text import PACKAGE_ROOT, one_line
from moebench.sources import arms, plugins

# ----------------------------------------------------------------------------------- metrics

METRICS = (
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy, %
    "sm__maximum_warps_per_active_cycle_pct",  # theoretical occupancy, %
    "launch__occupancy_limit_registers",  # blocks per SM each resource allows
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_warps",
    "launch__waves_per_multiprocessor",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_bytes.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__inst_executed.sum",
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",
)
# Asked for only where `ncu --query-metrics` lists their base name on this GPU (not probed yet):
# thread-level instructions give the active lanes per warp instruction; the L1 requests of global
# reductions (tl.atomic_add with an unused result) and atomics count the count kernel's atomics.
OPTIONAL_METRICS = (
    "smsp__thread_inst_executed.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum",
)

# The kernel the child launches before each case, with grid = case index + 1 (rows after it, up to
# the next marker, are that case's kernels).
MARKER_KERNEL = "_moebench_counters_mark"

# ----------------------------------------------------------------------------------- thresholds
# The verdict, first match wins (docs/counters.md):
# launch-bound: the timed launch is within 2x of an empty kernel replayed the same way: at least half
#   of its time is what launching nothing costs, so no change inside the kernel can buy more than half.
LAUNCH_X = 2.0
# bandwidth-bound: DRAM or L2 throughput at >= 60% of peak (ncu's speed-of-light guidance reads a
#   unit above 60% as the limiter; small kernels rarely pass 80% since ramp-up and tail count).
BANDWIDTH_PCT = 60.0
# compute-bound: SM throughput at >= 60% of peak (the same rule for the SM's pipes and issue).
COMPUTE_PCT = 60.0
# work-bound: >= 3x the warp instructions of the leanest launch of the same shape in this sweep (the
#   same work done, so the extra is loop overhead, idle lanes or CTAs walking empty rows).
WORK_X = 3.0
# latency-bound: nothing above 30% of peak; with achieved occupancy under 25% (16 of 64 warps per
#   SM) too few warps are resident to hide memory latency, else warps are resident but stalled.
LOW_THROUGHPUT_PCT = 30.0
LOW_OCCUPANCY_PCT = 25.0
# work-model check: the L2 saw more than 2x, or under half, the bytes the family's model says.
TRAFFIC_FAR_X = 2.0

# The child under ncu: startup (python, torch, triton) plus a share per case; generous, so a slow
# first compile does not trip it.
TIMEOUT_BASE_S = 180.0
TIMEOUT_PER_CASE_S = 10.0
# graph replays before the profiled one when the run timed warm L2 (its working set L2-resident)
WARM_REPLAYS = 3

# $MOEBENCH_NCU: the tool to run; else `ncu` on PATH, else CUDA's default install
NCU_ENV = "MOEBENCH_NCU"
NCU_DEFAULT = "/usr/local/cuda/bin/ncu"
# $MOEBENCH_COUNTERS_RAW: a folder to keep the tool's raw output in (its CSV, log and the job)
RAW_ENV = "MOEBENCH_COUNTERS_RAW"


# ----------------------------------------------------------------------------------- parsing


@dataclass
class Kernel:
    """One profiled kernel launch: ncu's ID, name and grid, and its metric values (numbers in base
    units: bytes, ns, Hz, %, counts)."""

    id: int
    name: str
    grid: str
    metrics: dict[str, float | None] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.metrics.get(name)

    @property
    def duration_ns(self) -> float:
        return self.metrics.get("gpu__time_duration.sum") or 0.0


# unit prefixes ncu may print when its units are scaled (we ask for base units; a scaled value
# still parses): Kbyte, Mbyte, usecond, msecond, Khz, ...
_SCALE = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def number(text: str, unit: str = "") -> float | None:
    """A metric value as ncu prints it ("12,288", "1,953,097,147.95", "n/a") in base units."""
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        v = float(t)
    except ValueError:
        return None
    u = unit.strip()
    if u in _TIME:
        return v * _TIME[u]
    if len(u) > 1 and u[0] in _SCALE and u[1:].lower() in ("byte", "hz", "inst", "cycle", "sector", "request"):
        return v * _SCALE[u[0]]
    if u.lower().startswith("khz") or u.lower().startswith("mhz") or u.lower().startswith("ghz"):
        return v * _SCALE[u[0].upper()]
    return v


def parse_ncu_csv(text: str) -> list[Kernel]:
    """ncu's `--csv --metrics ...` output (one row per kernel launch and metric, after any
    ==PROF== lines and the program's own output) as kernels in launch order."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",')), None)
    if start is None:
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    head = rows[0]
    col = {h: i for i, h in enumerate(head)}
    kernels: dict[int, Kernel] = {}

    def kernel_of(r: list[str]) -> Kernel | None:
        """The row's kernel launch (made on its first row), or None for a row that is not one."""
        if len(r) != len(head):
            return None
        try:
            kid = int(r[col["ID"]])
        except ValueError:
            return None
        if kid not in kernels:
            kernels[kid] = Kernel(kid, r[col["Kernel Name"]], r[col.get("Grid Size", 0)])
        return kernels[kid]

    if "Metric Name" not in col:
        return []
    for r in rows[1:]:
        k = kernel_of(r)
        if k is not None:
            k.metrics[r[col["Metric Name"]]] = number(r[col["Metric Value"]], r[col["Metric Unit"]]
                                                      if "Metric Unit" in col else "")
    return [kernels[i] for i in sorted(kernels)]


def grid_x(grid: str) -> int | None:
    """The x extent of ncu's "(132, 1, 1)"."""
    m = re.match(r"\(?\s*(\d+)", grid or "")
    return int(m.group(1)) if m else None


def split_cases(kernels: Sequence[Kernel], n_cases: int) -> dict[int, list[Kernel]]:
    """Kernels per case index: each marker (grid = index + 1) opens its case's run of kernels, up to
    the next marker. Kernels before the first marker are not any case's."""
    out: dict[int, list[Kernel]] = {}
    cur = None
    for k in kernels:
        if k.name == MARKER_KERNEL or k.name.startswith(MARKER_KERNEL):
            x = grid_x(k.grid)
            cur = x - 1 if x is not None and 0 < x <= n_cases else None
            if cur is not None:
                out.setdefault(cur, [])
            continue
        if cur is not None:
            out[cur].append(k)
    return out


# ----------------------------------------------------------------------------------- one case


_LIMITS = {"registers": "launch__occupancy_limit_registers", "shared_mem": "launch__occupancy_limit_shared_mem",
           "blocks": "launch__occupancy_limit_blocks", "warps": "launch__occupancy_limit_warps"}
# what each launch limit means, for the limiter
_LIMITER = {"registers": "registers", "shared_mem": "shared memory", "blocks": "blocks per SM",
            "warps": "block size (warps per SM)"}


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def _int(v: float | None) -> int | None:
    return None if v is None else int(round(v))


def aggregate(kernels: Sequence[Kernel]) -> dict[str, Any]:
    """One case's counters from its kernels (docs/counters.md, 'What a record gets', says how they
    combine)."""
    main = max(kernels, key=lambda k: k.duration_ns)
    total_ns = sum(k.duration_ns for k in kernels)

    def total(name: str) -> float | None:
        vals = [k.get(name) for k in kernels if k.get(name) is not None]
        return sum(vals) if vals else None

    def weighted(name: str) -> float | None:
        have = [(k.get(name), k.duration_ns) for k in kernels if k.get(name) is not None]
        if not have:
            return None
        w = sum(d for _, d in have)
        return sum(v * d for v, d in have) / w if w > 0 else sum(v for v, _ in have) / len(have)

    limits = {k: _int(main.get(m)) for k, m in _LIMITS.items()}
    known = {k: v for k, v in limits.items() if v is not None}
    waves = main.get("launch__waves_per_multiprocessor")
    if waves is not None and waves < 1:
        limiter = f"grid: {waves:.2f} waves"
    elif known:
        low = min(known.values())
        limiter = " + ".join(_LIMITER[k] for k, v in known.items() if v == low)
    else:
        limiter = None
    inst = total("smsp__inst_executed.sum")
    tinst = total("smsp__thread_inst_executed.sum")
    red = total("l1tex__t_requests_pipe_lsu_mem_global_op_red.sum")
    atom = total("l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum")
    dram_r, dram_w = total("dram__bytes_read.sum"), total("dram__bytes_write.sum")
    hz = main.get("sm__cycles_elapsed.avg.per_second")
    out = {
        "achieved_occupancy_pct": _r(weighted("sm__warps_active.avg.pct_of_peak_sustained_active")),
        "theoretical_occupancy_pct": _r(main.get("sm__maximum_warps_per_active_cycle_pct")),
        "limiter": limiter,
        "limits_blocks_per_sm": limits,
        "waves": _r(waves, 3),
        "ctas": _int(main.get("launch__grid_size")),
        "block": _int(main.get("launch__block_size")),
        "registers_per_thread": _int(main.get("launch__registers_per_thread")),
        "dram_read_bytes": _int(dram_r),
        "dram_write_bytes": _int(dram_w),
        "dram_pct": _r(weighted("dram__throughput.avg.pct_of_peak_sustained_elapsed")),
        "l2_bytes": _int(total("lts__t_bytes.sum")),
        "l2_hit_pct": _r(weighted("lts__t_sector_hit_rate.pct")),
        "l2_pct": _r(weighted("lts__throughput.avg.pct_of_peak_sustained_elapsed")),
        "sm_pct": _r(weighted("sm__throughput.avg.pct_of_peak_sustained_elapsed")),
        "instructions": _int(inst),
        "active_lanes_pct": _r(100.0 * tinst / (32 * inst)) if tinst is not None and inst else None,
        "atomics": _int((red or 0) + (atom or 0)) if red is not None or atom is not None else None,
        "kernel_us": _r(total_ns / 1e3, 3),
        "sm_mhz": _int(hz / 1e6) if hz else None,
        "kernels": len(kernels),
    }
    if len(kernels) > 1:
        out["kernel_list"] = [{"name": k.name, "us": _r(k.duration_ns / 1e3, 3),
                               "ctas": _int(k.get("launch__grid_size"))} for k in kernels]
    return out


def work_check(counters: Mapping[str, Any], work: Mapping[str, Any]) -> dict[str, Any] | None:
    """The traffic measured against the family's work model (`work.bytes`): the L2 sees every byte
    the SMs read or write past L1 whatever the residency, so it decides the flag; DRAM is shown
    beside it (near zero when a warm working set stays L2-resident)."""
    model = work.get("bytes")
    l2 = counters.get("l2_bytes")
    if not model or l2 is None:
        return None
    dram = (counters.get("dram_read_bytes") or 0) + (counters.get("dram_write_bytes") or 0)
    x = l2 / model
    far = x > TRAFFIC_FAR_X or x < 1 / TRAFFIC_FAR_X
    out = {"model_bytes": int(model), "l2_bytes": int(l2), "dram_bytes": int(dram), "x_model": round(x, 2),
           "dram_x_model": round(dram / model, 2), "far": far}
    if far:
        out["note"] = (f"L2 traffic {scaled(l2, 'B')} is {x:.1f}x the work model's {scaled(model, 'B')} "
                       f"(outside {1 / TRAFFIC_FAR_X:g}x-{TRAFFIC_FAR_X:g}x)")
    return out


def scaled(n: float | None, unit: str = "") -> str:
    """A count with one decimal and a K, M or G prefix ("25.8K"; with a unit, "8.5 KB"); "—" for None."""
    if n is None:
        return "—"
    n = float(n)
    sep = " " if unit else ""
    for prefix, s in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= s:
            return f"{n / s:.1f}{sep}{prefix}{unit}"
    return f"{n:.0f}{sep}{unit}"


def verdict(counters: Mapping[str, Any], work: Mapping[str, Any], x_leanest: float | None) -> dict[str, Any]:
    """What bounds the case, with the numbers that decide it (first match of the order in the
    thresholds above). `x_leanest`: its instructions over the leanest launch of its shape."""
    occ = counters.get("achieved_occupancy_pct")
    dram, l2, sm = (counters.get(k) for k in ("dram_pct", "l2_pct", "sm_pct"))
    x_empty = work.get("x_empty")
    nums = {"x_empty": x_empty, "dram_pct": dram, "l2_pct": l2, "sm_pct": sm, "achieved_occupancy_pct": occ,
            "x_leanest_instructions": x_leanest}
    mem = max((v for v in (dram, l2) if v is not None), default=None)
    top = max((v for v in (dram, l2, sm) if v is not None), default=None)
    if x_empty is not None and x_empty <= LAUNCH_X:
        bound, why = "launch", f"{x_empty:.2f}x the empty-kernel floor (<= {LAUNCH_X:g}x)"
    elif mem is not None and mem >= BANDWIDTH_PCT:
        unit = "DRAM" if dram is not None and dram == mem else "L2"
        bound, why = "bandwidth", f"{unit} throughput {mem:.0f}% of peak (>= {BANDWIDTH_PCT:g}%)"
    elif sm is not None and sm >= COMPUTE_PCT:
        bound, why = "compute", f"SM throughput {sm:.0f}% of peak (>= {COMPUTE_PCT:g}%)"
    elif x_leanest is not None and x_leanest >= WORK_X:
        bound, why = "work", (f"{x_leanest:.1f}x the instructions of the leanest launch of this shape "
                              f"(>= {WORK_X:g}x)")
    elif top is not None and top < LOW_THROUGHPUT_PCT and occ is not None:
        low = occ < LOW_OCCUPANCY_PCT
        bound = "latency"
        why = (f"achieved occupancy {occ:.0f}% ({'<' if low else '>='} {LOW_OCCUPANCY_PCT:g}%) and no unit above "
               f"{top:.1f}% of peak (< {LOW_THROUGHPUT_PCT:g}%): "
               + ("too few warps resident to hide latency" if low else "warps resident but stalled"))
    elif top is not None:
        bound, why = "mixed", (f"busiest unit at {top:.0f}% of peak: between {LOW_THROUGHPUT_PCT:g}% and "
                               f"{BANDWIDTH_PCT:g}%, no single limit")
    else:
        bound, why = "unknown", "no throughput counters for this case"
    return {"bound": bound, "why": why, **{k: v for k, v in nums.items() if v is not None}}


def unavailable(why: str) -> dict[str, str]:
    return {"unavailable": why}


# ----------------------------------------------------------------------------------- the tool


@dataclass
class Profiled:
    """What a tool run gave: the kernels in launch order, or the one line saying why none."""

    kernels: list[Kernel] = field(default_factory=list)
    error: str | None = None
    dropped: list[str] = field(default_factory=list)  # optional metrics this GPU does not list


def find_ncu(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The ncu to run, and where it was looked for."""
    want = (environ.get(NCU_ENV) or "").strip()
    if want:
        p = shutil.which(want) if os.sep not in want else (want if os.access(want, os.X_OK) else None)
        return p, f"${NCU_ENV}={want}"
    p = shutil.which("ncu", path=environ.get("PATH"))
    if p:
        return p, "ncu on PATH"
    if os.access(NCU_DEFAULT, os.X_OK):
        return NCU_DEFAULT, NCU_DEFAULT
    return None, f"ncu on PATH or {NCU_DEFAULT} (or set ${NCU_ENV})"


_PERM = "ERR_NVGPUCTRPERM"
_BAD_METRIC = re.compile(r"(failed to find metric|invalid metric|unknown metric|metric .* not found)", re.I)


class Ncu:
    """Nsight Compute's command line: each kernel replayed per metric pass, graph nodes profiled
    one by one, clocks left alone (--clock-control none: the sweep's timings ran at the clocks the
    driver chose), only inside cudaProfilerStart/Stop (--profile-from-start off)."""

    name = "ncu"

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = dict(os.environ if environ is None else environ)
        self.path, self.looked = find_ncu(self.environ)
        self._version: str | None = None
        self.base_units = True  # --print-units base; dropped if this ncu does not know the option

    def unavailable(self) -> str | None:
        if self.path is None:
            return f"Nsight Compute not found (looked for {self.looked})"
        return None

    def version(self) -> str | None:
        if self._version is None and self.path:
            try:
                p = subprocess.run([self.path, "--version"], capture_output=True, text=True, timeout=60)
                m = re.search(r"Version\s+([\w.]+)", p.stdout + p.stderr)
                self._version = m.group(1) if m else (p.stdout.strip().splitlines() or ["?"])[-1][:80]
            except (OSError, subprocess.SubprocessError) as e:
                self._version = f"? ({e})"
        return self._version

    def known_metrics(self) -> set[str]:
        """Base metric names `ncu --query-metrics` lists for this GPU (empty when it lists none)."""
        try:
            p = subprocess.run([self.path, "--query-metrics"], capture_output=True, text=True, timeout=120,
                               env=self.environ)
        except (OSError, subprocess.SubprocessError):
            return set()
        names = set()
        for ln in p.stdout.splitlines():
            tok = ln.strip().strip('"').split(maxsplit=1)[0].split('"')[0].rstrip(",") if ln.strip() else ""
            if re.fullmatch(r"[a-z0-9]+__[a-z0-9_]+", tok):
                names.add(tok)
        return names

    def command(self, metrics: Sequence[str], l2: str, child: list[str]) -> list[str]:
        return [self.path, "--clock-control", "none", "--graph-profiling", "node", "--profile-from-start", "off",
                "--cache-control", "all" if l2 == "cold" else "none",
                *(["--print-units", "base"] if self.base_units else []), "--csv", "--metrics", ",".join(metrics),
                *child]

    def profile(self, child: list[str], *, l2: str, timeout_s: float, env: Mapping[str, str],
                raw: Path | None = None) -> Profiled:
        known = self.known_metrics()
        optional = [m for m in OPTIONAL_METRICS if m.split(".")[0] in known]
        dropped = [m for m in OPTIONAL_METRICS if m not in optional]
        res = self._run(list(METRICS) + optional, l2, child, timeout_s, env, raw)
        if res.error and not res.kernels and "print-units" in res.error:  # an ncu without it: parse the scaled units
            self.base_units = False
            res = self._run(list(METRICS) + optional, l2, child, timeout_s, env, raw)
        if res.error and optional and _BAD_METRIC.search(res.error):  # listed, yet refused: the core set only
            dropped = list(OPTIONAL_METRICS)
            res = self._run(list(METRICS), l2, child, timeout_s, env, raw)
        res.dropped = dropped
        return res

    def _run(self, metrics: list[str], l2: str, child: list[str], timeout_s: float, env: Mapping[str, str],
             raw: Path | None) -> Profiled:
        cmd = self.command(metrics, l2, child)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=dict(env))
        except subprocess.TimeoutExpired:
            return Profiled(error=f"ncu did not finish within {timeout_s:.0f} s")
        except OSError as e:
            return Profiled(error=f"ncu could not start: {e.strerror or e}")
        if raw is not None:
            raw.mkdir(parents=True, exist_ok=True)
            (raw / "ncu.csv").write_text(p.stdout)
            (raw / "ncu.log").write_text(" ".join(cmd) + f"\nexit {p.returncode}\n" + p.stderr)
        both = p.stdout + "\n" + p.stderr
        if _PERM in both:
            return Profiled(error=f"no permission to read the GPU's performance counters (ncu: {_PERM}); allow "
                                  "them for all users (NVreg_RestrictProfilingToAdminUsers=0) or run as root")
        kernels = parse_ncu_csv(p.stdout)
        if p.returncode != 0 or not kernels:
            errs = [ln.strip() for ln in both.splitlines() if "==ERROR==" in ln]
            tail = errs[-1] if errs else (both.strip().splitlines() or ["no output"])[-1]
            return Profiled(kernels, error=f"ncu exited {p.returncode} with no profiled kernels: {tail[:240]}"
                            if not kernels else f"ncu exited {p.returncode}: {tail[:240]}")
        return Profiled(kernels)


# ----------------------------------------------------------------------------------- the pass's work


def why_unavailable(device, tool: Ncu) -> str | None:
    """One line saying what is missing for counters here, or None."""
    if getattr(device, "backend", None) != "cuda":
        return ("no CUDA device (this run used the Triton interpreter on the CPU); counters need an NVIDIA GPU "
                "and Nsight Compute")
    return tool.unavailable()


def job_document(spec, cases: Sequence[Any], records: Sequence[Any], *, plugins: Sequence[str] = (),
                 warm_replays: int, manifest: str, environ: Mapping[str, str] | None = None) -> dict:
    """The child's job, as data: the spec's path, the plugin files to load, the run's kill-switch
    variables (the child resolves with them, never with its own environment), and per case its
    id, variant, label, parameters and the launch values its record ran with."""
    by_id = {r.case_id: r for r in records}
    environ = environ or {}
    return {
        "spec": str(spec.path),
        "plugins": list(plugins),
        "arms": arms.loaded(),  # the kernel sources of `moebench pr`'s arms (moebench.sources.arms)
        "environ": {k: environ[k] for k in sorted(switch_variables()) if k in environ},
        "warm_replays": warm_replays,
        "manifest": manifest,
        "cases": [{"id": c.id, "variant": c.variant, "label": c.label, "params": dict(c.params),
                   "launch": dict(by_id[c.id].launch)} for c in cases],
    }


def child_command(job: Path) -> list[str]:
    return [sys.executable, "-m", "moebench.passes.counters_child", str(job)]


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the run's, this moebench first on its path, no interpreter."""
    env = dict(environ)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TRITON_INTERPRET", None)
    return env


def collect(spec, device, cases: Sequence[Any], records: Sequence[Any], *, l2: str = "warm",
            tool: Ncu | None = None, environ: Mapping[str, str] | None = None,
            plugins: Sequence[str] = ()) -> None:
    """Counters for every timed ok record (docs/counters.md), set on `record.cross`: `counters`,
    `verdict`, `work_check`; or `counters = {"unavailable": why}` on each when they cannot be had."""
    environ = dict(os.environ if environ is None else environ)
    todo = [r for r in records if r.status == "ok"]
    if not todo:
        return
    tool = tool if tool is not None else Ncu(environ)
    why = why_unavailable(device, tool)
    if why:
        for r in todo:
            r.cross["counters"] = unavailable(why)
        return
    by_id = {c.id: c for c in cases}
    run = [by_id[r.case_id] for r in todo if r.case_id in by_id and r.timing.get("median_us") is not None]
    raw_dir = (environ.get(RAW_ENV) or "").strip()
    with tempfile.TemporaryDirectory(prefix="moebench-counters-") as tmp:
        job = Path(tmp) / "job.json"
        manifest = Path(tmp) / "manifest.json"
        doc = job_document(spec, run, todo, plugins=plugins, warm_replays=WARM_REPLAYS if l2 == "warm" else 0,
                           manifest=str(manifest), environ=environ)
        job.write_text(json.dumps(doc, default=str))
        raw = Path(raw_dir) / spec.name if raw_dir else None
        if raw is not None:
            raw.mkdir(parents=True, exist_ok=True)
            (raw / "job.json").write_text(json.dumps(doc, indent=1, default=str))
        got = tool.profile(child_command(job), l2=l2, timeout_s=TIMEOUT_BASE_S + TIMEOUT_PER_CASE_S * len(run),
                           env=child_env(environ), raw=raw)
        launched = _read_manifest(manifest)
    attach(spec, run, todo, got, launched, tool_name=tool.name, tool_version=tool.version(), l2=l2)


def _read_manifest(path: Path) -> dict[str, str | None]:
    """Case id -> None (launched) or the child's one-line error; empty when the child wrote none."""
    try:
        doc = json.loads(path.read_text())
        return {e["id"]: e.get("error") for e in doc.get("cases", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def attach(spec, run: Sequence[Any], records: Sequence[Any], got: Profiled, launched: Mapping[str, str | None], *,
           tool_name: str, tool_version: str | None, l2: str) -> None:
    """Kernels -> per-case counters, then the verdicts (which compare cases of a shape)."""
    by_case = split_cases(got.kernels, len(run))
    rec_of = {r.case_id: r for r in records}
    done = []
    for i, case in enumerate(run):
        rec = rec_of[case.id]
        ks = by_case.get(i)
        if ks:
            c = aggregate(ks)
            c.update({"tool": tool_name, "tool_version": tool_version,
                      "cache_control": "all (flushed before each pass)" if l2 == "cold" else "none (warm L2)"})
            if got.dropped:
                c["metrics_missing"] = list(got.dropped)
            rec.cross["counters"] = c
            chk = work_check(c, rec.work)
            if chk is not None:
                rec.cross["work_check"] = chk
            done.append(rec)
        else:
            child_err = launched.get(case.id)
            why = (f"the counters child could not run this case: {child_err}" if child_err else
                   got.error or ("the profiler saw this case's marker but no kernel after it" if i in by_case
                                 else "the profiler saw no kernel of this case"))
            rec.cross["counters"] = unavailable(why)
    for r in records:  # not run: untimed (no timing to read the counters against)
        if "counters" not in r.cross:
            r.cross["counters"] = unavailable(got.error or "no timing for this case")
    shape = tuple(getattr(spec.family, "shape_params", ()) or ())
    keyed = [(r, tuple(r.params.get(k) for k in shape), r.cross["counters"].get("instructions")) for r in done]
    leanest: dict[tuple, int] = {}
    for _, key, n in keyed:
        if n:
            leanest[key] = min(n, leanest.get(key, n))
    for r, key, n in keyed:
        low = leanest.get(key)
        x = round(n / low, 2) if n and low else None
        r.cross["verdict"] = verdict(r.cross["counters"], r.work, x)


def note(records: Sequence[Any]) -> str | None:
    """One line for the terminal when the counters were not had: what is missing."""
    whys = [r.cross["counters"]["unavailable"] for r in records
            if isinstance(r.cross.get("counters"), dict) and "unavailable" in r.cross["counters"]]
    if not whys:
        return None
    n = len(whys)
    first = max(set(whys), key=whys.count)
    return f"counters: unavailable for {n} case(s): {first}"


# ----------------------------------------------------------------------------------- the pass


@register
class Counters(Pass):
    """Hardware counters per case: after all timing, a child process under
    Nsight Compute re-creates the timed cases from data, replays each one's launch once in a CUDA
    graph, and each record gets its measured occupancy, traffic, instructions, a bound verdict and
    the work-model check. It never touches the timings (they are done, and the child is another
    process). Where counters cannot be had (the interpreter, no ncu, no counter permission) every
    record says so in one line and the run goes on: the pass is not refused on the CPU."""

    name = "counters"
    cuda_only = False  # unavailable, not refused: the columns say what is missing
    in_workers = True  # its after_all runs in the driver's process and needs nothing a worker kept
    announce = "counters pass (Nsight Compute: one graph replay per case, in a child process)"

    def after_all(self, ctx: AfterAll) -> None:
        try:
            collect(ctx.spec, ctx.device, ctx.cases, ctx.records, l2=getattr(ctx.options.timing, "l2", "warm"),
                    environ=ctx.environ, plugins=[p["path"] for p in plugins.loaded() if "suffix" not in p])
        except Exception as e:  # noqa: BLE001 - the timings stand; every record says what went wrong
            for rec in ctx.records:
                if rec.status == "ok" and "verdict" not in rec.cross:
                    rec.cross["counters"] = {"unavailable": f"the counters pass failed: {type(e).__name__}: "
                                                            f"{one_line(e)}"}

"""The session: the one place that joins spec, cases, kernel families, timer and records.

    case -> resolve launch -> inputs -> variant closure -> reset/poison -> run once -> verify
         -> time -> Record

`sweep`, `verify`, `ab`, `--resume` and the per-GPU workers all call it (`Session.run`, or
`Session.run_case` one case at a time); nothing else joins these parts. It never prints: `run`
yields events (a case started, a clock drop made it re-time a case, a case finished with its
record), and the CLI formats them. A case that fails is recorded with its error and the run
goes on; a case whose kernel source is missing (an upstream kernel not installed here) is
recorded as `unavailable` with what to install.

Each launch value is resolved once, in `resolve`: the spec's value, a kill-switch variable
(MCORE_COUNT_TOKENS_BLOCK, MCORE_MOE_ACTIVATION_GRID_CAP) or its shipped default, the SM count
for a grid of 0. The record carries the value in `launch` and where it came from in
`launch_from`; every reader uses that field.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import traceback
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from moebench.core.cases import Case, baseline_case, shape_key
from moebench.core.device import DeviceInfo, nvml_clocks
from moebench.core.records import Record
from moebench.core.spec import Spec, Timing
from moebench.core.stats import between_groups_rel, mean, median, noise_below, summarize
from moebench.errors import BackendError, Unavailable
from moebench.families import Check

CROSS_CHECKS = ("dobench", "nvbench", "profiler")


def cross_check_problem(cross: tuple[str, ...]) -> str | None:
    """One line saying why a requested cross-check cannot run here, or None."""
    if "nvbench" in cross:
        from moebench.core.timing import nvbench_unavailable

        why = nvbench_unavailable()
        if why:
            return (f"--cross-check nvbench: cuda.bench is not importable here ({why}); install it with "
                    "pip install 'moebench[nvbench]' (the cuda-bench wheel, and a cuda-bindings of your CUDA major)")
    return None


def check_cross_checks(cross: tuple[str, ...]) -> None:
    problem = cross_check_problem(cross)
    if problem:
        raise BackendError(problem)


# Background input building (untimed runs only: `verify`, interpreter runs). Workers: half the
# cores, at most 8 (torch's own CPU kernels already use several threads each); $MOEBENCH_PREFETCH
# sets the number, 0 turns it off. Each worker keeps two shapes in flight.
PREFETCH_MAX_WORKERS = 8
PREFETCH_DEPTH_PER_WORKER = 2
# A timed run builds every shape's input sets before its first case, in parallel, when they fit
# together in this much memory (4 GiB, and a quarter of what is free): count-block's take 16 MiB,
# act-grid's about 1 GiB. Otherwise each shape is built when its first case comes, as before.
PREBUILD_MAX_BYTES = 4 << 30
PREBUILD_FREE_SHARE = 0.25


@dataclass
class Options:
    timing: Timing
    time_it: bool = True  # False: correctness only (interpreter, or `verify`)
    cross: tuple[str, ...] = ()
    ceilings: dict[str, Any] = field(default_factory=dict)
    traceback: bool = False  # keep the traceback in a failed record's error
    # under the interpreter, a case still running after this many seconds is stopped and recorded as
    # an error (a grid of a million programs runs one program at a time there); None: no limit
    case_limit_s: float | None = None


# ----------------------------------------------------------------------------------- events


@dataclass
class Started:
    case: Case
    index: int
    total: int


@dataclass
class Retimed:
    """A case's SM clock ended below timing.clock_drop of the maximum: it is timed again."""

    case: Case
    attempt: int
    sm_mhz: int | None


@dataclass
class Finished:
    record: Record
    index: int
    total: int


# ----------------------------------------------------------------------------------- resolving


def resolve(spec: Spec, case: Case, device: DeviceInfo, environ: Mapping[str, str]) -> tuple[dict, dict]:
    """The parameters a case's kernel runs with, and where each launch value came from
    (FamilySpec.resolve)."""
    return spec.family.resolve(case.variant, case.params, device, environ, case.origins)


def check_environment(spec: Spec, cases: list[Case], device: DeviceInfo, environ: Mapping[str, str]) -> None:
    """Resolve one case of each variant (and the baseline launch) up front, so a malformed
    kill-switch variable stops a run before its first case (UsageError naming the variable and
    its accepted values), not as a failure in every case. Every switch of the family is checked,
    read by this run's variants or not: each is part of the settings a record is resumed under.
    Torch-free: it only resolves."""
    seen = set()
    for c in cases:
        if c.variant not in seen:
            seen.add(c.variant)
            resolve(spec, c, device, environ)
    if spec.baseline and cases:
        resolve(spec, baseline_case(spec, cases[0]), device, environ)
    for v in spec.family.variants.values():
        if v.env and v.name not in seen and cases:
            spec.family.resolve(v.name, dict(cases[0].params), device, environ)


class CaseTimeLimit(Exception):
    """A case ran past Options.case_limit_s under the interpreter."""


@contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise CaseTimeLimit in this (main) thread once `seconds` have passed, and every second after
    that in case something swallowed the first one; a no-op without a limit or off the main thread."""
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(_signum, _frame):
        raise CaseTimeLimit(f"still running after {seconds:g} s under the Triton interpreter (--case-limit); "
                            "shrink the shape or raise the limit")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ----------------------------------------------------------------------------------- the session


class Session:
    def __init__(self, spec: Spec, device: DeviceInfo, options: Options, environ: Mapping[str, str] | None = None):
        self.spec = spec
        self.fam = spec.family
        self.device = device
        self.opts = options
        self.environ = os.environ if environ is None else environ
        self.torch_device = "cuda" if device.backend == "cuda" else "cpu"
        self.impl = None if self.fam.host_only else self.fam.load()
        self._inputs: dict[tuple, list] = {}  # shape key -> input sets
        self._pools: dict[tuple, list] = {}  # shape key -> the memory pools of those sets (private placements)
        self._ref: dict[tuple, Any] = {}
        self._base: dict[tuple, Any] = {}
        self._ahead: dict[tuple, Any] = {}  # shape key -> Future of (sets, pools, reference), built in the background
        self._compiled: set[tuple] = set()
        self.compile_s_total = 0.0
        self.clock_index = 0  # NVML's number for this GPU (a per-GPU worker sets its own)
        self._events: list = []
        self._kept: dict[str, dict] = {}  # case id -> timed graphs and what they read, for the nvbench pass
        self._profiled: dict[str, tuple] = {}  # case id -> group 0's closures and copies, for the profiler pass
        self.phases: dict[str, float] = defaultdict(float)  # wall seconds per phase of the cases
        self._phase_lock = threading.Lock()
        if device.backend == "interpret":
            from moebench.core.device import interpreter_without_discarded_checks

            interpreter_without_discarded_checks()

    @property
    def jit_specializations(self) -> int:
        return len(self._compiled)

    def check_environment(self, cases: list[Case]) -> None:
        check_environment(self.spec, cases, self.device, self.environ)

    # ------------------------------------------------------------------ running

    def run(self, cases: list[Case]) -> Iterator[Started | Retimed | Finished]:
        """Run cases in order, yielding events; a KeyboardInterrupt propagates between cases
        (every Finished record before it has been yielded).

        An untimed run (verify, the interpreter) builds the inputs and references of the next
        shapes on background threads while the current case runs, and forgets a shape's inputs,
        reference and baseline output after its last case. A timed run on a GPU builds every
        shape's inputs in parallel before its first case, where they fit in memory together."""
        n = len(cases)
        untimed = not self.opts.time_it and not self.fam.host_only
        last = {}
        if untimed:
            for i, c in enumerate(cases):
                last[shape_key(c, self.fam.shape_params)] = i
        ahead = None
        if prefetch_workers() and not self.fam.host_only and (untimed or self._prebuild_fits(cases)):
            ahead = _Ahead(self, cases)
            if not untimed:
                with self._phase("inputs + reference (built before timing, in parallel)"):
                    ahead.build_all()
        try:
            for i, case in enumerate(cases):
                if ahead is not None:
                    ahead.feed(i)
                yield Started(case, i, n)
                rec = self.run_case(case)
                yield from self._events
                self._events.clear()
                if untimed:
                    key = shape_key(case, self.fam.shape_params)
                    if last.get(key) == i:
                        self._forget(key)
                yield Finished(rec, i, n)
        finally:
            if ahead is not None:
                ahead.close()

    def _prebuild_fits(self, cases: list[Case]) -> bool:
        """Whether every shape's timing input sets together fit the prebuild budget (a share of the
        free device memory), so a timed run can build them all up front."""
        if self.torch_device != "cuda":
            return False
        import torch

        need, seen = 0, set()
        for c in cases:
            key = shape_key(c, self.fam.shape_params)
            if key not in seen:
                seen.add(key)
                need += self.impl.input_bytes(c.params) * self._n_sets(c.params)
        free, _ = torch.cuda.mem_get_info()
        return need <= min(PREBUILD_MAX_BYTES, PREBUILD_FREE_SHARE * free)

    def run_case(self, case: Case) -> Record:
        rec = Record(self.spec.name, self.fam.name, case.id, case.variant, case.label, "ok",
                     params={k: v for k, v in case.params.items()})
        try:
            params, sources = resolve(self.spec, case, self.device, self.environ)
            rec.launch = {k: params[k] for k in sources}
            rec.launch_from = sources
            if self.fam.host_only:
                rec.work = self.fam.builder(case.variant)(params)
                return rec
            with _time_limit(self.opts.case_limit_s if self.device.backend == "interpret" else None):
                self._kernel_case(case, params, rec)
        except KeyboardInterrupt:
            raise
        except Unavailable as e:
            rec.status = "unavailable"
            rec.error = str(e)
        except Exception as e:  # noqa: BLE001 - a failing case is recorded; the sweep goes on
            rec.status = "error"
            rec.error = f"{type(e).__name__}: {_one_line(e)}"
            while e is not None and not isinstance(e, CaseTimeLimit):  # the interpreter wraps what it met
                e = e.__cause__ or e.__context__
            if e is not None:
                rec.error = f"{type(e).__name__}: {_one_line(e)}"
            if self.opts.traceback:
                rec.error += "\n" + traceback.format_exc()
        return rec

    # ------------------------------------------------------------------ inputs & references

    def _n_sets(self, params: dict) -> int:
        """How many independently allocated input/output sets the graph rotates through.

        cold: enough sets that their total exceeds `cold_l2_multiple` x L2, so each launch reads
        from DRAM. warm: `placements` sets (default 8) as long as they all stay L2-resident. The
        warm rotation exists because a tiny output (32 int32 counters = one 128-byte line) lives
        in one L2 slice, and which slice a process's allocation maps to moves a launch-bound
        atomic kernel by up to ~30% from run to run on an H200; rotating several placements
        averages that out inside every graph."""
        t = self.opts.timing
        if not self.opts.time_it or not self.device.l2_bytes:
            return 1
        touched = getattr(self.impl, "touched_bytes", self.impl.input_bytes)
        per = max(1, touched(params))
        if t.l2 == "cold":
            return max(2, min(512, math.ceil(t.cold_l2_multiple * self.device.l2_bytes / per)))
        return max(1, min(t.placements, (self.device.l2_bytes // 2) // per))

    def inputs(self, case: Case) -> list:
        key = shape_key(case, self.fam.shape_params)
        n = self._n_sets(case.params)
        have = self._inputs.get(key)
        if (have is None or len(have) < n) and key in self._ahead:
            sets, pools, ref = self._ahead.pop(key).result()  # (the caller's "inputs" phase holds the wait)
            self._keep_inputs(key, sets, pools)
            if ref is not None:
                self._ref.setdefault(key, ref)
            have = sets
        if have is None or len(have) < n:
            sets, pools = self._build_sets(case, n)
            self._keep_inputs(key, sets, pools)
        return self._inputs[key][:n]

    def _keep_inputs(self, key: tuple, sets: list, pools: list) -> None:
        if len(self._inputs) > 4:  # keep memory bounded: inputs are rebuilt on demand
            self._inputs.clear()
            self._pools.clear()
        self._inputs[key] = sets
        self._pools[key] = pools

    def _build_sets(self, case: Case, n: int) -> tuple[list, list]:
        """`n` input sets of a case's shape, each in its own memory pool with private placements."""
        self._check_memory(case, n)
        sets, pools = [], []
        for i in range(n):
            with self._placement(i) as pool:
                sets.append(self.impl.build_inputs(case.params, self.torch_device, i))
            pools.append(pool)
        return sets, pools

    def _build_shape(self, case: Case) -> tuple[list, list, Any]:
        """A shape's input sets and its reference, for the background (see _Ahead)."""
        with self._phase("inputs + reference (background threads)"):
            sets, pools = self._build_sets(case, self._n_sets(case.params))
            if self.fam.reference_after_build:
                return sets, pools, None
            return sets, pools, self.impl.reference(sets[0], case.params)

    def _forget(self, key: tuple) -> None:
        for d in (self._inputs, self._pools, self._ref, self._base):
            d.pop(key, None)

    @contextmanager
    def _placement(self, index: int = 0):
        """Where the next allocations go: torch's caching allocator, or (timing.placement_memory:
        private, on a GPU) a memory pool of their own, yielded so the caller keeps it alive as
        long as its tensors."""
        # untimed (verify): placements do not matter, and a pool used from the background threads
        # that build verify's inputs trips torch's allocator when the pools are freed (an H200,
        # torch 2.11: "captures_underway.empty() INTERNAL ASSERT FAILED" at exit)
        if self.opts.timing.placement_memory != "private" or self.torch_device != "cuda" or not self.opts.time_it:
            yield None
            return
        import torch

        if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
            raise RuntimeError("timing.placement_memory: private needs torch.cuda.MemPool (torch >= 2.6)")
        t = self.opts.timing
        k = index % max(1, t.placement_strata)
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            # the pad takes the front of the pool's first (2 MiB) segment; the set's small buffers
            # follow it, k strides further on than in an unpadded pool (timing.placement_strata)
            pad = torch.empty(k * t.placement_stride, dtype=torch.uint8, device="cuda") if k and t.placement_stride else None
            yield pool if pad is None else (pool, pad)

    def _copy_set(self, inp, index: int) -> tuple[Any, Any]:
        """A copy of an input set in fresh memory (views kept as views): the same data at another
        placement, the `index`-th of its rotation. Returns (copy, its pool or None)."""
        import copy

        with self._placement(index) as pool:
            return copy.deepcopy(inp), pool

    @contextmanager
    def _phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            with self._phase_lock:
                self.phases[name] += dt

    def _check_memory(self, case: Case, n_sets: int) -> None:
        """Refuse a case whose inputs would not fit, before allocating anything."""
        need = self.impl.input_bytes(case.params) * n_sets
        if self.torch_device == "cuda":
            import torch

            free, _ = torch.cuda.mem_get_info()
            where = self.device.name
        else:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            where = "this host (interpreter run)"
        if need > 0.8 * free:
            raise MemoryError(f"would not fit: needs ~{need / 2**30:.2f} GiB of inputs, {free / 2**30:.2f} GiB "
                              f"free on {where}; shrink the shape")

    def reference(self, case: Case, inp) -> Any:
        key = shape_key(case, self.fam.shape_params)
        if key not in self._ref:
            self._ref[key] = self.impl.reference(inp, case.params)
        return self._ref[key]

    def baseline_output(self, case: Case, inp) -> Any:
        """Output of the spec's baseline launch on the same inputs (run once per shape)."""
        key = shape_key(case, self.fam.shape_params)
        if key not in self._base:
            base = baseline_case(self.spec, case)
            params, _ = resolve(self.spec, base, self.device, self.environ)
            built = self.fam.builder(base.variant)(inp, params, self.device)
            self._first_launch(built)
            self._base[key] = built.output.clone()
        return self._base[key]

    # ------------------------------------------------------------------ launching

    def _sync(self) -> None:
        if self.torch_device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _first_launch(self, built) -> float | None:
        """Reset and run once: the launch whose output is checked, and the one that compiles a new
        JIT specialization, so compiling stays out of any timing. Returns the seconds of this
        launch when Triton prepared a new specialization in it (compile time plus one run of the
        kernel), else None. Triton says which (moebench.core.tritonpatch.specializations)."""
        from moebench.core.tritonpatch import specializations

        built.reset()
        with specializations() as new:
            t0 = time.perf_counter()
            built.launch()
            self._sync()
            dt = time.perf_counter() - t0
        if new:
            self._compiled.update(new)
            self.compile_s_total += dt
            return dt
        return None

    # ------------------------------------------------------------------ one case

    def _kernel_case(self, case: Case, params: dict, rec: Record) -> None:
        builder = self.fam.builder(case.variant)
        with self._phase("inputs"):
            sets = self.inputs(case)
        inp = sets[0]
        with self._phase("build closures"):
            built = builder(inp, params, self.device)
        # after the build: a family's reference may read what its builder prepared (the layer's
        # activation-alone scope reads the FC1 output the step wrote)
        with self._phase("reference"):
            expected = self.reference(case, inp)
        rec.launch.update(built.geometry)
        rec.launch_from.update(built.launch_from)
        inexact = built.inexact  # why this launch cannot equal the baseline bit for bit

        # checked launch: reset/poison, one launch (it also compiles, outside any timing), then
        # compare to torch, right away (the guard cells are the variant's alone), and to the
        # baseline launch on the same inputs (which reuses them, so the output is copied first)
        with self._phase("compile + checked launch"):
            compile_s = self._first_launch(built)
        rec.timing["compile_s"] = round(compile_s, 4) if compile_s is not None else None
        with self._phase("check"):
            out = built.output
            chk: Check = self.impl.check(inp, out, expected, case.params)
            rec.checks["ref_check"] = chk.detail
            vacuity = self.impl.nonvacuity(inp, out, case.params)
        if self.spec.baseline and not inexact:
            import torch

            mine = out.clone()
            with self._phase("baseline launch"):
                base = self.baseline_output(case, inp)
            with self._phase("check"):
                rec.checks["baseline_equal"] = bool(torch.equal(mine, base))
        elif inexact:
            rec.checks["baseline_equal"] = None
            rec.checks["baseline_skipped"] = inexact
        rec.checks.update(vacuity)
        if not chk.ok or rec.checks.get("baseline_equal") is False:
            rec.status = "mismatch"
            rec.error = chk.detail if not chk.ok else "differs from the baseline launch (torch.equal)"

        rec.work = self.fam.work_model(case.variant, self.impl)(case.params, built.geometry, self.device)
        self._occupancy(rec.work)
        if not self.opts.time_it:
            return
        with self._phase("placement copies"):
            copies = self._placement_copies(case, sets)
        rotation = sets + [c for c, _ in copies]
        with self._phase("build closures"):
            builts = [built] + [builder(s, params, self.device) for s in rotation[1:]]
        with self._phase("timing"):
            self._time(case, rec, builts, lambda inp_: builder(inp_, params, self.device), rotation, copies)

    def _placement_copies(self, case: Case, sets: list) -> list:
        """timing.placement_copies - 1 copies of every warm set in fresh memory, (copy, pool) each,
        as many as keep the whole rotation inside half the L2 (the warm budget)."""
        t = self.opts.timing
        if t.placement_copies <= 1 or t.l2 != "warm" or not self.device.l2_bytes:
            return []
        touched = getattr(self.impl, "touched_bytes", self.impl.input_bytes)
        fit = (self.device.l2_bytes // 2) // max(1, touched(case.params))
        per_set = max(1, min(t.placement_copies, fit // max(1, len(sets))))
        copies = [s for s in sets for _ in range(per_set - 1)]
        return [self._copy_set(s, len(sets) + j) for j, s in enumerate(copies)]

    def _occupancy(self, w: dict) -> None:
        d = self.device
        if "ctas" in w and "threads_per_cta" in w:
            cap = d.sm_count * d.max_threads_per_sm
            w["thread_capacity"] = cap
            w["occupancy_pct"] = round(100.0 * min(cap, w["ctas"] * w["threads_per_cta"]) / cap, 1)
            per_wave = d.sm_count * max(1, d.max_threads_per_sm // w["threads_per_cta"])
            w["waves"] = round(w["ctas"] / per_wave, 2)

    def launches_per_graph(self, case: Case) -> int:
        """The spec's launches per graph, or fewer where the family says one launch is long (a
        whole layer step): a replay of many such launches would take seconds."""
        n = self.opts.timing.launches_per_graph
        if self.fam.graph_launches is not None:
            n = max(1, min(n, self.fam.graph_launches(case.params, n)))
        return n

    def _time(self, case: Case, rec: Record, builts: list, rebuild=None, sets: list | None = None,
              held: list | None = None) -> None:
        """Time a case: one graph over the rotation of `builts` (timing.groups 1), or one graph per
        placement group, group g > 0 over fresh copies of `sets` (the inputs of `builts`) with
        closures from `rebuild`. `held`: copies group 0 reads, kept alive with its graph."""
        from moebench.core.timing import time_groups

        t = self.opts.timing
        g_min = max(1, t.groups)
        # one group is the single-graph timer: no interval between groups to grow it by
        g_max = max(g_min, t.max_groups or g_min) if g_min > 1 else 1
        keep = "nvbench" in self.opts.cross
        copies: list = list(held or [])  # the copies (and pools) the graphs read: alive while they are

        def make_group(g: int) -> list:
            if g == 0:
                return [b.launch for b in builts]
            made = [self._copy_set(s, i) for i, s in enumerate(sets)]
            copies.append(made)
            return [rebuild(c).launch for c, _ in made]

        def enough(groups: list[list[float]]) -> bool:
            return between_groups_rel([median(x) for x in groups]) < t.groups_rel_noise

        retimed = 0
        while True:
            clk0 = nvml_clocks(self.clock_index)
            samples = time_groups(make_group, min_groups=g_min, max_groups=g_max,
                                  launches_per_graph=self.launches_per_graph(case), warmup=t.warmup,
                                  min_replays=t.min_replays, max_replays=t.max_replays, max_seconds=t.max_seconds,
                                  stop=noise_below(t.target_rel_noise), enough=enough if g_max > g_min else None,
                                  keep=keep)
            clk1 = nvml_clocks(self.clock_index)
            dropped = (clk1.get("sm_max_mhz") and clk1.get("sm_mhz") is not None
                       and clk1["sm_mhz"] < t.clock_drop * clk1["sm_max_mhz"])
            if not dropped or retimed >= t.clock_retries:
                break
            retimed += 1
            self._events.append(Retimed(case, retimed, clk1.get("sm_mhz")))
            time.sleep(1.0)  # let the clock recover, then time the case again
        if retimed:
            rec.timing["clock_retimed"] = retimed
        s = summarize(samples.per_launch_us)
        estimate, rel_noise = s.median_us, s.rel_noise
        n_groups = len(samples.groups)
        l2_note = f"{t.l2} ({len(builts)} set{'s' if len(builts) > 1 else ''})"
        if n_groups > 1 or t.placement_memory != "caching" or held:
            l2_note = (f"{t.l2} ({len(builts)} placement{'s' if len(builts) > 1 else ''}"
                       + (f" x {n_groups} groups" if n_groups > 1 else "") + f", {t.placement_memory} memory)")
        rec.timing.update({"timer": "graph-replay", "l2": l2_note})
        if n_groups > 1:
            meds = [median(g) for g in samples.groups]
            between = between_groups_rel(meds)
            estimate, rel_noise = mean(meds), max(between, s.rel_noise)
        within, rel_noise = rel_noise, math.hypot(rel_noise, t.rerun_rel)
        rec.timing.update({
            "median_us": round(estimate, 4),
            "min_us": round(s.min_us, 4), "max_us": round(s.max_us, 4), "q1_us": round(s.q1_us, 4),
            "q3_us": round(s.q3_us, 4), "iqr_us": round(s.iqr_us, 4), "rel_noise": round(rel_noise, 5),
            "rel_noise_within": round(within, 5), "rerun_rel": t.rerun_rel,
            "n_replays": s.n, "launches_per_graph": samples.launches_per_graph,
            "stopped_by": samples.stopped_by, "timing_wall_s": round(samples.wall_s, 3),
            "sm_clock_start_mhz": clk0["sm_mhz"], "sm_clock_end_mhz": clk1["sm_mhz"],
        })
        if n_groups > 1:
            rec.timing.update({"estimator": "mean of group medians", "groups": n_groups,
                               "group_medians_us": [round(m, 4) for m in meds],
                               "between_groups_rel": round(between, 5)})
        mx = clk1.get("sm_max_mhz")
        if mx and clk1["sm_mhz"] is not None:
            rec.timing["clock_ok"] = clk1["sm_mhz"] >= t.clock_drop * mx
        self._floors(rec, estimate, builts)
        self._cross(rec, builts)
        if "profiler" in self.opts.cross:
            # the profiler pass profiles the placements group 0 timed (its closures and copies)
            self._profiled[case.id] = ([b.launch for b in builts], list(held or []))
        if keep:
            del copies[len(held or []) + len(samples.graphs) - 1:]  # those of the graphs not kept
            key = shape_key(case, self.fam.shape_params)
            self._kept[case.id] = {"graphs": samples.graphs, "builts": builts, "copies": copies,
                                   "pools": self._pools.get(key), "launches": samples.launches_per_graph}

    def _floors(self, rec: Record, median_us: float, builts: list) -> None:
        c = self.opts.ceilings
        w = rec.work
        if not c:
            return
        nbytes = w.get("bytes")
        if nbytes:
            # warm: read against the L2 copy ceiling when the whole rotation fits in L2, else DRAM
            sets = len(builts)
            fits = self.opts.timing.l2 == "warm" and self.device.l2_bytes and nbytes * sets <= self.device.l2_bytes
            level = "l2" if fits else "dram"
            bw = c.get(f"copy_{level}_gbps")
            w["gbps"] = round(nbytes / (median_us * 1e-6) / 1e9, 1)
            if bw:
                w["floor_level"] = level
                w["floor_us"] = round(nbytes / (bw * 1e9) * 1e6, 4)
                w["x_floor"] = round(median_us / w["floor_us"], 2) if w["floor_us"] > 0 else None
                if level == "l2" and c.get("copy_dram_gbps"):
                    w["dram_floor_us"] = round(nbytes / (c["copy_dram_gbps"] * 1e9) * 1e6, 4)
                if w["x_floor"] is not None and w["x_floor"] < 1:
                    w["floor_note"] = (f"below the {level.upper()} copy floor: {nbytes * sets / 2**20:.0f} MiB "
                                       f"touched per rotation vs {self.device.l2_bytes / 2**20:.0f} MiB L2, so part "
                                       "of it stays L2-resident across warm replays")
        empty = c.get("empty_sms_us") if w.get("ctas", 1) > 1 else c.get("empty_us")
        if empty:
            w["empty_us"] = round(empty, 4)
            w["x_empty"] = round(median_us / empty, 2)
            w["over_empty_us"] = round(median_us - empty, 4)
            if w.get("floor_us"):
                # a launch cannot beat its own empty launch: the floor a small kernel can reach
                # is an empty kernel plus its bytes at the copy ceiling
                w["floor_plus_empty_us"] = round(w["floor_us"] + empty, 4)
                w["x_floor_plus_empty"] = round(median_us / w["floor_plus_empty_us"], 2)

    def _cross(self, rec: Record, builts: list) -> None:
        """triton's do_bench_cudagraph on the same closures, right after our own timing. The
        profiler pass runs later, after every case (`profile_pass`): once the PyTorch profiler
        (CUPTI) has been started in a process, do_bench_cudagraph read up to ~20% high on
        the H200 in every later case, while the first case, timed before any profiling, agreed
        within 0.3% (results/h200/TIMER.md)."""
        if "dobench" not in self.opts.cross:
            return
        from moebench.core.timing import dobench_cudagraph_us

        fns = [b.launch for b in builts]

        def all_sets():  # the same rotation as the timed graph: one call launches every set once
            for f in fns:
                f()

        try:
            v = dobench_cudagraph_us(all_sets) / len(fns)
            # against the same placements: with placement groups, group 0's median
            mine = _group_medians(rec)[0]
            rec.cross["dobench_us"] = round(v, 4)
            rec.cross["dobench_delta_pct"] = round(100 * (mine - v) / v, 2)
        except Exception as e:  # noqa: BLE001 - a failed cross-check is noted, the timing stands
            rec.cross["cross_error"] = _one_line(e)

    def nvbench_pass(self, records: list[Record]) -> None:
        """nvbench times every timed case's own graph (kept from `_time`, over the same buffers),
        with its own cold and batch measurements and its own stopping rule, in one run (cuda.bench
        runs its benchmarks once per process), after all timing and before any profiling. Each
        record gets nvbench's per-launch times and their difference to moebench's number."""
        if "nvbench" not in self.opts.cross or not self.opts.time_it:
            return
        import torch

        from moebench.core.timing import NvbenchItem, nvbench_graphs

        todo = [(r, self._kept[r.case_id]) for r in records
                if r.status == "ok" and r.timing.get("median_us") is not None and r.case_id in self._kept]
        items = [NvbenchItem(lambda gs=k["graphs"]: [g.replay() for g in gs], k["launches"] * len(k["graphs"]))
                 for _, k in todo]
        try:
            results = nvbench_graphs(items, torch.cuda.current_device()) if items else []
        except Exception as e:  # noqa: BLE001 - a failed cross-check is noted, the timings stand
            for rec, _ in todo:
                rec.cross["cross_error"] = f"nvbench: {_one_line(e)}"
            results = []
        for (rec, k), got in zip(todo, results):
            # against the same graphs: the mean of the kept groups' medians (the first `groups`)
            m = mean(_group_medians(rec)[:len(k["graphs"])])
            if got.get("batch_us"):
                rec.cross["nvbench_batch_us"] = round(got["batch_us"], 4)
                rec.cross["nvbench_delta_pct"] = round(100 * (m - got["batch_us"]) / got["batch_us"], 2)
            if got.get("cold_us"):
                rec.cross["nvbench_cold_us"] = round(got["cold_us"], 4)
                rec.cross["nvbench_cold_delta_pct"] = round(100 * (m - got["cold_us"]) / got["cold_us"], 2)
            if got.get("cold_noise_pct") is not None:
                rec.cross["nvbench_noise_pct"] = round(got["cold_noise_pct"], 3)
            for k in ("cold_samples", "batch_samples"):
                if got.get(k) is not None:
                    rec.cross[f"nvbench_{k}"] = got[k]
            if not got:
                rec.cross["cross_error"] = "nvbench: no measurement for this graph (skipped or timed out)"
        self._kept.clear()

    def profile_pass(self, cases: list[Case], records: list[Record]) -> None:
        """Pure kernel time from the PyTorch profiler (CUPTI) for every timed record, in a pass of
        its own after all timing; node gap = graph-replay time - kernel time."""
        if "profiler" not in self.opts.cross or not self.opts.time_it:
            return
        from moebench.core.timing import profiler_kernel_us

        by_id = {c.id: c for c in cases}
        for rec in records:
            case = by_id.get(rec.case_id)
            if case is None or rec.status != "ok" or rec.timing.get("median_us") is None:
                continue
            try:
                fns, held = self._profiled.pop(rec.case_id, (None, None))  # held: the copies fns read
                if fns is None:  # resumed or timed elsewhere: the case's input sets
                    params, _ = resolve(self.spec, case, self.device, self.environ)
                    builder = self.fam.builder(case.variant)
                    fns = [builder(s, params, self.device).launch for s in self.inputs(case)]
                    mine = rec.timing["median_us"]
                else:  # against the same placements: with placement groups, group 0's median
                    mine = _group_medians(rec)[0]
                v = profiler_kernel_us(fns, self.launches_per_graph(case))
                if v is not None:
                    rec.cross["kernel_us"] = round(v, 4)
                    rec.cross["node_gap_us"] = round(mine - v, 4)
            except Exception as e:  # noqa: BLE001
                rec.cross["cross_error"] = _one_line(e)


def _group_medians(rec: Record) -> list[float]:
    """The per-graph medians of a timed record (its one median for the single-graph timer)."""
    return rec.timing.get("group_medians_us") or [rec.timing["median_us"]]


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else repr(e))[:300]


# ----------------------------------------------------------------------------------- a whole sweep


@dataclass
class Profiling:
    """A pass over every timed case has started, after all timing: nvbench's, then the profiler's
    (CUPTI kernel times)."""

    what: str = "profiler pass (CUPTI kernel times)"


@dataclass
class Summary:
    """The end of a sweep: every record in case order (resumed ones included), with baseline
    deltas; compile seconds and JIT specializations of this run; the signal that stopped it, if
    one did (then the records are those completed before it)."""

    records: list[Record]
    compile_s: float
    jit_specializations: int
    wall_s: float
    interrupted: int | None = None
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (this process's cases)

    @property
    def complete(self) -> bool:
        return self.interrupted is None


def run_sweep(spec: Spec, cases: list[Case], options: Options, device: DeviceInfo, *,
              done: dict[str, Record] | None = None, gpus: list[int] | None = None,
              environ: Mapping[str, str] | None = None) -> Iterator[Started | Retimed | Finished | Profiling | Summary]:
    """A sweep as a stream of events: Started/Retimed/Finished per case still to run (in this
    process, or on one worker process per GPU with `gpus`), Profiling when the profiler pass
    begins, and a last Summary. `done` holds records of cases already completed (a resumed run):
    they are not run again but are part of the Summary.

    An interrupt (KeyboardInterrupt, or a signal the caller turns into one) ends the run with an
    incomplete Summary of what finished. If it lands in the caller while it handles an event,
    `throw` it into this generator: the Summary comes back from the throw."""
    from moebench.core.report import add_baseline_deltas

    done = dict(done or {})
    todo = [c for c in cases if c.id not in done]
    if not options.time_it and not spec.family.host_only:
        todo = shape_major(todo, spec.family.shape_params)
    records = [done[c.id] for c in cases if c.id in done]
    t0 = time.perf_counter()
    session = Session(spec, device, options, environ)
    session.check_environment(todo)
    interrupted = None
    try:
        if gpus:
            from moebench.dist.workers import run_on_devices

            for i, rec in enumerate(run_on_devices(spec, todo, gpus, opts=options)):
                records.append(rec)
                yield Finished(rec, i, len(todo))
        else:
            for ev in session.run(todo):
                if isinstance(ev, Finished):
                    records.append(ev.record)
                yield ev
            if "nvbench" in options.cross and options.time_it:
                yield Profiling("nvbench pass (cold and batch replays of every timed graph)")
                with session._phase("nvbench pass"):
                    session.nvbench_pass(records)
            if "profiler" in options.cross and options.time_it:
                yield Profiling()
                with session._phase("profiler pass"):
                    session.profile_pass(cases, records)
    except KeyboardInterrupt as e:
        interrupted = getattr(e, "signum", signal.SIGINT)
    order = {c.id: i for i, c in enumerate(cases)}
    records.sort(key=lambda r: order.get(r.case_id, 0))
    add_baseline_deltas(spec, records)
    if gpus:  # the workers compiled (each its own JIT); this process's session ran no case
        fresh = [r.timing["compile_s"] for r in records if r.case_id not in done and r.timing.get("compile_s") is not None]
        compile_s, n_jit = sum(fresh), len(fresh)
    else:
        compile_s, n_jit = session.compile_s_total, session.jit_specializations
    phases = {k: round(v, 3) for k, v in sorted(session.phases.items(), key=lambda kv: -kv[1])}
    yield Summary(records, round(compile_s, 3), n_jit, round(time.perf_counter() - t0, 2), interrupted, phases)


def shape_major(cases: list[Case], shape_params: tuple[str, ...]) -> list[Case]:
    """The same cases, those of one shape (one set of inputs, one reference) next to each other, in
    the order shapes first appear. For untimed runs: each shape's inputs are built once and can be
    dropped after its last case. Records are put back in spec order at the end."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(shape_key(c, shape_params), []).append(c)
    return [c for g in groups.values() for c in g]


def prefetch_workers() -> int:
    """Background threads that build inputs ahead in untimed runs ($MOEBENCH_PREFETCH; 0 = none)."""
    raw = os.environ.get("MOEBENCH_PREFETCH", "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            pass
    return max(1, min(PREFETCH_MAX_WORKERS, (os.cpu_count() or 2) // 2))


class _Ahead:
    """Builds the inputs and references of shapes on background threads. In an untimed run it keeps
    the next shapes in flight while the main thread runs the current case (`feed`); in a timed run
    it builds every shape before the first case (`build_all`), so nothing runs in the background
    while anything is timed. Family input builders seed their own generators, so the data does not
    depend on which thread built it. A failure surfaces in the case that needs the shape."""

    def __init__(self, session: Session, cases: list[Case]):
        from concurrent.futures import ThreadPoolExecutor

        self.s = session
        workers = prefetch_workers()
        self.depth = workers * PREFETCH_DEPTH_PER_WORKER
        keys = [shape_key(c, session.fam.shape_params) for c in cases]
        first: dict[tuple, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        self.shapes = list(first.items())  # (key, first case index) in order
        self.pos = {k: j for j, (k, _) in enumerate(self.shapes)}
        self.keys, self.cases = keys, cases
        self.next = 0
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="moebench-inputs")

    def feed(self, i: int) -> None:
        """Case i is next: keep the shapes up to `depth` past its own submitted."""
        here = self.pos[self.keys[i]]
        s = self.s
        while self.next < len(self.shapes) and self.next <= here + self.depth:
            key, j = self.shapes[self.next]
            if self.next > here and key not in s._inputs and key not in s._ahead:
                s._ahead[key] = self.pool.submit(s._build_shape, self.cases[j])
            self.next += 1

    def build_all(self) -> None:
        """Every shape, now, in parallel; returns when all are built (or failed)."""
        from concurrent.futures import wait

        s = self.s
        for key, j in self.shapes:
            if key not in s._inputs and key not in s._ahead:
                s._ahead[key] = self.pool.submit(s._build_shape, self.cases[j])
        wait(list(s._ahead.values()))
        self.next = len(self.shapes)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.s._ahead.clear()

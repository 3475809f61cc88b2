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
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from moebench.core.cases import Case, baseline_case, shape_key
from moebench.core.device import DeviceInfo, nvml_clocks
from moebench.core.records import Record
from moebench.core.spec import Spec, Timing
from moebench.core.stats import noise_below, summarize
from moebench.errors import Unavailable
from moebench.families import Check

CROSS_CHECKS = ("dobench", "profiler")


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
        self._ref: dict[tuple, Any] = {}
        self._base: dict[tuple, Any] = {}
        self._compiled: set[tuple] = set()
        self.compile_s_total = 0.0
        self.clock_index = 0  # NVML's number for this GPU (a per-GPU worker sets its own)
        self._events: list = []

    @property
    def jit_specializations(self) -> int:
        return len(self._compiled)

    def check_environment(self, cases: list[Case]) -> None:
        check_environment(self.spec, cases, self.device, self.environ)

    # ------------------------------------------------------------------ running

    def run(self, cases: list[Case]) -> Iterator[Started | Retimed | Finished]:
        """Run cases in order, yielding events; a KeyboardInterrupt propagates between cases
        (every Finished record before it has been yielded)."""
        n = len(cases)
        for i, case in enumerate(cases):
            yield Started(case, i, n)
            rec = self.run_case(case)
            yield from self._events
            self._events.clear()
            yield Finished(rec, i, n)

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
        if have is None or len(have) < n:
            if len(self._inputs) > 4:  # keep memory bounded: inputs are rebuilt on demand
                self._inputs.clear()
            self._check_memory(case, n)
            self._inputs[key] = [self.impl.build_inputs(case.params, self.torch_device, i) for i in range(n)]
        return self._inputs[key][:n]

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
            built.reset()
            built.launch()
            self._sync()
            self._base[key] = built.output.clone()
        return self._base[key]

    # ------------------------------------------------------------------ launching

    def _sync(self) -> None:
        if self.torch_device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _first_launch(self, built) -> float | None:
        """Run once, so JIT compile happens outside any timing. Returns the compile seconds
        when this launch compiled a new specialization, else None."""
        new = built.compile_key not in self._compiled
        built.reset()
        t0 = time.perf_counter()
        built.launch()
        self._sync()
        dt = time.perf_counter() - t0
        if new:
            self._compiled.add(built.compile_key)
            self.compile_s_total += dt
            return dt
        return None

    # ------------------------------------------------------------------ one case

    def _kernel_case(self, case: Case, params: dict, rec: Record) -> None:
        builder = self.fam.builder(case.variant)
        sets = self.inputs(case)
        inp = sets[0]
        built = builder(inp, params, self.device)
        rec.launch.update(built.geometry)
        rec.launch_from.update(built.launch_from)

        compile_s = self._first_launch(built)
        rec.timing["compile_s"] = round(compile_s, 4) if compile_s is not None else None

        # checked launch: reset/poison, one launch, compare to torch and to the baseline launch
        expected = self.reference(case, inp)
        base = self.baseline_output(case, inp) if self.spec.baseline and not built.inexact else None
        built.reset()
        built.launch()
        self._sync()
        out = built.output
        chk: Check = self.impl.check(inp, out, expected, case.params)
        rec.checks["ref_check"] = chk.detail
        if base is not None:
            import torch

            rec.checks["baseline_equal"] = bool(torch.equal(out, base))
        elif built.inexact:
            rec.checks["baseline_equal"] = None
            rec.checks["baseline_skipped"] = built.inexact
        rec.checks.update(self.impl.nonvacuity(inp, out, case.params))
        if not chk.ok or rec.checks.get("baseline_equal") is False:
            rec.status = "mismatch"
            rec.error = chk.detail if not chk.ok else "differs from the baseline launch (torch.equal)"

        rec.work = self.impl.work(case.params, built.geometry, self.device)
        self._occupancy(rec.work)
        if not self.opts.time_it:
            return
        builts = [built] + [builder(s, params, self.device) for s in sets[1:]]
        self._time(case, rec, builts)

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

    def _time(self, case: Case, rec: Record, builts: list) -> None:
        from moebench.core.timing import time_graph

        t = self.opts.timing
        per_graph = self.launches_per_graph(case)
        retimed = 0
        while True:
            clk0 = nvml_clocks(self.clock_index)
            samples = time_graph([b.launch for b in builts], launches_per_graph=per_graph,
                                 warmup=t.warmup, min_replays=t.min_replays, max_replays=t.max_replays,
                                 max_seconds=t.max_seconds, stop=noise_below(t.target_rel_noise))
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
        l2_note = f"{t.l2} ({len(builts)} set{'s' if len(builts) > 1 else ''})"
        rec.timing.update({
            "timer": "graph-replay", "l2": l2_note, "median_us": round(s.median_us, 4),
            "min_us": round(s.min_us, 4), "max_us": round(s.max_us, 4), "q1_us": round(s.q1_us, 4),
            "q3_us": round(s.q3_us, 4), "iqr_us": round(s.iqr_us, 4), "rel_noise": round(s.rel_noise, 5),
            "n_replays": s.n, "launches_per_graph": samples.launches_per_graph,
            "stopped_by": samples.stopped_by, "timing_wall_s": round(samples.wall_s, 3),
            "sm_clock_start_mhz": clk0["sm_mhz"], "sm_clock_end_mhz": clk1["sm_mhz"],
        })
        mx = clk1.get("sm_max_mhz")
        if mx and clk1["sm_mhz"] is not None:
            rec.timing["clock_ok"] = clk1["sm_mhz"] >= t.clock_drop * mx
        self._floors(rec, s.median_us, builts)
        self._cross(rec, builts)

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
            rec.cross["dobench_us"] = round(v, 4)
            rec.cross["dobench_delta_pct"] = round(100 * (rec.timing["median_us"] - v) / v, 2)
        except Exception as e:  # noqa: BLE001 - a failed cross-check is noted, the timing stands
            rec.cross["cross_error"] = _one_line(e)

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
                params, _ = resolve(self.spec, case, self.device, self.environ)
                builder = self.fam.builder(case.variant)
                fns = [builder(s, params, self.device).launch for s in self.inputs(case)]
                v = profiler_kernel_us(fns, self.launches_per_graph(case))
                if v is not None:
                    rec.cross["kernel_us"] = round(v, 4)
                    rec.cross["node_gap_us"] = round(rec.timing["median_us"] - v, 4)
            except Exception as e:  # noqa: BLE001
                rec.cross["cross_error"] = _one_line(e)


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else repr(e))[:300]


# ----------------------------------------------------------------------------------- a whole sweep


@dataclass
class Profiling:
    """The profiler pass (CUPTI kernel times) has started, after every case was timed."""


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
            if "profiler" in options.cross and options.time_it:
                yield Profiling()
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
    yield Summary(records, round(compile_s, 3), n_jit, round(time.perf_counter() - t0, 2), interrupted)

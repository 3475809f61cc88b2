"""The run driver: the one thing that runs cases. `sweep`, `verify`, `--resume`, `ab` and every
per-GPU worker of `--devices` go through `Driver`; nothing else builds a case pipeline. It owns the
environment (`environ`, injected once and handed down: nothing reads or writes `os.environ` during
a run), the passes (moebench.core.passes), where the cases run (here, or on `workers`; `--isolate`
is the CLI's workers running every case in a child), the record order, baseline deltas and compile
accounting of the Summary, and the `fallback` after a case that `poisons_context`.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from moebench.core.baseline import add_baseline_deltas
from moebench.core.cases import Case, shape_key
from moebench.core.device import DeviceInfo
from moebench.core.passes import AfterAll, Pass, select
from moebench.core.pipeline import CasePipeline, Options, check_environment
from moebench.core.placements import Retimed
from moebench.core.prefetch import _Ahead, prebuild_fits, prefetch_workers, shape_major
from moebench.core.records import Record
from moebench.core.spec import Spec

# workers(cases, passes, environ) -> records as they finish (moebench.parallel.workers)
Workers = Callable[[Sequence[Case], Sequence[Pass], Mapping[str, str]], Iterator[Record]]

# CUDA errors after which a process's context is unusable: every later launch in it would fail. A
# run meeting one goes on in a fresh process (the driver's `fallback`; a per-GPU worker leaves).
STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                      "device-side assert", "illegal instruction")


def poisons_context(rec: Record) -> bool:
    """Whether a record's error is one that leaves its process's CUDA context unusable."""
    return rec.status == "error" and any(s in (rec.error or "") for s in STICKY_CUDA_ERRORS)


@dataclass
class Started:
    case: Case


@dataclass
class Finished:
    record: Record


@dataclass
class Profiling:
    """A pass's after-all hook has started (its `announce` line)."""

    what: str


@dataclass
class Summary:
    """The end of a run: every record in case order (resumed ones included), with baseline deltas;
    compile seconds and JIT specializations of this run; the passes that ran; the signal that
    stopped it, if one did (then the records are those completed before it)."""

    records: list[Record]
    compile_s: float
    jit_specializations: int
    wall_s: float
    interrupted: int | None = None
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (this process's cases)
    passes: list[str] = field(default_factory=list)  # the passes that ran, in the order they ran

    @property
    def complete(self) -> bool:
        return self.interrupted is None


Event = Started | Retimed | Finished | Profiling | Summary


class Driver:
    """Runs the cases of one spec on one device. `passes`: pass instances to use as they are (a
    worker gets its parent's); None: chosen from options.cross, and checked against where the cases
    run."""

    def __init__(self, spec: Spec, device: DeviceInfo, options: Options, *, environ: Mapping[str, str] | None = None,
                 workers: Workers | None = None, passes: Sequence[Pass] | None = None,
                 fallback: Workers | None = None):
        self.spec = spec
        self.device = device
        self.opts = options
        self.environ = dict(os.environ) if environ is None else environ
        self.workers = workers
        # where the rest of a run here goes after a case left this process's CUDA context unusable
        # (fresh child processes: moebench.parallel.workers.isolated); None: it stays here
        self.fallback = fallback
        self.fell_back: str | None = None  # the error that sent the rest of the run to the fallback
        if passes is None:
            passes = select(options.cross, backend=device.backend, timed=options.time_it, workers=workers is not None)
        self.passes = list(passes)
        here = [] if workers is not None else self.passes
        self.pipeline = CasePipeline(spec, device, options, self.environ, passes=here)

    def check(self, cases: Sequence[Case]) -> None:
        """A malformed kill-switch variable stops the run here, before its first case (UsageError)."""
        check_environment(self.spec, list(cases), self.device, self.environ, resolve_case=self.pipeline.resolve)

    def run_case(self, case: Case) -> Record:
        """One case through the pipeline, with the passes' per-case hooks."""
        rec = self.pipeline.run_case(case)
        self.pipeline.events.clear()
        return rec

    # ------------------------------------------------------------------ a whole run

    def run(self, cases: Sequence[Case], *, done: Mapping[str, Record] | None = None) -> Iterator[Event]:
        """A run as a stream of events: Started/Retimed/Finished per case still to run (here, or on
        the workers), Profiling when a pass's after-all hook begins, and a last Summary. `done`
        holds records of cases already completed (a resumed run): they are not run again but are
        part of the Summary.

        An interrupt (KeyboardInterrupt, or a signal the caller turns into one) ends the run with an
        incomplete Summary of what finished. If it lands in the caller while it handles an event,
        `throw` it into this generator: the Summary comes back from the throw."""
        spec, pipe = self.spec, self.pipeline
        cases = list(cases)
        done = dict(done or {})
        todo = [c for c in cases if c.id not in done]
        if not self.opts.time_it:
            todo = shape_major(todo, spec.family.shape_params)
        records = [done[c.id] for c in cases if c.id in done]
        t0 = time.perf_counter()
        self.check(todo)
        interrupted = None
        ran: list[str] = []
        try:
            if self.workers is not None:
                per_case = [p for p in self.passes if not p.has_after_all()]
                for rec in self.workers(todo, per_case, self.environ):
                    records.append(rec)
                    yield Finished(rec)
            else:
                for ev in self._run_here(todo):
                    if isinstance(ev, Finished):
                        records.append(ev.record)
                    yield ev
            for p in self.passes:
                if not p.has_after_all() or self.fell_back:  # (this process's context is gone)
                    continue
                if p.announce:
                    yield Profiling(p.announce)
                with pipe._phase(f"{p.name} pass"):
                    p.after_all(AfterAll(spec, self.device, self.opts, cases, records,
                                         pipe if self.workers is None else None, dict(self.environ)))
                p.release()
                ran.append(p.name)
        except KeyboardInterrupt as e:
            interrupted = getattr(e, "signum", signal.SIGINT)
        finally:
            for p in self.passes:
                p.release()
        if records:  # the per-case passes ran on every case this run finished (and made the resumed ones)
            ran += [p.name for p in self.passes if not p.has_after_all()]
        order = {c.id: i for i, c in enumerate(cases)}
        records.sort(key=lambda r: order.get(r.case_id, 0))
        add_baseline_deltas(spec, records)
        if self.workers is not None:  # the workers compiled (each its own JIT); this process ran no case
            fresh = [r.timing["compile_s"] for r in records
                     if r.case_id not in done and r.timing.get("compile_s") is not None]
            compile_s, n_jit = sum(fresh), len(fresh)
        else:
            compile_s, n_jit = pipe.compile_s_total, pipe.jit_specializations
        phases = {k: round(v, 3) for k, v in sorted(pipe.phases.items(), key=lambda kv: -kv[1])}
        yield Summary(records, round(compile_s, 3), n_jit, round(time.perf_counter() - t0, 2), interrupted, phases,
                      [p.name for p in self.passes if p.name in ran])

    def _run_here(self, cases: list[Case]) -> Iterator[Started | Retimed | Finished]:
        """Run cases in order in this process, yielding events; a KeyboardInterrupt propagates
        between cases (every Finished record before it has been yielded). Inputs are built ahead as
        moebench.core.prefetch says; an untimed run forgets a shape's inputs, reference and
        baseline output after its last case."""
        pipe, fam = self.pipeline, self.spec.family
        n = len(cases)
        untimed = not self.opts.time_it
        last = {}
        if untimed:
            for i, c in enumerate(cases):
                last[shape_key(c, fam.shape_params)] = i
        ahead = None
        if pipe.impl is not None and prefetch_workers(self.environ) and (untimed or prebuild_fits(pipe, cases)):
            ahead = _Ahead(pipe, cases)
            if not untimed:
                with pipe._phase("inputs + reference (built before timing, in parallel)"):
                    ahead.build_all()
        try:
            for i, case in enumerate(cases):
                if ahead is not None:
                    ahead.feed(i)
                yield Started(case)
                rec = pipe.run_case(case)
                yield from pipe.events
                pipe.events.clear()
                if untimed:
                    key = shape_key(case, fam.shape_params)
                    if last.get(key) == i:
                        pipe.forget(key)
                yield Finished(rec)
                if self.fallback is not None and poisons_context(rec) and i + 1 < n:
                    self.fell_back = rec.error.splitlines()[0]
                    per_case = [p for p in self.passes if not p.has_after_all() and p.in_workers]
                    for later in self.fallback(cases[i + 1:], per_case, self.environ):
                        yield Finished(later)
                    return
        finally:
            if ahead is not None:
                ahead.close()


def run_sweep(spec: Spec, cases: Sequence[Case], options: Options, device: DeviceInfo, *,
              done: Mapping[str, Record] | None = None, workers: Workers | None = None,
              environ: Mapping[str, str] | None = None, fallback: Workers | None = None,
              passes: Sequence[Pass] | None = None) -> Iterator[Event]:
    """Driver(spec, device, options, environ=environ, workers=workers, fallback=fallback,
    passes=passes).run(cases, done=done), made when the first event is asked for."""
    yield from Driver(spec, device, options, environ=environ, workers=workers, fallback=fallback,
                      passes=passes).run(cases, done=done)

"""`moebench sweep` and `moebench verify`: plan the cases, hand them to the run driver, stream the
records to disk, print the tables. The driver (moebench.core.driver.Driver) runs them; this module
only parses, writes files and renders. Each stage is a row of the wall table (`--timings`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from moebench import startup
from moebench.cli.common import (DEFAULT_OUT, MEGATRON_OPT, PLUGIN_OPT, STATE, Bar, comma_list, err, exit_code, out,
                                 print_failures, print_pivots, print_rows, print_timings, raise_pending, select_backend,
                                 in_run, use_sources)
from moebench.core.cases import expand, varying_params
from moebench.passes.counters import note as counters_note
from moebench.core.device import host_device, load_or_measure_ceilings
from moebench.core.noise import apply as apply_noise
from moebench.core.driver import Finished, Profiling, Retimed, Started, Summary, run_sweep
from moebench.core.passes import select
from moebench.core.pipeline import Options
from moebench.core.provenance import provenance, record_key, run_extra, run_settings, summary_fields
from moebench.core.store import (OutputLock, ResultsWriter, check_formats, existing_records, previous_records, result_stem,
                                 stream_path, writable_dir)
from moebench.core.spec import apply_timing_overrides, load_spec
from moebench.errors import ExitCode, Interrupted, OutputError, UsageError
from moebench.parallel import shards, workers
from moebench.report.sweep import sweep_markdown, verdict_line

app = typer.Typer()

# Under the interpreter a case that takes longer than this is a shape too big for the CPU (or a grid
# of a million programs, run one at a time).
CASE_LIMIT_S = 120.0
# The largest limit the interval timer takes on every platform (1e10 s overflows time_t in setitimer): ~11 days.
CASE_LIMIT_MAX_S = 1e6


@dataclass
class Args:
    """How a run runs and where it writes, as the command line gave it (checked by `where`)."""

    out_dir: Path = DEFAULT_OUT
    interpret: bool = False
    formats: str = "csv,json,md"
    resume: bool = False
    force: bool = False
    cross: tuple = ()  # the --cross-check passes (and counters for --counters)
    devices: str | None = None
    case_limit: float = CASE_LIMIT_S
    isolate: bool = False
    time_it: bool = True


@dataclass
class Plan:
    """What a run will do, decided before anything runs."""

    spec: object
    cases: list
    vary: tuple
    shard: tuple[int, int] | None
    quick: bool
    verify: bool


def plan(spec_name: str, *, quick: bool, verify: bool, force: bool, timings: bool, sources: tuple,
         interpret: bool | None, shard: str | None = None, timing: str | None = None) -> Plan:
    """How `sweep` and `verify` start: --timings noted, the `sources` (--plugin, --megatron-lm) loaded
    on the backend `interpret` asks for (None: none, a dry run), then the spec and its cases."""
    STATE["timings"] = STATE["timings"] or timings
    startup.mark("parsing the command line (typer)")
    use_sources(*sources, interpret=interpret)
    with startup.phase("spec and cases"):
        spec = load_spec(spec_name)
        if timing:
            apply_timing_overrides(spec.timing, timing)
        cases = expand(spec, quick=quick, verify=verify, force=force)
        vary = varying_params(cases)
        shard_of = None
        if shard is not None or any(k in os.environ for k in ("SLURM_ARRAY_TASK_ID", "SLURM_PROCID")):
            shard_of = shards.parse_shard(shard, os.environ)
            if shard_of is not None:
                shards.check_shard_count(shard_of[1], len(cases), "--shard" if shard is not None else None)
                total, cases = len(cases), shards.partition(cases, shard_of[1])[shard_of[0]]
                err.print(f"shard {shard_of[0]} of {shard_of[1]} (" + ("--shard" if shard is not None else "Slurm")
                          + f"): {len(cases)} of the spec's {total} cases; `moebench merge` joins the shards",
                          highlight=False)
    return Plan(spec, cases, vary, shard_of, quick, verify)


def print_plan(p: Plan) -> None:
    print_rows(f"{p.spec.name}: {len(p.cases)} cases" + (" (quick)" if p.quick else ""), ["case id", "variant", *p.vary],
               [[c.id, c.label, *[str(c.params.get(v)) for v in p.vary]] for c in p.cases], False,
               left=("case id", "variant"))


@dataclass
class Where:
    """Where and how a planned run runs, every option checked against the device it gets."""

    device: object
    timed: bool
    fmts: tuple
    gpus: list | None
    environ: dict  # the run's environment, handed down to the driver (which checks it); read once, here
    untimed: bool = False  # timings were asked for, but there is no CUDA device
    noise: object = None  # the noise model chosen for a run asked to time (moebench.core.noise.NoiseChoice)
    passes: list | None = None  # the passes of --cross-check, chosen and checked once (moebench.core.passes.select)


def where(p: Plan, a: Args) -> Where:
    """Check every option against the device the run gets (exit 2 before anything runs)."""
    fmts = check_formats(a.formats)
    if not 0 <= a.case_limit <= CASE_LIMIT_MAX_S:
        raise UsageError(f"--case-limit: expected seconds from 0 (no limit) to {CASE_LIMIT_MAX_S:g}, "
                         f"got {a.case_limit:g}")
    if a.devices:
        workers.device_list(a.devices)  # before the backend: a malformed value is named as such
    spec, host_only = p.spec, p.spec.family.host_only
    device = host_device() if host_only else select_backend(a.interpret)
    time_it = a.time_it and not host_only
    timed = time_it and device.backend == "cuda"
    gpus = None
    if a.devices:  # before the ceilings are measured: a bad --devices fails at once
        if host_only or device.backend != "cuda":
            raise UsageError(f"--devices: one worker per CUDA device, but this run is on {device.name}"
                             + (" (a host-only family)" if host_only else "; drop --devices or --interpret"))
        gpus = workers.parse_devices(a.devices)
    if a.isolate and host_only:
        raise UsageError(f"--isolate: family {spec.family.name!r} is host-only (it runs no kernel); drop --isolate")
    passes = select(a.cross, backend=device.backend, timed=timed, workers=bool(gpus) or a.isolate)  # cannot run: exit 2
    chosen = None
    if time_it:  # the measured run-to-run term (moebench.core.noise); a malformed model: exit 2 here
        with startup.phase("noise model"):
            chosen = apply_noise(spec, device)
        if timed and chosen.note:
            err.print(f"note: noise model: {chosen.note}", highlight=False, soft_wrap=True)
    return Where(device, timed, tuple(fmts), gpus, dict(os.environ), time_it and not timed, chosen, passes)


def execute(p: Plan, a: Args) -> int:
    """Run a planned sweep or verify matrix and write its results; returns the exit code. Every
    option is checked before the first case runs (the kill-switch variables by the run driver), and
    the run holds its output's lock throughout."""
    w = where(p, a)
    stem = result_stem(p.spec.name, quick=p.quick, verify=p.verify)
    if p.shard is not None:
        stem = shards.shard_stem(stem, *p.shard)
    writable_dir(a.out_dir, "--out")
    dest = writable_dir(a.out_dir / w.device.slug, "--out")
    for f in [dest / f"{stem}.{fmt}" for fmt in w.fmts] + [stream_path(dest, stem)]:
        if f.is_dir():  # found before any case runs, not when the results are written
            raise UsageError(f"--out: {f} is a folder, where this run writes a file; move it, or give another --out")
    with OutputLock(dest, stem):
        records, summary, written = run_locked(p, w, a, dest, stem)
    return finish(p, w, a, records, summary, written)


def run_locked(p: Plan, w: Where, a: Args, dest: Path, stem: str):
    """The run itself, under the output's lock: ceilings, provenance, resumed records, the run
    driver's events into the results writer; returns (records, summary, what was written)."""
    spec = p.spec
    have, where_ = existing_records(dest, stem, w.fmts)
    if have > len(p.cases) and not a.force:
        raise UsageError(f"{where_} holds {have} records and this run has {len(p.cases)} cases: it would be "
                         "replaced by fewer; pass --force to replace it, or another --out")
    if w.untimed:
        err.print("No CUDA device: kernels run under the Triton interpreter on the CPU; correctness only, "
                  "no timings.", style="yellow")
    ceilings = {}
    if w.timed:
        with err.status("Measuring device ceilings (copy bandwidth, empty-kernel floor; cached)..."), \
                startup.phase("device ceilings (cached, or measured in a child)"):
            # in a child process: measuring here would change the memory the cases are timed in
            ceilings = load_or_measure_ceilings(w.device, a.out_dir, child=True,
                                                note=lambda m: err.print(m, style="yellow", highlight=False))
    with startup.phase("provenance (git), earlier records"):
        settings = run_settings(spec, w.device, timed=w.timed, cross=a.cross, environ=w.environ)
        extra = run_extra(spec, p.cases, cross=a.cross, timed=w.timed, shard=p.shard, settings=settings,
                          noise_model=w.noise.provenance() if w.timed else None)
        prov = provenance(spec, w.device, quick=p.quick, verify=p.verify, ceilings=ceilings, extra=extra)
        keys = {c.id: record_key(c, settings) for c in p.cases}
        done = previous(dest, stem, keys, settings, resume=a.resume, n_cases=len(p.cases))
        writer = ResultsWriter(dest, stem, prov, w.fmts, force=a.force, keys=keys)
        writer.add_many(done[c.id] for c in p.cases if c.id in done)
    opts = Options(timing=spec.timing, time_it=w.timed, cross=a.cross, ceilings=ceilings,
                   traceback=STATE["verbose"], case_limit_s=a.case_limit or None)
    events = run_sweep(spec, p.cases, opts, w.device, done=done, environ=w.environ, passes=w.passes,
                       **run_workers(p, w, a, opts))  # made lazily
    startup.mark("checks (options, output folder, lock)")
    summary = drive(p, events, writer, len(p.cases) - len(done))
    for k, v in summary.phases.items():  # the cases' own phases (threads that built inputs ahead overlapped them)
        if "background" not in k:
            startup.add(f"cases: {k}", v)
    startup.mark("cases: the rest (driver, workers, progress, the stream)")
    records = summary.records
    prov.update(summary_fields(summary))
    with startup.phase("writing the results files and page (import pandas)"):
        md = sweep_markdown(spec, records, prov)
        prov["wall_phases"] = dict(startup.wall_rows())  # up to this write; --timings prints the whole table
        written = writer.finalize(records, complete=summary.complete, markdown=md)
    return records, summary, written


def run_workers(p: Plan, w: Where, a: Args, opts) -> dict:
    """The worker processes the driver hands cases to: one per GPU of --devices, or one child for
    --isolate; otherwise none, with an isolated child as the fallback that runs the rest after a
    CUDA error poisons this process's context (none for a host-only family). Made lazily."""
    if w.gpus:
        return {"workers": workers.pool(p.spec, w.gpus, opts, isolate=a.isolate)}
    if a.isolate:
        return {"workers": workers.isolated(p.spec, opts, w.device.backend)}
    if p.spec.family.host_only:
        return {}
    return {"fallback": workers.isolated(p.spec, opts, w.device.backend)}


def previous(dest: Path, stem: str, keys: dict, settings: dict, *, resume: bool, n_cases: int) -> dict:
    """The finished records of an earlier run into the same output that --resume keeps (by case id);
    without --resume, a note that there are some."""
    if not (resume or stream_path(dest, stem).exists()):
        return {}
    found = previous_records(dest, stem, keys, settings)
    if resume:
        err.print(found.summary(n_cases), highlight=False, soft_wrap=True)
        return found.kept
    if found.kept:
        err.print(f"note: {stream_path(dest, stem)} holds {len(found.kept)} finished records of an earlier "
                  "run under these settings; --resume would keep them (this run keeps them in the stream)",
                  highlight=False, soft_wrap=True)
    return {}


def drive(p: Plan, events, writer, todo: int):
    """The run driver's events onto the progress bar and into the results writer; returns the
    Summary (an incomplete one when interrupted)."""
    summary = None
    with in_run(), Bar(p.spec.name, todo) as bar:
        try:
            for ev in events:
                if isinstance(ev, Started):
                    bar.note(ev.case.short(p.vary))
                elif isinstance(ev, Retimed):
                    bar.note(f"{ev.case.short(p.vary)} (clock {ev.sm_mhz} MHz: timing again)")
                elif isinstance(ev, Finished):
                    writer.add(ev.record)
                    bar.advance()
                elif isinstance(ev, Profiling):
                    bar.describe(f"{p.spec.name}: {ev.what}")
                elif isinstance(ev, Summary):
                    summary = ev
                if isinstance(ev, (Started, Finished)):
                    raise_pending()  # a signal that landed in an import, or that something swallowed
        except KeyboardInterrupt as e:  # landed here, between events: the driver still sums up
            summary = events.throw(e)
        except OutputError as e:  # the disk filled up (or the folder went away) under the run
            events.close()
            raise OutputError(f"{e}; every record finished before it is in {writer.partial} (free the space, "
                              "then rerun with --resume)") from None
    return summary


def finish(p: Plan, w: Where, a: Args, records: list, summary, written) -> int:
    """Say what the run did (or why it is incomplete) and return its exit code."""
    spec, host_only = p.spec, p.spec.family.host_only
    saved = ", ".join(map(str, written.paths + ([written.stream] if written.stream else [])))
    if written.kept is not None:
        kept, n = written.kept
        saved = (f"{written.stream} (kept {kept}, which holds {n} records; --force replaces it with these "
                 f"{len(records)})")
    if not summary.complete:
        raise Interrupted(summary.interrupted, f"INCOMPLETE: {len(records)} of {len(p.cases)} cases; completed "
                          f"records saved to {saved}; rerun with --resume to finish")
    if written.kept is not None:
        raise UsageError(f"not written: {saved}")
    with startup.phase("printing the tables"):
        if not p.verify:
            page = next((x for x in written.paths if x.suffix == ".md"), None)
            print_pivots(spec, records, page=page)
        line = verdict_line(records, host_only)
        note = "" if host_only or w.device.backend == "cuda" else "  (interpreter run: no timings)"
        out.print(Text.assemble((f"{spec.name}{' verify' if p.verify else ''}: {line}", "bold"), note))
        if w.device.backend == "interpret":
            out.print(f"Interpreter: {summary.jit_specializations} kernel specializations, {summary.compile_s:.1f} s "
                      "in their first launches")
        elif not host_only:
            out.print(f"JIT: {summary.jit_specializations} specializations"
                      f"{f' across {len(w.gpus)} workers' if w.gpus else ''}, {summary.compile_s:.1f} s compiling"
                      + (" (excluded from timings)" if w.timed else ""))
        print_failures(records, p.vary)
        if "counters" in a.cross:
            missing = counters_note(records)
            if missing:
                err.print(missing, style="yellow", highlight=False, soft_wrap=True)
        out.print("Wrote " + ", ".join(str(x) for x in written.paths))
    if STATE["timings"]:
        print_timings()
    return exit_code(records)


# The panels of `sweep --help` (and `verify --help`).
RUN, TIMER, OUTPUT, SCALE = "What to run", "Timer", "Output", "Scale-out"
SPEC_ARG = typer.Argument(..., metavar="SPEC", help="Sweep name (sweeps/NAME.yaml) or path to a spec file.")
QUICK_OPT = typer.Option(False, "--quick", rich_help_panel=RUN, help="Use the spec's small CI smoke shape.")
OUT_OPT = typer.Option(DEFAULT_OUT, "--out", rich_help_panel=OUTPUT, help="Results root: files go to "
                       "OUT/<device>/NAME.* (<device> is the GPU, cpu-interpreter, or host for a host-only family; "
                       "NAME is the spec's name, then -verify for verify, -quick with --quick, .shardIofN for a shard). "
                       "The default is ignored by git; the committed results/ is written only when named.")
INTERPRET_OPT = typer.Option(False, "--interpret", rich_help_panel=RUN, help="Run the kernels under the Triton "
                             "interpreter on the CPU (correctness only), even where there is a GPU.")
FORMAT_OPT = typer.Option("csv,json,md", "--format", rich_help_panel=OUTPUT, help="Comma list of csv, json, md, "
                          "parquet (parquet needs pyarrow).")
FORCE_OPT = typer.Option(False, "--force", rich_help_panel=RUN, help="Run more cases than the spec's max_cases "
                         "(never past the hard limit of a million), and replace results files that hold more records "
                         "than this run.")
RESUME_OPT = typer.Option(False, "--resume", rich_help_panel=RUN, help="Keep the finished records of an earlier run "
                          "into the same OUT made under the same settings, and run only the other cases.")
ISOLATE_OPT = typer.Option(False, "--isolate", rich_help_panel=SCALE, help="Run the cases in a child process, so "
                           "that one which crashes it (a segfault, an abort, a CUDA error) or hangs is recorded as "
                           "failed and a fresh child runs the rest. Costs a process start, and one more per crash.")
CASE_LIMIT_OPT = typer.Option(CASE_LIMIT_S, "--case-limit", rich_help_panel=RUN, help="Under the Triton "
                              "interpreter, stop a case after this many seconds and record it as an error (0: no "
                              "limit; at most 1e6).")
SHARD_OPT = typer.Option(None, "--shard", rich_help_panel=SCALE, help="I/N: run shard I of N (0-based); default "
                         "from SLURM_ARRAY_TASK_ID/COUNT or SLURM_PROCID/NTASKS when set.")
TIMINGS_OPT = typer.Option(False, "--timings", rich_help_panel=OUTPUT, help="At the end, print on stderr where the "
                           "command's wall time went (start-up, imports, device, each phase of the cases, writing), "
                           "rows adding up to the total; -v prints it too. The results JSON carries the rows up to "
                           "its writing as provenance.wall_phases.")


@app.command(short_help="Verify and time every case of a sweep; write the tables.")
def sweep(
    spec: str = SPEC_ARG,
    quick: bool = QUICK_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", rich_help_panel=RUN, help="List the cases and exit."),
    interpret: bool = INTERPRET_OPT,
    resume: bool = RESUME_OPT,
    force: bool = FORCE_OPT,
    case_limit: float = CASE_LIMIT_OPT,
    timing: Optional[str] = typer.Option(None, "--timing", rich_help_panel=TIMER, help="Override timer settings of "
                                         "the spec (the keys of a spec's timing: block), e.g. l2=cold (rotate input "
                                         "sets past L2), groups=4, noise=none (the run-to-run term: auto, the "
                                         "default, reads results/<device>/noise/<sweep>.json of the repository when "
                                         "measured on this GPU; none; or a model file from scripts/repro.py "
                                         "calibrate)."),
    cross_check: Optional[str] = typer.Option(None, "--cross-check", rich_help_panel=TIMER, help="Also time with: "
                                              "dobench (triton do_bench_cudagraph), nvbench (NVIDIA nvbench on the "
                                              "same graphs; pip install 'moebench[nvbench]'), profiler (CUPTI kernel "
                                              "time), counters (as --counters)."),
    counters: bool = typer.Option(False, "--counters", rich_help_panel=TIMER, help="After all timing, profile every "
                                  "case once under Nsight Compute ($MOEBENCH_NCU, else ncu): occupancy, traffic, "
                                  "instructions, a bound verdict and the work-model check per case (unavailable, "
                                  "with why, on the CPU)."),
    out_dir: Path = OUT_OPT,
    formats: str = FORMAT_OPT,
    timings: bool = TIMINGS_OPT,
    devices: Optional[str] = typer.Option(None, "--devices", rich_help_panel=SCALE, help="all or 0,1,...: one worker "
                                          "process per GPU."),
    shard: Optional[str] = SHARD_OPT,
    isolate: bool = ISOLATE_OPT,
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
):
    """Run a sweep: verify every case, time it under CUDA-graph replay, write tables."""
    p = plan(spec, quick=quick, verify=False, force=force, timings=timings, sources=(plugin, megatron_lm),
             interpret=interpret if not dry_run else None, shard=shard, timing=timing)
    if dry_run:
        print_plan(p)
        raise typer.Exit(ExitCode.OK)
    cross = tuple(dict.fromkeys(comma_list(cross_check) + (["counters"] if counters else [])))
    raise typer.Exit(execute(p, Args(out_dir, interpret, formats, resume, force, cross, devices, case_limit, isolate)))


@app.command(short_help="The spec's correctness matrix only, e.g. 2280/2280 exact.")
def verify(
    spec: str = SPEC_ARG,
    quick: bool = typer.Option(False, "--quick", rich_help_panel=RUN, help="Use the spec's reduced verify matrix."),
    interpret: bool = INTERPRET_OPT,
    resume: bool = RESUME_OPT,
    force: bool = FORCE_OPT,
    case_limit: float = CASE_LIMIT_OPT,
    out_dir: Path = OUT_OPT,
    formats: str = FORMAT_OPT,
    timings: bool = TIMINGS_OPT,
    shard: Optional[str] = SHARD_OPT,
    isolate: bool = ISOLATE_OPT,
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
):
    """Run the spec's correctness matrix only; prints e.g. '2280/2280 exact'."""
    p = plan(spec, quick=quick, verify=True, force=force, timings=timings, sources=(plugin, megatron_lm),
             interpret=interpret, shard=shard)
    raise typer.Exit(execute(p, Args(out_dir, interpret, formats, resume, force, case_limit=case_limit,
                                     isolate=isolate, time_it=False)))

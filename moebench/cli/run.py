"""`moebench sweep` and `moebench verify`: plan the cases, hand them to the run driver, stream the
records to disk, print the tables. The driver (moebench.core.driver.Driver) runs them; this module
only parses, writes files and renders."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from moebench.cli.common import (DEFAULT_OUT, MEGATRON_OPT, PLUGIN_OPT, STATE, Bar, err, out, parse_formats,
                                 print_failures, print_pivots, raise_pending, select_backend,
                                 sigterm_as_interrupt, use_sources)
from moebench.errors import ExitCode, Interrupted, OutputError, UsageError

app = typer.Typer(rich_markup_mode=None)  # plain help: no <bool> placeholders, paragraphs rewrapped


@dataclass
class Plan:
    """What a run will do, decided before anything runs."""

    spec: object
    cases: list
    vary: tuple
    shard: tuple[int, int] | None
    quick: bool
    verify: bool


def plan(spec_name: str, *, quick: bool, verify: bool, force: bool, l2: str | None, shard: str | None,
         timing: str | None = None, noise: str | None = None) -> Plan:
    from moebench.core.cases import expand, varying_params
    from moebench.core.spec import apply_timing_overrides, load_spec

    spec = load_spec(spec_name)
    if l2 is not None:
        if l2 not in ("warm", "cold"):
            raise UsageError(f"--l2: expected warm or cold, got {l2!r}")
        spec.timing.l2 = l2
    if timing:
        apply_timing_overrides(spec.timing, timing)
    if noise is not None:
        from moebench.core.noise import setting_problem

        if setting_problem(noise):
            raise UsageError(f"--noise: {setting_problem(noise)}")
        spec.timing.noise = noise
    cases = expand(spec, quick=quick, verify=verify, force=force)
    vary = varying_params(cases)
    shard_of = None
    if shard is not None or any(k in os.environ for k in ("SLURM_ARRAY_TASK_ID", "SLURM_PROCID")):
        from moebench.parallel.shards import check_shard_count, parse_shard, partition

        shard_of = parse_shard(shard, os.environ)
        if shard_of is not None:
            check_shard_count(shard_of[1], len(cases), "--shard" if shard is not None else None)
            cases = partition(cases, shard_of[1])[shard_of[0]]
    return Plan(spec, cases, vary, shard_of, quick, verify)


def print_plan(p: Plan) -> None:
    tab = Table(title=f"{p.spec.name}: {len(p.cases)} cases" + (" (quick)" if p.quick else ""), title_justify="left")
    tab.add_column("case id")
    tab.add_column("variant")
    for v in p.vary:
        tab.add_column(v, justify="right")
    for c in p.cases:
        tab.add_row(c.id, c.label, *[str(c.params.get(v)) for v in p.vary])
    out.print(tab)


# Under the interpreter a case that takes longer than this is a shape too big for the CPU (or a grid
# of a million programs, run one at a time): the slowest built-in verify case takes ~2 s there.
CASE_LIMIT_S = 120.0
# The largest limit the interval timer takes on every platform (1e10 s overflows time_t in setitimer): ~11 days.
CASE_LIMIT_MAX_S = 1e6


@dataclass
class Where:
    """Where and how a planned run runs, every option checked against the device it gets."""

    device: object
    timed: bool
    cross: tuple
    fmts: tuple
    gpus: list | None
    environ: dict  # the run's environment, handed down to the driver (which checks it); read once, here
    untimed: bool = False  # timings were asked for, but there is no CUDA device
    isolate: bool = False  # the cases run in a child process (moebench.parallel.workers.isolated)
    noise: object = None  # the noise model chosen for a run asked to time (moebench.core.noise.NoiseChoice)
    passes: list = field(default_factory=list)  # the --cross-check passes, checked (moebench.core.passes.select)


def where(p: Plan, *, interpret: bool, formats: str, cross_check: str | None, time_it: bool,
          devices: str | None, case_limit: float, isolate: bool) -> Where:
    """Check every option against the device the run gets (exit 2 before anything runs)."""
    from moebench.core.device import host_device
    from moebench.core.passes import select

    fmts = parse_formats(formats)
    cross = tuple(c.strip() for c in (cross_check or "").split(",") if c.strip())  # checked by select below
    if not 0 <= case_limit <= CASE_LIMIT_MAX_S:
        raise UsageError(f"--case-limit: expected seconds from 0 (no limit) to {CASE_LIMIT_MAX_S:g}, got {case_limit:g}")
    spec, host_only = p.spec, p.spec.family.host_only
    device = host_device() if host_only else select_backend(interpret)
    time_it = time_it and not host_only
    timed = time_it and device.backend == "cuda"
    gpus = None
    if devices:  # before the ceilings are measured: a bad --devices fails at once
        from moebench.parallel.workers import device_list, parse_devices

        device_list(devices)  # what it says first: a malformed value is named as such
        if host_only or device.backend != "cuda":
            raise UsageError(f"--devices: one worker per CUDA device, but this run is on {device.name}"
                             + (" (a host-only family)" if host_only else "; drop --devices or --interpret"))
        gpus = parse_devices(devices)
    if isolate and host_only:
        raise UsageError(f"--isolate: family {spec.family.name!r} is host-only (it runs no kernel); drop --isolate")
    passes = select(cross, backend=device.backend, timed=timed, workers=bool(gpus) or isolate)  # cannot run: exit 2
    environ = dict(os.environ)  # the run's environment, handed down; read once
    chosen = None
    if time_it:  # the measured run-to-run term (moebench.core.noise); a malformed model: exit 2 here
        from moebench.core.noise import apply as apply_noise

        chosen = apply_noise(spec, device)
        if timed and chosen.note:
            err.print(f"note: noise model: {chosen.note}", markup=False, highlight=False, soft_wrap=True)
    return Where(device, timed, tuple(cross), tuple(fmts), gpus, environ, time_it and not timed, isolate, chosen,
                 passes)


def execute(p: Plan, *, out_dir: Path, interpret: bool, formats: str, resume: bool, force: bool,
            cross_check: str | None, time_it: bool, devices: str | None = None,
            case_limit: float = CASE_LIMIT_S, isolate: bool = False) -> int:
    """Run a planned sweep or verify matrix and write its results; returns the exit code. Every
    option is checked before the first case runs (the kill-switch variables by the run driver), and
    the run holds its output's lock throughout."""
    from moebench.core.records import OutputLock, result_stem, writable_dir

    w = where(p, interpret=interpret, formats=formats, cross_check=cross_check, time_it=time_it, devices=devices,
              case_limit=case_limit, isolate=isolate)
    stem = result_stem(p.spec.name, quick=p.quick, verify=p.verify)
    if p.shard is not None:
        from moebench.parallel.shards import shard_stem

        stem = shard_stem(stem, *p.shard)
    writable_dir(out_dir, "--out")
    dest = writable_dir(out_dir / w.device.slug, "--out")
    with OutputLock(dest, stem):
        records, summary, written = run_locked(p, w, out_dir, dest, stem, resume=resume, force=force,
                                               case_limit=case_limit)
    return finish(p, w, records, summary, written)


def run_locked(p: Plan, w: Where, out_dir: Path, dest: Path, stem: str, *, resume: bool, force: bool,
               case_limit: float):
    """The run itself, under the output's lock: ceilings, provenance, resumed records, the run
    driver's events into the results writer; returns (records, summary, what was written)."""
    from moebench.core.device import load_or_measure_ceilings
    from moebench.core.driver import run_sweep
    from moebench.core.pipeline import Options
    from moebench.core.records import ResultsWriter, existing_records, provenance, record_key, run_settings
    from moebench.core.runinfo import run_extra, summary_fields
    from moebench.report.sweep import sweep_markdown

    spec = p.spec
    have, where_ = existing_records(dest, stem, w.fmts)
    if have > len(p.cases) and not force:
        raise UsageError(f"{where_} holds {have} records and this run has {len(p.cases)} cases: it would be "
                         "replaced by fewer; pass --force to replace it, or another --out")
    if w.untimed:
        err.print("No CUDA device: kernels run under the Triton interpreter on the CPU; correctness only, "
                  "no timings.", style="yellow")
    ceilings = {}
    if w.timed:
        with err.status("Measuring device ceilings (copy bandwidth, empty-kernel floor; cached)..."):
            # in a child process: measuring here would change the memory the cases are timed in
            ceilings = load_or_measure_ceilings(w.device, out_dir, child=True,
                                                note=lambda m: err.print(m, style="yellow", highlight=False))
    settings = run_settings(spec, w.device, timed=w.timed, cross=w.cross, environ=w.environ)
    extra = run_extra(spec, p.cases, cross=w.cross, timed=w.timed, shard=p.shard, settings=settings,
                      noise_model=w.noise.provenance() if w.timed else None)
    prov = provenance(spec, w.device, quick=p.quick, verify=p.verify, ceilings=ceilings, extra=extra)
    keys = {c.id: record_key(c, settings) for c in p.cases}
    done = previous(dest, stem, keys, settings, resume=resume, n_cases=len(p.cases))
    writer = ResultsWriter(dest, stem, prov, w.fmts, force=force, keys=keys)
    writer.add_many(done[c.id] for c in p.cases if c.id in done)
    opts = Options(timing=spec.timing, time_it=w.timed, cross=w.cross, ceilings=ceilings,
                   traceback=STATE["verbose"], case_limit_s=case_limit or None)
    workers, fallback = run_workers(p, w, opts)
    events = run_sweep(spec, p.cases, opts, w.device, done=done, workers=workers, environ=w.environ,
                       fallback=fallback, passes=w.passes)  # made lazily
    summary = drive(p, events, writer, len(p.cases) - len(done))
    records = summary.records
    prov.update(summary_fields(summary))
    md = sweep_markdown(spec, records, prov, metric=None if w.timed or spec.family.host_only else "ref_check")
    return records, summary, writer.finalize(records, complete=summary.complete, markdown=md)


def run_workers(p: Plan, w: Where, opts):
    """The worker processes the driver hands cases to: one per GPU of --devices, or one child for
    --isolate; otherwise none, with an isolated child as the fallback that runs the rest after a
    CUDA error poisons this process's context (none for a host-only family). Made lazily."""
    from moebench.parallel.workers import isolated, pool

    if w.gpus or w.isolate:
        return (pool(p.spec, w.gpus, opts, isolate=w.isolate) if w.gpus
                else isolated(p.spec, opts, w.device.backend)), None
    if p.spec.family.host_only:
        return None, None
    return None, isolated(p.spec, opts, w.device.backend)


def previous(dest: Path, stem: str, keys: dict, settings: dict, *, resume: bool, n_cases: int) -> dict:
    """The finished records of an earlier run into the same output that --resume keeps (by case id);
    without --resume, a note that there are some."""
    from moebench.core.records import previous_records, stream_path

    if not (resume or stream_path(dest, stem).exists()):
        return {}
    found = previous_records(dest, stem, keys, settings)
    if resume:
        err.print(found.summary(n_cases), markup=False, highlight=False, soft_wrap=True)
        return found.kept
    if found.kept:
        err.print(f"note: {stream_path(dest, stem)} holds {len(found.kept)} finished records of an earlier "
                  "run under these settings; --resume would keep them (this run keeps them in the stream)",
                  highlight=False, soft_wrap=True)
    return {}


def drive(p: Plan, events, writer, todo: int):
    """The run driver's events onto the progress bar and into the results writer; returns the
    Summary (an incomplete one when interrupted)."""
    from moebench.core.driver import Finished, Profiling, Retimed, Started, Summary

    summary = None
    with sigterm_as_interrupt(), Bar(p.spec.name, todo) as bar:
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


def finish(p: Plan, w: Where, records: list, summary, written) -> int:
    """Say what the run did (or why it is incomplete) and return its exit code."""
    from moebench.report.sweep import verdict_line

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
    if not p.verify:
        page = next((x for x in written.paths if x.suffix == ".md"), None)
        print_pivots(spec, records, None if w.timed or host_only else "ref_check", page)
    line = verdict_line(records) if not host_only else (
        f"{sum(r.status == 'ok' for r in records)}/{len(records)} cases evaluated")
    note = "" if w.timed or host_only or w.device.backend == "cuda" else "  (interpreter run: no timings)"
    out.print(Text.assemble((f"{spec.name}{' verify' if p.verify else ''}: {line}", "bold"), note))
    if w.device.backend == "interpret":
        out.print(f"Interpreter: {summary.jit_specializations} kernel specializations, {summary.compile_s:.1f} s in "
                  "their first launches")
    elif not host_only:
        out.print(f"JIT: {summary.jit_specializations} specializations"
                  f"{f' across {len(w.gpus)} workers' if w.gpus else ''}, {summary.compile_s:.1f} s compiling"
                  + (" (excluded from timings)" if w.timed else ""))
    print_failures(records, p.vary)
    if "counters" in w.cross:
        from moebench.core.counters import note as counters_note

        missing = counters_note(records)
        if missing:
            err.print(missing, style="yellow", markup=False, highlight=False, soft_wrap=True)
    out.print("Wrote " + ", ".join(str(x) for x in written.paths))
    failed = any(r.status not in ("ok", "unavailable") for r in records)
    return ExitCode.CASE_FAILED if failed else ExitCode.OK


SPEC_ARG = typer.Argument(..., help="Sweep name (sweeps/NAME.yaml) or path to a spec file.")
OUT_OPT = typer.Option(DEFAULT_OUT, "--out", help="Results root: files go to OUT/<device>/NAME.* (<device> is the GPU, "
                       "cpu-interpreter, or host for a host-only family). The default is ignored by git; the "
                       "committed results/ is written only when named.")
INTERPRET_OPT = typer.Option(False, "--interpret", help="Run the kernels under the Triton interpreter on the CPU "
                             "(correctness only), even where there is a GPU.")
FORMAT_OPT = typer.Option("csv,json,md", "--format", help="Comma list of csv, json, md, parquet (parquet needs "
                          "pyarrow).")
FORCE_OPT = typer.Option(False, "--force", help="Run more cases than the spec's max_cases (never past the hard limit "
                         "of a million), and replace results files that hold more records than this run.")
RESUME_OPT = typer.Option(False, "--resume", help="Keep the finished records of an earlier run into the same OUT "
                          "made under the same settings, and run only the other cases.")
ISOLATE_OPT = typer.Option(False, "--isolate", help="Run the cases in a child process, so that one which crashes it "
                           "(a segfault, an abort, a CUDA error) or hangs is recorded as failed and a fresh child runs "
                           "the rest. Costs a process start, and one more per crash.")
CASE_LIMIT_OPT = typer.Option(CASE_LIMIT_S, "--case-limit", help="Under the Triton interpreter, stop a case after "
                              "this many seconds and record it as an error (0: no limit; at most 1e6).")


@app.command(short_help="Verify and time every case of a sweep; write the tables.")
def sweep(
    spec: str = SPEC_ARG,
    quick: bool = typer.Option(False, "--quick", help="Use the spec's small CI smoke shape."),
    out_dir: Path = OUT_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cases and exit."),
    interpret: bool = INTERPRET_OPT,
    formats: str = FORMAT_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    cross_check: Optional[str] = typer.Option(None, "--cross-check",
                                              help="Also time with: dobench (triton do_bench_cudagraph), nvbench "
                                                   "(NVIDIA nvbench on the same graphs; pip install "
                                                   "'moebench[nvbench]'), profiler (CUPTI kernel time), "
                                                   "counters (as --counters)."),
    counters: bool = typer.Option(False, "--counters", help="After all timing, profile every case once under Nsight "
                                  "Compute ($MOEBENCH_NCU, else ncu): occupancy, traffic, instructions, a bound "
                                  "verdict and the work-model check per case (unavailable, with why, on the CPU)."),
    l2: Optional[str] = typer.Option(None, "--l2", help="warm (default) or cold (rotate input sets past L2)."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: run shard I of N (0-based); default from "
                                        "SLURM_ARRAY_TASK_ID/COUNT or SLURM_PROCID/NTASKS when set."),
    devices: Optional[str] = typer.Option(None, "--devices", help="all or 0,1,...: one worker process per GPU."),
    case_limit: float = CASE_LIMIT_OPT,
    isolate: bool = ISOLATE_OPT,
    timing: Optional[str] = typer.Option(None, "--timing", help="Override timer settings of the spec, e.g. "
                                         "groups=4,placement_memory=private (the keys of a spec's timing: block)."),
    noise: Optional[str] = typer.Option(None, "--noise", help="The run-to-run term of the stated intervals: auto "
                                        "(default: results/<device>/noise/<sweep>.json of the repository, when "
                                        "measured on this GPU), none (timing.rerun_rel only), or a noise model "
                                        "file (scripts/repro.py calibrate)."),
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
):
    """Run a sweep: verify every case, time it under CUDA-graph replay, write tables."""
    use_sources(plugin, megatron_lm, interpret=interpret if not dry_run else None)
    p = plan(spec, quick=quick, verify=False, force=force, l2=l2, shard=shard, timing=timing, noise=noise)
    if counters:
        cross_check = ",".join(x for x in dict.fromkeys([*(cross_check or "").split(","), "counters"]) if x.strip())
    if dry_run:
        print_plan(p)
        raise typer.Exit(ExitCode.OK)
    raise typer.Exit(execute(p, out_dir=out_dir, interpret=interpret, formats=formats, resume=resume, force=force,
                             cross_check=cross_check, time_it=True, devices=devices, case_limit=case_limit,
                             isolate=isolate))


@app.command(short_help="The spec's correctness matrix only, e.g. 2280/2280 exact.")
def verify(
    spec: str = SPEC_ARG,
    quick: bool = typer.Option(False, "--quick", help="Use the spec's reduced verify matrix."),
    out_dir: Path = OUT_OPT,
    interpret: bool = INTERPRET_OPT,
    formats: str = FORMAT_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    case_limit: float = CASE_LIMIT_OPT,
    isolate: bool = ISOLATE_OPT,
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
):
    """Run the spec's correctness matrix only; prints e.g. '2280/2280 exact'."""
    use_sources(plugin, megatron_lm, interpret=interpret)
    p = plan(spec, quick=quick, verify=True, force=force, l2=None, shard=None)
    raise typer.Exit(execute(p, out_dir=out_dir, interpret=interpret, formats=formats, resume=resume, force=force,
                             cross_check=None, time_it=False, case_limit=case_limit, isolate=isolate))

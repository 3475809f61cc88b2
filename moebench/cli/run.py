"""`moebench sweep` and `moebench verify`: plan the cases, hand them to the run driver, stream the
records to disk, print the tables. The driver (moebench.core.driver.Driver) runs them; this module
only parses, writes files and renders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from moebench.cli.common import (DEFAULT_OUT, MEGATRON_OPT, PLUGIN_OPT, STATE, Bar, err, out, parse_cross,
                                 parse_formats, print_failures, print_pivots, raise_pending, select_backend,
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


def execute(p: Plan, *, out_dir: Path, interpret: bool, formats: str, resume: bool, force: bool,
            cross_check: str | None, time_it: bool, devices: str | None = None,
            case_limit: float = CASE_LIMIT_S, isolate: bool = False) -> int:
    """Run a planned sweep or verify matrix and write its results; returns the exit code. Every
    option is checked before the first case runs, and the run holds its output's lock throughout."""
    from moebench.core.device import host_device, load_or_measure_ceilings
    from moebench.core.records import (OutputLock, ResultsWriter, existing_records, previous_records, provenance,
                                       record_key, result_stem, run_settings, stream_path, writable_dir)
    from moebench.report.sweep import sweep_markdown, verdict_line
    from moebench.core.driver import Finished, Profiling, Retimed, Started, Summary, run_sweep
    from moebench.core.passes import check_cross_checks, select
    from moebench.core.pipeline import Options

    spec = p.spec

    fmts = parse_formats(formats)
    cross = parse_cross(cross_check)
    if not 0 <= case_limit <= CASE_LIMIT_MAX_S:
        raise UsageError(f"--case-limit: expected seconds from 0 (no limit) to {CASE_LIMIT_MAX_S:g}, got {case_limit:g}")
    check_cross_checks(cross)
    host_only = spec.family.host_only
    if host_only:
        device = host_device()
        time_it = False
    else:
        device = select_backend(interpret)
    timed = time_it and device.backend == "cuda"
    gpus = None
    if devices:  # before the ceilings are measured: a bad --devices fails at once
        from moebench.parallel.workers import parse_devices

        if host_only or device.backend != "cuda":
            raise UsageError(f"--devices: one worker per CUDA device, but this run is on {device.name}"
                             + (" (a host-only family)" if host_only else "; drop --devices or --interpret"))
        gpus = parse_devices(devices)
    if isolate and host_only:
        raise UsageError(f"--isolate: family {spec.family.name!r} is host-only (it runs no kernel); drop --isolate")
    select(cross, backend=device.backend, timed=timed, workers=bool(gpus) or isolate)  # one that cannot run: exit 2
    environ = dict(os.environ)  # the run's environment, handed down; read once
    if time_it:  # the measured run-to-run term (moebench.core.noise); a malformed model: exit 2 here
        from moebench.core.noise import apply as apply_noise

        chosen = apply_noise(spec, device)
        if timed and chosen.note:
            err.print(f"note: noise model: {chosen.note}", markup=False, highlight=False, soft_wrap=True)
    stem = result_stem(spec.name, quick=p.quick, verify=p.verify)
    if p.shard is not None:
        from moebench.parallel.shards import shard_stem

        stem = shard_stem(stem, *p.shard)
    writable_dir(out_dir, "--out")
    dest = writable_dir(out_dir / device.slug, "--out")

    with OutputLock(dest, stem):
        have, where = existing_records(dest, stem, fmts)
        if have > len(p.cases) and not force:
            raise UsageError(f"{where} holds {have} records and this run has {len(p.cases)} cases: it would be "
                             "replaced by fewer; pass --force to replace it, or another --out")
        if time_it and not timed:
            err.print("No CUDA device: kernels run under the Triton interpreter on the CPU; correctness only, "
                      "no timings.", style="yellow")
        ceilings = {}
        if timed:
            with err.status("Measuring device ceilings (copy bandwidth, empty-kernel floor; cached)..."):
                ceilings = load_or_measure_ceilings(device, out_dir)
        settings = run_settings(spec, device, timed=timed, cross=cross, environ=environ)
        extra = {"cross_checks": list(cross), "timed": timed, "n_cases": len(p.cases),
                 "shard": list(p.shard) if p.shard else None, "settings": settings}
        if timed:
            extra["noise_model"] = chosen.provenance()
        if any(spec.family.variants[c.variant].source == "upstream" for c in p.cases):
            from moebench.sources import upstream

            extra["upstream"] = upstream.provenance()
        from moebench.sources import plugins

        if plugins.loaded():
            extra["plugins"] = plugins.loaded()
        prov = provenance(spec, device, quick=p.quick, verify=p.verify, ceilings=ceilings, extra=extra)
        keys = {c.id: record_key(c, settings) for c in p.cases}
        done = {}
        if resume or stream_path(dest, stem).exists():
            found = previous_records(dest, stem, keys, settings)
            if resume:
                done = found.kept
                err.print(found.summary(len(p.cases)), markup=False, highlight=False, soft_wrap=True)
            elif found.kept:
                err.print(f"note: {stream_path(dest, stem)} holds {len(found.kept)} finished records of an earlier "
                          "run under these settings; --resume would keep them (this run keeps them in the stream)",
                          highlight=False, soft_wrap=True)
        writer = ResultsWriter(dest, stem, prov, fmts, force=force, keys=keys)
        writer.add_many(done[c.id] for c in p.cases if c.id in done)
        opts = Options(timing=spec.timing, time_it=timed, cross=cross, ceilings=ceilings, traceback=STATE["verbose"],
                       case_limit_s=case_limit or None)

        summary = None
        from moebench.parallel.workers import isolated, pool

        workers = fallback = None
        if gpus or isolate:
            workers = pool(spec, gpus, opts, isolate=isolate) if gpus else isolated(spec, opts, device.backend)
        elif not host_only:  # after a CUDA error that poisons this process's context: the rest in a fresh one
            fallback = isolated(spec, opts, device.backend)
        events = run_sweep(spec, p.cases, opts, device, done=done, workers=workers, environ=environ,
                           fallback=fallback)  # made lazily
        with sigterm_as_interrupt(), Bar(spec.name, len(p.cases) - len(done)) as bar:
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
                        bar.describe(f"{spec.name}: {ev.what}")
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
        records = summary.records
        prov["sweep_wall_s"] = summary.wall_s  # cases incl. compile + verify
        prov["compile_s_total"] = summary.compile_s
        prov["jit_specializations"] = summary.jit_specializations
        prov["wall_phases_s"] = summary.phases  # where the cases' time went (scripts/wall_profile.py)
        prov["complete"] = summary.complete
        prov["cross_checks"] = summary.passes  # what ran, and only that
        md = sweep_markdown(spec, records, prov, metric=None if timed or host_only else "ref_check")
        written = writer.finalize(records, complete=summary.complete, markdown=md)

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
        print_pivots(spec, records, None if timed or host_only else "ref_check", page)
    line = verdict_line(records) if not host_only else (
        f"{sum(r.status == 'ok' for r in records)}/{len(records)} cases evaluated")
    note = "" if timed or host_only or device.backend == "cuda" else "  (interpreter run: no timings)"
    out.print(Text.assemble((f"{spec.name}{' verify' if p.verify else ''}: {line}", "bold"), note))
    if device.backend == "interpret":
        out.print(f"Interpreter: {summary.jit_specializations} kernel specializations, {summary.compile_s:.1f} s in "
                  "their first launches")
    elif not host_only:
        out.print(f"JIT: {summary.jit_specializations} specializations"
                  f"{f' across {len(gpus)} workers' if gpus else ''}, {summary.compile_s:.1f} s compiling"
                  + (" (excluded from timings)" if timed else ""))
    print_failures(records, p.vary)
    if "counters" in cross:
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

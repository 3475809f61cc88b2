"""`moebench sweep` and `moebench verify`: plan the cases, hand them to the session, stream the
records to disk, print the tables. The session (moebench.core.session.run_sweep) runs them; this
module only parses, writes files and renders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moebench.cli.common import (STATE, Bar, err, out, parse_cross, parse_formats, print_failures, print_pivots,
                                 select_backend, sigterm_as_interrupt)
from moebench.errors import ExitCode, Interrupted, UsageError

app = typer.Typer()


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
         timing: str | None = None) -> Plan:
    from moebench.core.cases import expand, varying_params
    from moebench.core.spec import apply_timing_overrides, load_spec

    spec = load_spec(spec_name)
    if l2 is not None:
        if l2 not in ("warm", "cold"):
            raise UsageError(f"--l2: expected warm or cold, got {l2!r}")
        spec.timing.l2 = l2
    if timing:
        apply_timing_overrides(spec.timing, timing)
    cases = expand(spec, quick=quick, verify=verify, force=force)
    vary = varying_params(cases)
    shard_of = None
    if shard is not None or any(k in os.environ for k in ("SLURM_ARRAY_TASK_ID", "SLURM_PROCID")):
        from moebench.dist.shards import parse_shard, partition

        shard_of = parse_shard(shard, os.environ)
        if shard_of is not None:
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


def execute(p: Plan, *, out_dir: Path, interpret: bool, formats: str, resume: bool, cross_check: str | None,
            time_it: bool, devices: str | None = None) -> int:
    """Run a planned sweep or verify matrix and write its results; returns the exit code."""
    from moebench.core.device import detect, load_or_measure_ceilings
    from moebench.core.records import ResultsWriter, previous_records, provenance, result_stem
    from moebench.core.report import sweep_markdown, verdict_line
    from moebench.core.session import Finished, Options, Profiling, Retimed, Started, Summary, run_sweep

    spec = p.spec
    from moebench.core.session import check_cross_checks

    fmts = parse_formats(formats)
    cross = parse_cross(cross_check)
    check_cross_checks(cross)
    host_only = spec.family.host_only
    if host_only:
        device = detect(True)
        time_it = False
    else:
        device = select_backend(interpret)
    timed = time_it and device.backend == "cuda"
    gpus = None
    if devices:  # before the ceilings are measured: a bad --devices fails at once
        from moebench.dist.workers import parse_devices

        if host_only or device.backend != "cuda":
            raise UsageError(f"--devices: one worker per CUDA device, but this run is on {device.name}"
                             + (" (a host-only family)" if host_only else "; drop --devices or --interpret"))
        gpus = parse_devices(devices)
    if time_it and not timed:
        err.print("[yellow]No CUDA device: kernels run under the Triton interpreter on the CPU; "
                  "correctness only, timing columns stay empty.[/yellow]")
    ceilings = {}
    if timed:
        with err.status("Measuring device ceilings (copy bandwidth, empty-kernel floor; cached)..."):
            ceilings = load_or_measure_ceilings(device, out_dir)
    stem = result_stem(spec.name, quick=p.quick, verify=p.verify)
    if p.shard is not None:
        from moebench.dist.shards import shard_stem

        stem = shard_stem(stem, *p.shard)
    dest = out_dir if host_only else out_dir / device.slug
    prov = provenance(spec, device, quick=p.quick, verify=p.verify, ceilings=ceilings,
                      extra={"cross_checks": list(cross), "timed": timed, "shard": list(p.shard) if p.shard else None})
    writer = ResultsWriter(dest, stem, prov, fmts)
    done = previous_records(dest, stem, spec.sha256) if resume else {}
    if resume:
        n_done = sum(c.id in done for c in p.cases)
        err.print(f"--resume: {n_done} of {len(p.cases)} cases already done in {dest}/{stem}.*")
    for c in p.cases:
        if c.id in done:
            writer.add(done[c.id])
    opts = Options(timing=spec.timing, time_it=timed, cross=cross, ceilings=ceilings, traceback=STATE["verbose"])

    summary = None
    events = run_sweep(spec, p.cases, opts, device, done=done, gpus=gpus)
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
        except KeyboardInterrupt as e:  # landed here, between events: the session still sums up
            summary = events.throw(e)
    records = summary.records
    prov["sweep_wall_s"] = summary.wall_s  # cases incl. compile + verify
    prov["compile_s_total"] = summary.compile_s
    prov["jit_specializations"] = summary.jit_specializations
    prov["wall_phases_s"] = summary.phases  # where the cases' time went (scripts/wall_profile.py)
    md = sweep_markdown(spec, records, prov, metric=None if timed or host_only else "ref_check")
    paths = writer.finalize(records, complete=summary.complete, markdown=md)
    if not summary.complete:
        raise Interrupted(summary.interrupted, f"interrupted after {len(records)} of {len(p.cases)} cases; "
                          f"completed records saved to {', '.join(map(str, paths))}; rerun with --resume to finish")
    if not p.verify:
        print_pivots(spec, records, None if timed or host_only else "ref_check")
    line = verdict_line(records) if not host_only else (
        f"{sum(r.status == 'ok' for r in records)}/{len(records)} cases evaluated")
    out.print(f"[bold]{spec.name}{' verify' if p.verify else ''}: {line}[/bold]"
              + ("" if timed or host_only or device.backend == "cuda" else "  (interpreter run: no timings)"))
    if not host_only:
        out.print(f"JIT: {summary.jit_specializations} specializations"
                  f"{f' across {len(gpus)} workers' if gpus else ''}, {summary.compile_s:.1f} s compiling "
                  "(excluded from timings)")
    print_failures(records, p.vary)
    out.print("Wrote " + ", ".join(str(x) for x in paths))
    failed = any(r.status not in ("ok", "unavailable") for r in records)
    return ExitCode.CASE_FAILED if failed else ExitCode.OK


SPEC_ARG = typer.Argument(..., help="Sweep name (sweeps/NAME.yaml) or path to a spec file.")


@app.command()
def sweep(
    spec: str = SPEC_ARG,
    quick: bool = typer.Option(False, "--quick", help="Use the spec's small CI smoke shape."),
    out_dir: Path = typer.Option(Path("results"), "--out", help="Results root; files go to OUT/<device>/."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cases and exit."),
    interpret: bool = typer.Option(False, "--interpret", help="Run kernels under the Triton interpreter (CPU)."),
    formats: str = typer.Option("csv,json,md", "--format", help="Comma list of csv,json,md,parquet."),
    force: bool = typer.Option(False, "--force", help="Allow more cases than the spec's max_cases."),
    resume: bool = typer.Option(False, "--resume", help="Skip cases already in OUT for the same spec."),
    cross_check: Optional[str] = typer.Option(None, "--cross-check",
                                              help="Also time with: dobench (triton do_bench_cudagraph), nvbench "
                                                   "(NVIDIA nvbench on the same graphs; pip install "
                                                   "'moebench[nvbench]'), profiler (CUPTI kernel time)."),
    l2: Optional[str] = typer.Option(None, "--l2", help="warm (default) or cold (rotate input sets past L2)."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: run shard I of N (0-based); default from "
                                        "SLURM_ARRAY_TASK_ID/COUNT or SLURM_PROCID/NTASKS when set."),
    devices: Optional[str] = typer.Option(None, "--devices", help="all or 0,1,...: one worker process per GPU."),
    timing: Optional[str] = typer.Option(None, "--timing", help="Override timer settings of the spec, e.g. "
                                         "groups=4,placement_memory=private (the keys of a spec's timing: block)."),
):
    """Run a sweep: verify every case, time it under CUDA-graph replay, write tables."""
    p = plan(spec, quick=quick, verify=False, force=force, l2=l2, shard=shard, timing=timing)
    if dry_run:
        print_plan(p)
        raise typer.Exit(ExitCode.OK)
    if not p.cases:
        err.print(f"shard {p.shard[0]}/{p.shard[1]} holds no cases; nothing to do")
        raise typer.Exit(ExitCode.OK)
    raise typer.Exit(execute(p, out_dir=out_dir, interpret=interpret, formats=formats, resume=resume,
                             cross_check=cross_check, time_it=True, devices=devices))


@app.command()
def verify(
    spec: str = SPEC_ARG,
    quick: bool = typer.Option(False, "--quick", help="Use the spec's reduced verify matrix."),
    out_dir: Path = typer.Option(Path("results"), "--out"),
    interpret: bool = typer.Option(False, "--interpret"),
    force: bool = typer.Option(False, "--force"),
):
    """Run the spec's correctness matrix only; prints e.g. '2280/2280 exact'."""
    p = plan(spec, quick=quick, verify=True, force=force, l2=None, shard=None)
    raise typer.Exit(execute(p, out_dir=out_dir, interpret=interpret, formats="json,md", resume=False,
                             cross_check=None, time_it=False))

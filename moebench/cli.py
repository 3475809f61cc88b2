"""The moebench command line. Commands are thin: parse -> call the library -> render.

Exit codes: 0 ok; 1 a case failed (verification or error); 2 usage or spec error;
128 + signal when a sweep was interrupted (its completed records are saved).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from moebench.errors import BackendError, Interrupted, MoebenchError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="CUDA-graph microbenchmarks for the small kernels of MoE inference.")
out = Console()
err = Console(stderr=True)
STATE = {"verbose": False}


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks on errors.")):
    STATE["verbose"] = verbose


# ----------------------------------------------------------------------------- helpers


def _formats(text: str) -> tuple[str, ...]:
    from moebench.records import FORMATS

    fs = tuple(f.strip() for f in text.split(",") if f.strip())
    for f in fs:
        if f not in FORMATS:
            raise UsageError(f"--format: unknown format {f!r}; choose from {', '.join(FORMATS)}")
    return fs


def _cross(text: str | None) -> tuple[str, ...]:
    from moebench.runner import CROSS_CHECKS

    if not text:
        return ()
    cs = tuple(c.strip() for c in text.split(",") if c.strip())
    for c in cs:
        if c not in CROSS_CHECKS:
            raise UsageError(f"--cross-check: unknown check {c!r}; choose from {', '.join(CROSS_CHECKS)}")
    return cs


def _select_backend(interpret: bool):
    from moebench.device import detect, require_triton, want_interpreter

    use_interp = want_interpreter(interpret)
    if use_interp:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    require_triton()
    return detect(use_interp)


class _Signalled(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_signal(signum, _frame):
    raise _Signalled(signum)


def render_table(title: str, t, metric: str, corner: str) -> Table:
    from moebench.report import fmt

    tab = Table(title=title or None, title_justify="left")
    tab.add_column(corner, style="bold")
    for c in t.columns:
        tab.add_column(str(c), justify="right")
    for key, row in t.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        cells = []
        for v in row:
            s = fmt(v, metric)
            cells.append(f"[red]{s}[/red]" if s.startswith("✗") else s)
        tab.add_row(" ".join(str(k) for k in key), *cells)
    return tab


def _print_pivots(spec, records, metric: str | None = None) -> None:
    from moebench.report import pivots

    pv = spec.pivot
    metric = metric or pv.get("metric", "median_us")
    rows, cols = pv.get("rows", "label"), pv.get("cols", "label")
    for title, t in pivots(records, rows, cols, metric, list(spec.family.params)):
        out.print(render_table(f"{spec.name}: {metric}" + (f" ({title})" if title else ""), t, metric,
                               f"{rows} \\ {cols}"))


def _run(spec_name: str, *, quick: bool, verify: bool, out_dir: Path, dry_run: bool, interpret: bool,
         formats: str, force: bool, resume: bool, cross_check: str | None, l2: str | None,
         time_it: bool, shard: str | None = None, devices: str | None = None) -> int:
    from moebench.cases import expand, varying_params
    from moebench.spec import load_spec

    spec = load_spec(spec_name)
    fmts = _formats(formats)
    cross = _cross(cross_check)
    if l2 is not None:
        if l2 not in ("warm", "cold"):
            raise UsageError(f"--l2: expected warm or cold, got {l2!r}")
        spec.timing.l2 = l2
    cases = expand(spec, quick=quick, verify=verify, force=force)
    vary = varying_params(cases)
    shard_of = None
    if shard is not None or any(k in os.environ for k in ("SLURM_ARRAY_TASK_ID", "SLURM_PROCID")):
        from moebench import dist

        shard_of = dist.parse_shard(shard, os.environ)
        if shard_of is not None:
            cases = dist.partition(cases, shard_of[1])[shard_of[0]]
            if not cases:
                err.print(f"shard {shard_of[0]}/{shard_of[1]} holds no cases; nothing to do")
                return 0
    if dry_run:
        tab = Table(title=f"{spec.name}: {len(cases)} cases" + (" (quick)" if quick else ""), title_justify="left")
        tab.add_column("case id")
        tab.add_column("variant")
        for v in vary:
            tab.add_column(v, justify="right")
        for c in cases:
            tab.add_row(c.id, c.label, *[str(c.params.get(v)) for v in vary])
        out.print(tab)
        return 0

    from moebench.device import load_or_measure_ceilings
    from moebench.records import ResultsWriter, previous_records, provenance, result_stem
    from moebench.report import sweep_markdown, verdict_line
    from moebench.runner import RunOptions, Runner, add_baseline_deltas

    host_only = spec.family.host_only
    if host_only:
        from moebench.device import detect

        device = detect(True)
        time_it = False
    else:
        device = _select_backend(interpret)
    timed = time_it and device.backend == "cuda"
    gpus = None
    if devices:  # before the ceilings are measured: a bad --devices fails at once
        from moebench import dist

        if host_only or device.backend != "cuda":
            raise UsageError(f"--devices: one worker per CUDA device, but this run is on {device.name}"
                             + (" (a host-only family)" if host_only else "; drop --devices or --interpret"))
        gpus = dist.parse_devices(devices)
    if time_it and not timed:
        err.print("[yellow]No CUDA device: kernels run under the Triton interpreter on the CPU; "
                  "correctness only, timing columns stay empty.[/yellow]")
    ceilings = {}
    if timed:
        with err.status("Measuring device ceilings (copy bandwidth, empty-kernel floor; cached)..."):
            ceilings = load_or_measure_ceilings(device, out_dir)
    stem = result_stem(spec.name, quick=quick, verify=verify)
    if shard_of is not None:
        from moebench import dist

        stem = dist.shard_stem(stem, *shard_of)
    dest = out_dir if host_only else out_dir / device.slug
    prov = provenance(spec, device, quick=quick, verify=verify, ceilings=ceilings,
                      extra={"cross_checks": list(cross), "timed": timed,
                             "shard": list(shard_of) if shard_of else None})
    writer = ResultsWriter(dest, stem, prov, fmts)
    done = previous_records(dest, stem, spec.sha256) if resume else {}
    todo = [c for c in cases if c.id not in done]
    if resume:
        err.print(f"--resume: {len(cases) - len(todo)} of {len(cases)} cases already done in {dest}/{stem}.*")
    runner = Runner(spec, device, RunOptions(timing=spec.timing, time_it=timed, cross=cross, ceilings=ceilings,
                                             traceback=STATE["verbose"]))
    records = [done[c.id] for c in cases if c.id in done]
    for r in records:
        writer.add(r)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM,)}
    signal.signal(signal.SIGTERM, _raise_signal)
    interrupted = None
    t_start = time.perf_counter()
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.fields[case]}"), console=err,
                      transient=True, disable=not err.is_terminal and not os.environ.get("MOEBENCH_PROGRESS")) as prog:
            task = prog.add_task(spec.name, total=len(todo), case="")
            if gpus:
                from moebench import dist

                # one worker process per GPU, cases from a shared queue; records come back here
                source = dist.run_on_devices(spec, todo, gpus, quick=quick, verify=verify, opts=runner.opts)
            else:
                source = _local(runner, todo, lambda c: prog.update(task, case=c.short(vary)))
            for rec in source:
                records.append(rec)
                writer.add(rec)
                prog.advance(task)
    except KeyboardInterrupt as e:
        interrupted = getattr(e, "signum", signal.SIGINT)
    finally:
        for s, h in old.items():
            signal.signal(s, h)

    if interrupted is None and not gpus and "profiler" in cross and timed:
        try:
            with err.status("Profiler pass (CUPTI kernel times)..."):
                runner.profile_pass(cases, records)
        except KeyboardInterrupt as e:
            interrupted = getattr(e, "signum", signal.SIGINT)
    order = {c.id: i for i, c in enumerate(cases)}
    records.sort(key=lambda r: order.get(r.case_id, 0))
    add_baseline_deltas(spec, records)
    prov["sweep_wall_s"] = round(time.perf_counter() - t_start, 2)  # cases incl. compile + verify
    if gpus:  # the workers compiled (each its own JIT); this process's runner ran no case
        fresh = [r.timing["compile_s"] for r in records
                 if r.case_id not in done and r.timing.get("compile_s") is not None]
        compile_s, n_jit = sum(fresh), len(fresh)
    else:
        compile_s, n_jit = runner.compile_s_total, len(runner._compiled)
    prov["compile_s_total"] = round(compile_s, 3)
    prov["jit_specializations"] = n_jit
    md = sweep_markdown(spec, records, prov, metric=None if timed or host_only else "ref_check")
    paths = writer.finalize(records, complete=interrupted is None, markdown=md)
    if interrupted is not None:
        raise Interrupted(interrupted, f"interrupted after {len(records)} of {len(cases)} cases; completed "
                          f"records saved to {', '.join(map(str, paths))}; rerun with --resume to finish")
    if not verify:
        _print_pivots(spec, records, None if timed or host_only else "ref_check")
    line = verdict_line(records) if not host_only else (
        f"{sum(r.status == 'ok' for r in records)}/{len(records)} cases evaluated")
    out.print(f"[bold]{spec.name}{' verify' if verify else ''}: {line}[/bold]"
              + ("" if timed or host_only or device.backend == "cuda" else "  (interpreter run: no timings)"))
    if not host_only:
        out.print(f"JIT: {n_jit} specializations{f' across {len(gpus)} workers' if gpus else ''}, {compile_s:.1f} s "
                  "compiling (excluded from timings)")
    for r in records:
        if r.status != "ok":
            shown = ", ".join(f"{k}={v}" for k, v in r.params.items() if k in vary and v is not None)
            err.print(f"{r.status}: {r.case_id} {r.label} [{shown}]: {r.error.splitlines()[0] if r.error else ''}",
                      markup=False, highlight=False, soft_wrap=True)
    out.print("Wrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r.status == "ok" for r in records) else 1


def _local(runner, cases, on_start):
    for case in cases:
        on_start(case)
        yield runner.run_case(case)


# ----------------------------------------------------------------------------- commands

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
                                              help="Also time with: dobench (triton do_bench_cudagraph), profiler (CUPTI kernel time)."),
    l2: Optional[str] = typer.Option(None, "--l2", help="warm (default) or cold (rotate input sets past L2)."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: run shard I of N (0-based); default from "
                                        "SLURM_ARRAY_TASK_ID/COUNT or SLURM_PROCID/NTASKS when set."),
    devices: Optional[str] = typer.Option(None, "--devices", help="all or 0,1,...: one worker process per GPU."),
):
    """Run a sweep: verify every case, time it under CUDA-graph replay, write tables."""
    raise typer.Exit(_run(spec, quick=quick, verify=False, out_dir=out_dir, dry_run=dry_run, interpret=interpret,
                          formats=formats, force=force, resume=resume, cross_check=cross_check, l2=l2, time_it=True,
                          shard=shard, devices=devices))


@app.command()
def verify(
    spec: str = SPEC_ARG,
    quick: bool = typer.Option(False, "--quick", help="Use the spec's reduced verify matrix."),
    out_dir: Path = typer.Option(Path("results"), "--out"),
    interpret: bool = typer.Option(False, "--interpret"),
    force: bool = typer.Option(False, "--force"),
):
    """Run the spec's correctness matrix only; prints e.g. '2280/2280 exact'."""
    raise typer.Exit(_run(spec, quick=quick, verify=True, out_dir=out_dir, dry_run=False, interpret=interpret,
                          formats="json,md", force=force, resume=False, cross_check=None, l2=None, time_it=False))


@app.command()
def validate(paths: list[str] = typer.Argument(..., help="Spec files or names.")):
    """Check specs (syntax, keys, values, expansion) without running anything."""
    from moebench.cases import expand

    from moebench.spec import load_spec

    for p in paths:
        spec = load_spec(p)
        n = len(expand(spec))
        nq = len(expand(spec, quick=True))
        nv = f", verify {len(expand(spec, verify=True))}" if spec.verify else ""
        out.print(f"{spec.path}: ok — {n} cases (quick {nq}{nv})")


@app.command("list")
def list_():
    """Families, variants, built-in sweeps and model configs."""
    from moebench.families import catalogue
    from moebench.spec import builtin_models, builtin_sweeps

    tab = Table(title="Families and variants", title_justify="left")
    for c in ("family", "variant", "launch params", "what it is"):
        tab.add_column(c)
    for fam in catalogue().values():
        tab.add_row(fam.name, "", "", fam.doc + (" (host-only)" if fam.host_only else ""), style="bold")
        for v in fam.variants.values():
            tab.add_row("", v.name, ", ".join(v.params), v.doc)
    out.print(tab)
    out.print("Sweeps: " + ", ".join(p.stem for p in builtin_sweeps()))
    out.print("Model configs: " + ", ".join(p.stem for p in builtin_models()))


@app.command()
def show(
    results: Path = typer.Argument(..., help="A results .json file."),
    rows: Optional[str] = typer.Option(None, "--rows"),
    cols: Optional[str] = typer.Option(None, "--cols"),
    metric: Optional[str] = typer.Option(None, "--metric"),
    reference: Optional[str] = typer.Option(None, "--reference", help="A published table "
                                            "(moebench/reference/NAME.yaml) to print beside the measurement."),
):
    """Print any results file as a PR-style pivot."""
    from moebench.families import catalogue
    from moebench.records import load_results
    from moebench.report import frame, pivots

    prov, records = load_results(results)
    if not records:
        raise UsageError(f"{results}: no records")
    fam = catalogue().get(records[0].family)
    pv = dict(fam.default_pivot) if fam else {}
    rows = rows or pv.get("rows", "label")
    cols = cols or pv.get("cols", "label")
    metric = metric or pv.get("metric", "median_us")
    df = frame(records)
    for name, opt in (("--rows", rows), ("--cols", cols), ("--metric", metric)):
        if opt not in df.columns:
            raise UsageError(f"{name}: no column {opt!r} in {results}; columns: {', '.join(df.columns)}")
    names = list(records[0].params)
    tables = [("measured", title, t) for title, t in pivots(records, rows, cols, metric, names)]
    ref = None
    if reference:
        from moebench.analysis import beside_reference, load_reference

        ref = load_reference(reference)
        if ref.family != records[0].family:
            raise UsageError(f"--reference: {ref.name} is a {ref.family!r} table; {results} is {records[0].family!r}")
        tables = beside_reference(records, ref, rows, cols, metric, names)
        if not tables:
            raise UsageError(f"--reference: no cell of {ref.name} matches a {rows} x {cols} cell of {results}")
    for kind, title, t in tables:
        out.print(render_table(f"{prov.get('sweep', results.stem)}: {metric}" + (f" ({title})" if title else ""),
                               t, "x_ratio" if kind == "ratio" else metric, f"{rows} \\ {cols}"))
    if ref is not None:
        out.print(f"reference: {ref.title} — {ref.source}", highlight=False)
    dev = prov.get("device", {}).get("name")
    if dev:
        out.print(f"device: {dev}; command: {prov.get('command')}")


@app.command()
def render(results: Path = typer.Argument(..., help="A results .json file; its .md is written beside it.")):
    """Re-render a results file's markdown page with this version's report code (no re-run)."""
    from moebench.records import atomic_write_text, load_results
    from moebench.report import sweep_markdown
    from moebench.spec import load_spec

    prov, records = load_results(results)
    if not records or "sweep" not in prov:
        raise UsageError(f"{results}: no records or no provenance to render")
    spec = load_spec(prov["sweep"])
    if spec.sha256 != prov.get("spec_sha256"):
        err.print(f"note: sweeps/{prov['sweep']}.yaml changed since {results} was written; "
                  "its description and pivot are today's")
    timed = any(r.timing.get("median_us") is not None for r in records)
    md = sweep_markdown(spec, records, prov, metric=None if timed or spec.family.host_only else "ref_check")
    dest = results.with_suffix(".md")
    atomic_write_text(dest, md)
    out.print(f"Wrote {dest}")


@app.command()
def device(
    out_dir: Path = typer.Option(Path("results"), "--out", help="Where the ceilings cache lives."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure again even if cached."),
):
    """The GPU, its clocks, and the measured copy ceilings and empty-kernel floor."""
    from moebench.device import ceilings_path, load_or_measure_ceilings, nvml_clocks

    info = _select_backend(False)
    if info.backend != "cuda":
        raise BackendError("no CUDA device is visible: nothing to measure (kernels would run under the interpreter)")
    clocks = nvml_clocks()
    c = load_or_measure_ceilings(info, out_dir, remeasure=remeasure)
    tab = Table(title=info.name, title_justify="left", show_header=False)
    rows = [
        ("SMs", info.sm_count), ("L2", f"{info.l2_bytes / 2**20:.0f} MiB"),
        ("max threads / SM", info.max_threads_per_sm), ("memory", f"{info.total_mem_bytes / 2**30:.0f} GiB"),
        ("compute capability", info.compute_capability),
        ("SM clock now / max", f"{clocks['sm_mhz']} / {clocks['sm_max_mhz']} MHz"),
        ("memory clock now / max", f"{clocks['mem_mhz']} / {clocks['mem_max_mhz']} MHz"),
        ("driver / CUDA", f"{info.driver} / {info.cuda}"), ("torch / triton", f"{info.torch} / {info.triton}"),
        ("copy, DRAM (2 GiB src)", f"{c['copy_dram_gbps']:,.0f} GB/s (read + write)"),
        ("copy, L2-resident", f"{c['copy_l2_gbps']:,.0f} GB/s ({c['copy_l2_bytes'] / 2**20:.0f} MiB moved)"),
        ("empty kernel, grid 1", f"{c['empty_us']:.3f} µs (graph replay)"),
        (f"empty kernel, grid {info.sm_count}", f"{c['empty_sms_us']:.3f} µs (graph replay)"),
    ]
    for k, v in rows:
        tab.add_row(k, str(v))
    out.print(tab)
    out.print(f"cached in {ceilings_path(out_dir, info)}")


def _register_extra_commands() -> None:
    """Commands that live in their own modules (analysis, sharding) register here, once."""
    import importlib

    if STATE.get("registered"):
        return
    STATE["registered"] = True
    for mod in ("moebench.cli_analysis", "moebench.cli_dist"):
        try:
            importlib.import_module(mod).register(app)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def main() -> None:
    _register_extra_commands()
    try:
        rc = app(standalone_mode=False)  # click hands typer.Exit's code back in this mode
        sys.exit(rc if isinstance(rc, int) else 0)
    except MoebenchError as e:
        if STATE["verbose"]:
            import traceback

            traceback.print_exc()
        err.print(f"error: {e}" if not isinstance(e, Interrupted) else str(e), markup=False, highlight=False,
                  soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        sys.exit(130)
    except Exception as e:  # click usage errors (typer may vendor click) and anything unexpected
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # a click UsageError / BadParameter
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            err.print("aborted")
            sys.exit(130)
        if STATE["verbose"]:
            raise
        err.print(f"internal error: {type(e).__name__}: {e} (run with -v for the traceback)", markup=False,
                  soft_wrap=True)
        sys.exit(3)

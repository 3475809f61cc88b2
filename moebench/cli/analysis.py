"""Commands that decide from numbers over moebench.analysis: `ab` (which hands the schedule a run
driver per arm), `compare`, `recommend`, `plot`, `conformance`; all but `ab` run without torch."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from moebench.analysis import by_case, params_text, read_results, results_json_layout
from moebench.analysis.ab import (OFF, ON, ABPair, ab_document, ab_pairs, arm_environ, arm_order, check_ab,
                                  parse_setting, run_arms, settings_text)
from moebench.analysis.comparable import differences, file_noise
from moebench.analysis.compare import check_times, compare_files, metric_direction
from moebench.analysis.pages import builtin_family
from moebench.analysis.plot import plot_counters, plot_results
from moebench.analysis.recommend import (check_cases, decide, emit_document, env_text, explain, judge_check,
                                         recommend_keys, regret_table)
from moebench.analysis.reference import load_reference, reference_names
from moebench.cli.common import (DEFAULT_OUT, FOREIGN_OPT, MARKDOWN_OPT, MEGATRON_OPT, NOISE_OPT, PLUGIN_OPT, STATE, Bar,
                                 comma_list, cuda_device, err, gate_exit, out, print_markdown, print_rows, use_sources)
from moebench.cli.info import REFERENCE_OPT
from moebench.cli.run import OUTPUT, QUICK_OPT, RUN, SPEC_ARG
from moebench.core.cases import expand
from moebench.core.driver import Driver, Summary, run_sweep
from moebench.core.pipeline import Options, check_environment
from moebench.core.provenance import provenance, run_settings
from moebench.core.spec import PACKAGE_ROOT, load_spec
from moebench.core.store import OutputLock, atomic_write_text, output_file, writable_dir
from moebench.core.text import num, printable
from moebench.errors import ExitCode, UsageError
from moebench.report.pr import ab_page
from moebench.report.conformance import page as conformance_page, rows as conformance_rows, twins
from moebench.report.ties import NOT_TAKEN

app = typer.Typer()

# The options of the arms, in `ab` and `pr`.
ARMS = "The arms"  # their panel in --help
ARMS_OPT = typer.Option(4, "--arms", rich_help_panel=ARMS, help="Arms in total, alternating OFF/ON (even, >= 2).")
ITERS_OPT = typer.Option(5, "--iters", rich_help_panel=ARMS, help="Timed measurements per arm and case (>= 2).")


# ============================================================================ commands


@app.command(short_help="Interleaved OFF/ON A/B of two configurations.")
def ab(
    spec: str = SPEC_ARG,
    off: Optional[list[str]] = typer.Option(None, "--off", rich_help_panel=ARMS, help="KEY=VAL (a spec "
                                            "parameter) or env:NAME=VAL for the control arms; repeat for several."),
    on: Optional[list[str]] = typer.Option(None, "--on", rich_help_panel=ARMS, help="KEY=VAL or env:NAME=VAL "
                                           "for the candidate arms."),
    arms: int = ARMS_OPT,
    iters: int = ITERS_OPT,
    quick: bool = QUICK_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", rich_help_panel=RUN, help="List the OFF/ON pairs and the "
                                 "schedule, run nothing."),
    out_dir: Path = typer.Option(DEFAULT_OUT, "--out", rich_help_panel=OUTPUT, help="Results root; files go to "
                                 "OUT/<device>/."),
    markdown: bool = typer.Option(False, "--markdown", rich_help_panel=OUTPUT, help="With --dry-run: the plan as a "
                                  "markdown pipe table (a run always prints its PR-ready markdown block)."),
    force: bool = typer.Option(False, "--force", rich_help_panel=OUTPUT, help="Replace NAME-ab.json and .md if "
                               "they exist."),
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
):
    """Interleaved A/B of two configurations (OFF/ON/OFF/ON in one process): per-arm means, arm
    separation, pooled sd, effect in noise units, per-step projection, and a PR-ready markdown block."""
    use_sources(plugin, megatron_lm, interpret=None if dry_run else False)
    sp, offs, ons, pairs = ab_setup(spec, off, on, arms=arms, iters=iters, quick=quick)
    if dry_run:
        print_ab_plan(sp, pairs, offs, ons, arms=arms, iters=iters, markdown=markdown)
        return
    device = cuda_device("ab", "run it on a GPU machine, or pass --dry-run for the plan")
    dest, stem = ab_outputs(sp, pairs, offs, ons, device, out_dir=out_dir, kind="ab", quick=quick, force=force)
    md = run_ab(sp, device, dest, stem, pairs, offs, ons, arms=arms, iters=iters, quick=quick)
    print_ab_results(pairs, md, dest, stem)


def ab_settings(sp, texts, side: str) -> list:
    """An arm's KEY=VALs (--off, --on) as settings of the spec's family."""
    return [parse_setting(t, sp.family, f"--{side.lower()}") for t in texts or ()]


def ab_setup(spec: str, off, on, *, arms: int, iters: int, quick: bool, settings=ab_settings):
    """The spec, the arms' settings and the OFF/ON pairs of an A/B (`ab`, `pr`), checked before
    anything runs: a host-only family has nothing to time; `settings(sp, texts, side)` reads an
    arm's KEY=VALs; the pairs' notes go to stderr."""
    sp = load_spec(spec)
    if sp.family.host_only:
        raise UsageError(f"family {sp.family.name!r} is evaluated on the host: there is nothing to time")
    offs, ons = settings(sp, off, OFF), settings(sp, on, ON)
    check_ab(offs, ons, arms=arms, iters=iters)
    pairs, notes = ab_pairs(sp, expand(sp, quick=quick), offs, ons)
    for n in notes:
        err.print(n, style="yellow", highlight=False)
    return sp, offs, ons, pairs


def ab_outputs(sp, pairs: list[ABPair], offs, ons, device, *, out_dir: Path, kind: str, quick: bool,
               force: bool) -> tuple[Path, str]:
    """Before any arm runs: each arm's environment checked once, and OUT/<device>/NAME-KIND.json and
    .md of an earlier run (another pair of arms) not replaced unasked; their folder and stem."""
    for side, cases in ((offs, [p.off for p in pairs]), (ons, [p.on for p in pairs])):
        check_environment(sp, cases, device, arm_environ(side, os.environ))  # the arms' drivers do not check again
    dest, stem = out_dir / device.slug, f"{sp.name}-{kind}" + ("-quick" if quick else "")
    for suffix in ("json", "md"):
        output_file(dest / f"{stem}.{suffix}", force=force, option="--out")
    return writable_dir(dest, "--out"), stem


def timed_arms(sp, device, pairs: list[ABPair], offs, ons, *, arms: int, iters: int, title: str) -> tuple[list, dict]:
    """The interleaved arms over `pairs`, each arm a fresh run driver with its environment, on a
    progress bar: the records and the A/B document (ab_document)."""
    def make_runner(environ):  # one driver per arm, with that arm's environment
        return Driver(sp, device, Options(timing=sp.timing, time_it=True, traceback=STATE["verbose"]),
                      environ=environ)

    with Bar(title, arms * iters * len(pairs)) as bar:
        def step(a, side, i, p):
            if a or i or p is not pairs[0]:
                bar.advance()
            bar.note(f"arm {a + 1} {side} i{i + 1} {p.text}")

        records = run_arms(pairs, offs, ons, arms=arms, iters=iters, make_runner=make_runner, on_step=step,
                           environ=os.environ)
        bar.advance()
    return records, ab_document(offs, ons, arms=arms, iters=iters, layers=sp.model.get("moe_layers"), pairs=pairs)


def print_ab_plan(sp, pairs: list[ABPair], offs, ons, *, arms: int, iters: int, markdown: bool = False) -> None:
    layers = sp.model.get("moe_layers")
    print_rows(f"{sp.name} A/B: {len(pairs)} cases x {arms} arms ({arm_order(arms)}) x {iters} iterations",
               ["case", "OFF case id", "ON case id"], [[p.text, p.off.id, p.on.id] for p in pairs], markdown,
               left=("case", "OFF case id", "ON case id"))
    print_markdown(f"OFF: {settings_text(offs)}; ON: {settings_text(ons)}; per-step projection: "
                   + (f"x {layers} MoE layers ({sp.model_name})" if layers else "none (no moe_layers in the model)"))


def run_ab(sp, device, dest: Path, stem: str, pairs: list[ABPair], offs, ons, *, arms: int, iters: int,
           quick: bool) -> str:
    """Run the arms under the output's lock and write the results JSON and the page; returns the page."""
    with OutputLock(dest, stem):  # held until the files are written
        records, doc = timed_arms(sp, device, pairs, offs, ons, arms=arms, iters=iters, title=f"{sp.name} A/B")
        prov = provenance(sp, device, quick=quick, verify=False, ceilings={}, extra={"timed": True, "ab": doc})
        atomic_write_text(dest / f"{stem}.json", results_json_layout(prov, records))
        md = ab_page(prov, records)
        atomic_write_text(dest / f"{stem}.md", md)
    return md


def print_ab_results(pairs: list[ABPair], md: str, dest: Path, stem: str) -> None:
    """The page for the PR (the A/B table and the argument per case); exit 1 when a case failed."""
    print_markdown(md)
    out.print(f"Wrote {dest / stem}.json, {dest / stem}.md")
    failed = [p for p in pairs if p.errors]
    for p in failed:
        err.print(Text.assemble(("failed", "red"), f" {p.text}: {p.errors[0]}"
                                + (f" (+{len(p.errors) - 1} more)" if len(p.errors) > 1 else "")))
    raise typer.Exit(ExitCode.CASE_FAILED if failed else ExitCode.OK)


@app.command(short_help="Per case SAME / FASTER / SLOWER / NOISY / UNCLEAR; a CI gate.")
def compare(
    base: Path = typer.Argument(..., help="Results .json (or .partial.jsonl) of the baseline run."),
    new: Path = typer.Argument(..., help="Results .json (or .partial.jsonl) of the run to judge."),
    threshold: float = typer.Option(5.0, "--threshold", help="Smallest change worth flagging, in percent."),
    fail_on_regression: bool = typer.Option(False, "--fail-on-regression",
                                            help="CI gate: exit 1 when a case is SLOWER or failed in NEW (whether "
                                                 "BASE has it or not); exit 2 when the files cannot support a "
                                                 "verdict (no shared case, a case of BASE missing from NEW, a case "
                                                 "without times or noise, an UNCLEAR case)."),
    metric: str = typer.Option("median_us", "--metric", help="Column to compare: a time (*_us, lower is better), "
                               "x_floor, or a throughput (gbps, speedup: higher is better)."),
    allow_unclear: bool = typer.Option(False, "--allow-unclear", help="Let UNCLEAR cases through the gate."),
    strict_noise: bool = typer.Option(False, "--strict-noise", help="Fail the gate (exit 2) on NOISY cases too: "
                                      "those whose measured noise is too wide to resolve the threshold."),
    allow_settings: bool = typer.Option(False, "--allow-settings", help="Compare files timed under other timer "
                                        "settings (L2, groups, placements, ...) or kill switches."),
    allow_device: bool = typer.Option(False, "--allow-device", help="Compare files timed on other devices."),
    cycles: bool = typer.Option(False, "--cycles", help="Compare in SM clock cycles (µs x each record's MHz)."),
    noise: str = NOISE_OPT,
    allow_foreign_model: bool = FOREIGN_OPT,
    markdown: bool = MARKDOWN_OPT,
):
    """Per case (matched by case_id): SAME / FASTER / SLOWER / NOISY / UNCLEAR (--markdown: a pipe table).

    d = (new - base) / base on the median; noise n = sqrt(nb² + nn²), each a record's within-run
    half-width with a run-to-run term in quadrature: the one the noise model its file names gives
    for the case (path and sha256 verified), or an assumed one of at most 0.5%, widened to --noise's
    model. A record's rel_noise must equal hypot(rel_noise_within, rerun_rel), or the file is
    refused (exit 2). FASTER/SLOWER when |d| >= threshold and |d| > n; SAME when |d| + n <
    threshold; NOISY when |d| <= n, both terms measured and each run precise (within-run half-widths
    under the threshold) but n too wide for SAME; UNCLEAR otherwise, or without a noise estimate.

    Files timed on other devices or under settings that change the number (timer settings, kill
    switches; a stream's are read from its header) stop with exit 2 unless --allow-device /
    --allow-settings; the gate fails on UNCLEAR unless --allow-unclear, and passes NOISY cases
    naming them (--strict-noise fails them). Confirm a SLOWER with `moebench ab`."""
    if not (0 < threshold < 1000):
        raise UsageError(f"--threshold: expected a percentage > 0, got {threshold:g}")
    rep, notes = compare_files(base, new, threshold=threshold / 100, metric=metric, cycles=cycles, noise=noise,
                               allow_settings=allow_settings, allow_device=allow_device,
                               allow_foreign_model=allow_foreign_model)
    for n in notes + rep.notes:
        err.print(n, style="yellow", highlight=False, soft_wrap=True)
    if rep.rows:
        print_rows(f"{base.name} → {new.name}: {metric}" + (" in cycles" if cycles else ""), *_compare_rows(rep),
                   markdown, left=("case", "variant", *rep.vary, "verdict", "note"))
    print_compare_notes(rep, threshold, metric)
    out.print(rep.summary(), style="bold", highlight=False)
    if not rep.rows:
        raise UsageError(f"{base} and {new} share no case_id: nothing to compare")
    raise typer.Exit(compare_gate(rep, allow_unclear=allow_unclear, strict_noise=strict_noise) if fail_on_regression else 0)


def compare_gate(rep, *, allow_unclear: bool, strict_noise: bool = False) -> int:
    """--fail-on-regression: the gate's exit code, said on stderr; a file that cannot support a
    verdict is exit 2 (the gate fails closed). A pass with NOISY cases names them."""
    code, why = rep.gate(allow_unclear=allow_unclear, strict_noise=strict_noise)
    return gate_exit("--fail-on-regression", code, why, closed="; the gate fails closed", noted=bool(rep.noisy))


def print_compare_notes(rep, threshold: float, metric: str) -> None:
    """Under the comparison table: the cases only one side has, both noise models, the rule."""
    vary = rep.vary
    for name, recs in (("BASE", rep.only_base), ("NEW", rep.only_new)):
        if recs:
            out.print(f"Only in {name} ({len(recs)}): " + "; ".join(
                f"{r.case_id} {r.label} {params_text(r.params, vary)}" for r in recs[:20])
                + (f"; ... {len(recs) - 20} more" if len(recs) > 20 else ""), highlight=False)
    out.print(f"Noise model: BASE {rep.noise_models['BASE']}; NEW {rep.noise_models['NEW']}.", style="dim",
              highlight=False)
    out.print(f"Rule: SLOWER/FASTER when |Δ| ≥ {threshold:g}% and |Δ| > noise"
              + (f" ({metric}: higher is better)" if rep.higher_is_better else "")
              + f"; SAME when |Δ| + noise < {threshold:g}%; NOISY when |Δ| ≤ noise but noise is too wide for SAME"
              + "; else UNCLEAR (moebench compare --help).", style="dim")


@app.command(short_help="The robust (minimax-regret) configuration; --emit the launch values a runtime reads.")
def recommend(
    results: str = typer.Argument(..., help="A results .json file, or ref:NAME for a published table ("
                                  + ", ".join(reference_names()) + ")."),
    over: Optional[str] = typer.Option(None, "--over", help="Shape parameter(s) to take the worst case over, "
                                       "comma-separated (default: the family's pivot columns, e.g. tokens)."),
    by: Optional[str] = typer.Option(None, "--by", help="What is being chosen, comma-separated (default: the "
                                     "variant and the varying launch parameters, e.g. block_size)."),
    weights: Optional[str] = typer.Option(None, "--weights", help="How much each shape matters, e.g. "
                                          "256=0.7,16384=0.3 (needs a single --over); with --emit, the workload mix."),
    metric: str = typer.Option("median_us", "--metric", help="Time column (lower is better: *_us, cycles, x_floor)."),
    markdown: bool = MARKDOWN_OPT,
    emit: Optional[str] = typer.Option(None, "--emit", help="env or json: the kill-switch values a runtime reads "
                                       "(MCORE_COUNT_TOKENS_BLOCK, MCORE_MOE_ACTIVATION_GRID_CAP) for the mix, a value "
                                       "only where it beats the shipped default with separated intervals, else the "
                                       "default and why; with the device, driver, commit and the evidence."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="With --emit: the file to write (default: "
                                          "print it)."),
    variant: Optional[str] = typer.Option(None, "--variant", help="With --emit: the measured variant whose times "
                                          "stand for the runtime's kernel (default: the upstream one, or the only one)."),
    check: bool = typer.Option(False, "--check", help="With --emit: re-run the variants that read each emitted "
                               "switch (on this GPU) without and with the emitted environment, and say whether the "
                               "predicted gain held; exit 1 if not, 2 if it cannot be checked here."),

    force: bool = typer.Option(False, "--force", help="With -o: replace the file if it exists."),
):
    """The robust configuration: worst-case regret (time / per-shape best - 1) of each configuration
    across the swept shapes, and the minimax-regret choice; with --weights, the expected regret too.
    With --emit: the launch values a runtime reads, for the mix (--weights, default all shapes alike)."""
    prov, records = read_results(results)
    metric_direction(metric, lower_only=True)
    by_case(records, str(results), "recommend")
    check_times(records, str(results), metric)  # a zero, negative or non-numeric time is refused
    fam = builtin_family(records[0].family)  # a reader never imports a plugin
    if emit is not None or check or output is not None or variant is not None:
        raise typer.Exit(_emit(results, prov, records, fam, emit, output, variant, check, over, weights, metric, force))
    ov, cfg, grp = recommend_keys(records, fam, comma_list(over), comma_list(by))
    recs = regret_table(records, ov, cfg, grp, metric=metric, weights_text=weights)
    name = prov.get("sweep") or Path(results).stem
    dev = (prov.get("device") or {}).get("name")
    for rec in recs:
        title = (f"{name}: regret of {metric} across {', '.join(ov)}"
                 + (f" ({', '.join(f'{k}={v}' for k, v in zip(grp, rec.group))})" if grp else "") + (f" on {dev}" if dev else ""))
        head, rows = _regret_rows(rec)
        print_rows(title, head, rows, markdown, left=(head[0], "choice"))
        print_markdown("\n".join(("- " if markdown else "") + printable(line) for line in explain(rec)) + "\n")


def _emit(results, prov, records, fam, emit, output, variant, check, over, weights, metric, force) -> int:
    """recommend --emit: decide, optionally --check on this GPU, write or print the file."""
    if emit not in ("env", "json"):
        raise UsageError(f"--emit: expected env or json, got {emit!r}" if emit else
                         "--output, --variant and --check go with --emit env|json")
    if output is not None:
        output_file(output, inputs=[results], force=force)
    decisions = decide(records, fam, over=comma_list(over), weights_text=weights, variant=variant, metric=metric,
                       noise=file_noise(prov, records, None if str(results).startswith("ref:") else Path(results)))
    checked = _check_emitted(results, prov, records, fam, decisions) if check else None
    doc = emit_document(decisions, prov, str(results), checked)
    text = env_text(doc) if emit == "env" else json.dumps(doc, indent=1, default=str) + "\n"
    if output is None:
        out.print(text, highlight=False, soft_wrap=True, end="")
    else:
        atomic_write_text(output, text)
        for d in decisions:
            out.print(f"{d.switch.var}={d.value}: {d.reason}", highlight=False)
        out.print(f"Wrote {output}", highlight=False)
    for c in checked or []:
        (err if c["verdict"] != "held" else out).print(f"check {c['variable']}={c['value']}: {c['verdict']}: "
                                                        f"{c['text']}", highlight=False)
    verdicts = {c["verdict"] for c in checked or []}
    return 2 if "cannot check here" in verdicts else 1 if "did not hold" in verdicts else 0


def _check_emitted(results, prov, records, fam, decisions) -> list[dict]:
    """--check: each emitted switch's readers, run here without and with the emitted environment.
    The environment is a mapping handed to the run, never os.environ."""
    emitted = [d for d in decisions if d.emit]
    if not emitted:
        return [{"variable": d.switch.var, "value": d.value, "variant": "", "verdict": "nothing to check",
                 "text": "the default is kept: no emitted value to confirm"} for d in decisions]
    device = cuda_device("--check: cannot check here", "run it on the GPU the results came from")
    # a spec a results file names is never loaded (loading runs its plugins): moebench's own sweep of
    # that name only
    name = prov.get("sweep")
    own = sorted(q.stem for q in (PACKAGE_ROOT / "sweeps").glob("*.yaml"))
    if not isinstance(name, str) or name not in own:
        raise UsageError(f"--check: {results} was not made from one of moebench's own sweeps ({', '.join(own)}); "
                         "a spec named by a results file is never loaded")
    spec = load_spec(str(PACKAGE_ROOT / "sweeps" / f"{name}.yaml"))
    variables = {sw.var for sw in (d.switch for d in decisions)}
    base_env = {k: v for k, v in os.environ.items() if k not in variables}
    diff = differences(prov, {"settings": run_settings(spec, device, timed=True, cross=(), environ=base_env)})
    if diff.device or diff.number:
        raise UsageError(f"--check: {results} was timed on another device or under other settings than this GPU "
                         f"runs {name} with ({'; '.join(diff.device + diff.number)}): the check would measure "
                         "something else")
    out_rows: list[dict] = []
    for d in emitted:
        cases = check_cases(d, fam, records)
        without = run_cases(spec, cases, device, base_env)
        with_env = run_cases(spec, cases, device, {**base_env, d.switch.var: str(d.value)})
        out_rows += judge_check(d, cases, without, with_env)
    return out_rows


def run_cases(spec, cases, device, environ) -> list:
    """The one place `recommend --check` runs kernels: `cases` timed under `environ` (the kill
    switches the variants read), records in case order, through the run driver."""
    summary = None
    for ev in run_sweep(spec, cases, Options(timing=spec.timing, time_it=True), device, environ=environ):
        if isinstance(ev, Summary):
            summary = ev
    return list(summary.records) if summary is not None else []


@app.command(short_help="Block-size or occupancy curves as a PNG.")
def plot(
    results: str = typer.Argument(..., help="A results .json file, or ref:NAME for a reference table."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="PNG to write (default: out/FOLDER/NAME.png "
                                          "for RESULTS FOLDER/NAME.json, never beside a committed results file)."),
    force: bool = typer.Option(False, "--force", help="Replace the PNG if it exists."),
    reference: Optional[str] = REFERENCE_OPT,
    x: Optional[str] = typer.Option(None, "--x", help="Parameter on the (log2) x axis (default by family: "
                                    "block_size for count, grid_cap for act)."),
    series: Optional[str] = typer.Option(None, "--series", help="One line per value of this parameter (default "
                                         "by family: tokens for count, live_rows for act)."),
    metric: str = typer.Option("median_us", "--metric", help="Column on the y axis (lower is better)."),
    counters: bool = typer.Option(False, "--counters", help="The measured occupancy curve instead: µs and the "
                                  "achieved occupancy (from sweep --counters) beside the arithmetic one; default "
                                  "output RESULTS-counters.png."),
):
    """Draw the results as curves: the block-size curve (count) or the occupancy curve, µs and × floor
    against the grid cap (act), with an optional published reference beside them."""
    prov, records = read_results(results)
    by_case(records, str(results), "plot")  # a point is one case's number
    ref = load_reference(reference) if reference else None
    if output is None:
        if str(results).startswith("ref:"):
            raise UsageError("-o: name the PNG to write when plotting a reference alone")
        output = DEFAULT_OUT / Path(results).resolve().parent.name / Path(results).with_suffix(".png").name
        output = output.with_name(output.stem + "-counters.png") if counters else output
    if output.suffix.lower() != ".png":
        raise UsageError(f"-o: expected a .png path, got {output}")
    output_file(output, inputs=[results], force=force)
    if counters:
        if ref is not None:
            raise UsageError("--counters: the measured occupancy has no published reference; drop --reference")
        drawn = plot_counters(records, prov, output, x=x, series=series)
    else:
        drawn = plot_results(records, prov, output, reference=ref, x=x, series=series, metric=metric)
    what = f"{drawn.series} line(s), {drawn.points} point(s)"
    if ref is not None:
        what += f"; {ref.label} dashed, {drawn.reference_points} point(s)"
    out.print(f"Wrote {drawn.path} — {drawn.title.split(': ', 1)[-1]}: {what}; panels: {', '.join(drawn.panels)}",
              highlight=False)
    for n in drawn.notes:
        err.print(n, style="yellow")


# ============================================================================ helpers


def _compare_rows(rep) -> tuple[list[str], list[list]]:
    """compare's per-case table: the compared values (µs, cycles with --cycles, or the metric), the
    change, the combined noise, the verdict, and both in cycles where the records carry a clock."""
    vary, cycles, metric = rep.vary, rep.cycles, rep.metric
    unit = "cycles" if cycles else ("µs" if metric.endswith("_us") else metric)
    show_cyc = not cycles and any(r.base_cycles is not None or r.new_cycles is not None for r in rep.rows)
    head = (["case", "variant"] + vary + [f"BASE {unit}", f"NEW {unit}", "Δ %", "noise ±%", "verdict"]
            + (["cycles BASE / NEW"] if show_cyc else []) + ["note"])
    colour = {"SAME": "", "FASTER": "green", "SLOWER": "red", "NOISY": "magenta", "UNCLEAR": "yellow"}
    fmt = ".0f" if cycles else ".3f"
    rows = []
    for r in rep.rows:
        cyc = [f"{num(r.base_cycles, '.0f')} / {num(r.new_cycles, '.0f')}"] if show_cyc else []
        rows.append([r.case_id, r.label, *[str(r.params.get(k)) for k in vary], num(r.base_us, fmt),
                     num(r.new_us, fmt), f"{100 * r.diff:+.2f}" if r.diff is not None else "—",
                     f"{100 * r.noise:.2f}" if r.noise is not None else "—",
                     Text(r.verdict, colour.get(r.verdict, "")), *cyc, r.note])
    return head, rows


def _regret_rows(rec) -> tuple[list[str], list[list[str]]]:
    """Cells: the time, and its regret against the shape's best ("best" for the winner; "tie" where the
    fastest's interval overlaps others', on each of them), printable."""
    single = len(rec.over_keys) == 1
    corner = " / ".join(rec.config_keys) + (f" \\ {rec.over_keys[0]}" if single else "")
    head = [corner] + [str(s[0]) if single else rec.shape_text(s) for s in rec.shapes] + ["worst", "at"]
    if rec.weights:
        head.append("weighted")
    head.append("choice")
    rows = []
    for c in rec.configs:
        cells = [", ".join(NOT_TAKEN if v is None else str(v) for v in c.config)]
        for s in rec.shapes:
            t = c.times.get(s)
            if t is None:
                cells.append("✗")
            elif rec.best[s][0] == c.config:
                cells.append(f"{t:.2f} " + ("tie" if s in c.ties else "best"))
            else:
                cells.append(f"{t:.2f} +{100 * c.regrets[s]:.1f}%" + (" tie" if s in c.ties else ""))
        cells.append(f"{100 * c.worst:.1f}%" if math.isfinite(c.worst) else "∞")
        cells.append(str(c.worst_at[0]) if single and c.worst_at else rec.shape_text(c.worst_at))
        if rec.weights:
            cells.append(f"{100 * c.weighted:.1f}%" if c.weighted is not None and math.isfinite(c.weighted) else "∞")
        mark = []
        if c is rec.robust:
            mark.append("robust")
        if rec.weighted_choice is not None and c is rec.weighted_choice:
            mark.append("weighted")
        cells.append(", ".join(mark))
        rows.append(cells)
    return head, rows  # text from a results file: print_rows makes it printable


@app.command(short_help="Seed kernels beside their upstream twins, across results files.")
def conformance(
    results: list[Path] = typer.Argument(..., help="Results .json files of sweeps that ran upstream variants "
                                         "beside the seed kernels (e.g. count-grid, act-upstream)."),
    output: Path = typer.Option(..., "-o", "--output", help="Path prefix: writes PREFIX.csv, PREFIX.json and "
                                "PREFIX.md."),
    force: bool = typer.Option(False, "--force", help="Replace PREFIX.csv, .json and .md if they exist."),
):
    """Seed kernels beside their upstream twins: for every pair of moebench's kernel and Megatron's at
    the same shape and launch in one run, the time ratio, bit-exactness and whether the ratio is within
    the family's tolerance (count 5%, act 3%). Exit 1 when a pair is not bit-exact, 2 when the files
    hold no pair at all (nothing was compared)."""
    import pandas as pd  # heavy: only for the csv this command writes

    base = output.with_suffix("") if output.suffix in (".md", ".csv", ".json") else output
    files = [base.with_name(f"{base.name}.{ext}") for ext in ("json", "csv", "md")]
    for f in files:
        output_file(f, inputs=results, force=force)
    pairs, sources = [], []
    for f in dict.fromkeys(results):  # a file given twice is read once
        prov, records = read_results(f)
        sources.append((str(f), prov))
        pairs += twins(records)
    if not pairs:
        raise UsageError(f"no twin pairs: nothing to compare in {', '.join(map(str, results))} (a seed kernel and "
                         "its upstream twin at the same shape and launch, from one run); nothing written")
    doc = {"sources": [{"file": f, "provenance": p} for f, p in sources], "pairs": conformance_rows(pairs)}
    atomic_write_text(files[0], json.dumps(doc, indent=1, default=str) + "\n")
    atomic_write_text(files[1], pd.DataFrame(conformance_rows(pairs)).to_csv(index=False))
    atomic_write_text(files[2], conformance_page(pairs, sources))
    timed = [p for p in pairs if p.ratio is not None]
    off = [p for p in timed if p.within is False]
    out.print(f"{len(pairs)} twin pairs, {sum(p.exact for p in pairs)} bit-exact; "
              + (f"{len(timed) - len(off)}/{len(timed)} within tolerance" if timed else "no timings"), style="bold",
              highlight=False)
    out.print(f"Wrote {base}.csv, {base}.json, {base}.md", highlight=False)
    raise typer.Exit(ExitCode.OK if all(p.exact for p in pairs) else ExitCode.CASE_FAILED)

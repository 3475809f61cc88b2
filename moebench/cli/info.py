"""Commands that read specs, the catalogue, the device or results files: `validate`, `list`, `show`,
`render`, `device`. Every one but `device` runs without torch."""

from __future__ import annotations

import json
import textwrap
import traceback
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moebench.analysis import by_case
from moebench.analysis.compare import add_cycles
from moebench.analysis.pages import page_spec
from moebench.analysis.reference import load_reference, reference_names
from moebench.cli.common import (DEFAULT_OUT, MARKDOWN_OPT, MEGATRON_OPT, PLUGIN_OPT, STATE, cuda_device, err,
                                 listing_console, out, print_markdown, print_pivot, use_sources)
from moebench.core.cases import expand
from moebench.core.device import ceilings_path, load_or_measure_ceilings, nvml_clocks
from moebench.core.family import broken, catalogue, family_error
from moebench.core.records import load_results
from moebench.core.spec import builtin_models, builtin_sweeps, load_spec
from moebench.core.store import atomic_write_text, page_problem, page_text, writable_dir
from moebench.core.text import printable
from moebench.errors import ExitCode, SpecError, Unavailable, UsageError
from moebench.report.catalogue import default_text, family_doc, variant_rows
from moebench.report.sweep import frame, pivots, sweep_markdown
from moebench.sources import upstream

app = typer.Typer()
REFERENCE_OPT = typer.Option(None, "--reference", help="A published table to set beside the measurement (a plot "
                             "draws it dashed): " + ", ".join(reference_names()) + ".")


@app.command(short_help="Check specs without running anything.")
def validate(paths: list[str] = typer.Argument(..., help="Spec files or names."),
             plugin: Optional[list[Path]] = PLUGIN_OPT):
    """Check specs (syntax, keys, values, expansion) without running anything: every one given, each
    a line (ok, or its errors); exit 2 when any is wrong."""
    use_sources(plugin, None)
    bad = 0
    for p in paths:
        try:
            spec = load_spec(p)
            n, nq = len(expand(spec)), len(expand(spec, quick=True))
            nv = f", verify {len(expand(spec, verify=True))}" if spec.verify else ""
        except SpecError as e:  # the others are still checked (validate sweeps/*.yaml in CI)
            if STATE["verbose"]:
                traceback.print_exc()
            err.print(f"error: {e}", highlight=False, soft_wrap=True)
            bad += 1
            continue
        out.print(f"{spec.path}: ok — {n} cases (quick {nq}{nv})")
    if bad:
        raise typer.Exit(ExitCode.USAGE)


@app.command("list", short_help="Families, variants, upstream kernels, sweeps, model configs, references; "
             "or one family's parameters.")
def list_(
    family: Optional[str] = typer.Argument(None, metavar="[FAMILY]", help="A family: every parameter its builders "
                                           "receive, the variants, their kill switches and sources."),
    as_json: bool = typer.Option(False, "--json", help="Print the families (or FAMILY) as JSON."),
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
    try_import: bool = typer.Option(False, "--import", help="Import each upstream kernel (needs torch; megatron-core "
                                    "is slow to import) instead of only finding it in the source."),
):
    """Families, variants (with where each comes from), upstream kernels, built-in sweeps, model
    configs and the shipped reference tables; with FAMILY, every parameter a builder of that family
    receives (shape or launch, type, default, meaning), what it adds at resolve time, its rules and
    its variants with their parameters, kill switches and sources. Plain text, wrapped to the
    terminal (LIST_PIPE_WIDTH columns in a pipe), nothing cut."""
    use_sources(plugin, megatron_lm)
    con = listing_console()
    if family is not None or as_json:
        docs = [family_doc(_family(family))] if family is not None else [family_doc(f) for f in catalogue().values()]
        if as_json:
            print_markdown(json.dumps(docs[0] if family is not None else {"families": docs}, indent=2, default=str))
        else:
            print_family(con, docs[0])
        return
    lines = ["Families and variants"]
    for fam in catalogue().values():
        lines += _wrap(fam.name + ("" if fam.origin == "builtin" else f" ({fam.origin})"), con.width, "", "    ")
        lines += _wrap(fam.doc + (" (host-only)" if fam.host_only else ""), con.width, "    ", "    ")
        lines += [x for v in variant_rows(fam) for x in _variant_lines(v, con.width)]
    con.print("\n".join(lines), highlight=False)  # rich wraps the lines left longer than the console
    for name, why in broken().items():  # a family or installed plugin that failed: listed, not used, one line
        con.print(f"{name}: BROKEN: {why}", highlight=False, soft_wrap=True)
    lines = []
    statuses = [upstream.status(name) for name in upstream.KERNELS]
    if not any(st.present for st in statuses):  # one reason for all: say it once
        lines.append(f"Upstream kernels ({', '.join(st.attr for st in statuses)}): none found: {statuses[0].why}")
    else:
        lines.append("Upstream kernels (for the upstream variants):")
        for st in statuses:
            lines += _wrap(f"{st.attr}: {_upstream_state(st, try_import)} ({st.source or '—'})", con.width, "  ")
    lines += ["Sweeps: " + ", ".join(p.stem for p in builtin_sweeps()),
              "Model configs: " + ", ".join(p.stem for p in builtin_models()),
              "References (published tables for show/plot --reference NAME, recommend ref:NAME): "
              + ", ".join(reference_names())]
    con.print("\n".join(lines), highlight=False)  # rich wraps the lines left longer than the console


def _upstream_state(st, try_import: bool) -> str:
    """An upstream kernel's state for `list`: found in the source, or (--import) whether it imports."""
    if not (try_import and st.present):
        return "found in the source" if st.present else st.why
    try:
        upstream.load(st.name)
        return "imports"
    except Unavailable as e:
        return str(e)


def _family(name: str):
    """A family by name for `list FAMILY`; an unknown one is a usage error listing the families."""
    cat = catalogue()
    if name not in cat:
        raise UsageError(family_error(name) or f"list: unknown family {name!r}; families: {', '.join(cat)}")
    return cat[name]


def print_family(con, doc: dict) -> None:
    """`list FAMILY` as plain text wrapped to the console: a line per parameter (name, shape or
    launch, type, default) with its meaning under it, what resolving adds, the rules, the variants."""
    width = con.width
    lines = [f"{doc['family']} ({doc['origin']}): {doc['doc']}", "",
             "Parameters: what a builder gets as params[NAME] (a launch parameter the variant does not take is None)"]
    w = max(len(r["name"]) for r in doc["params"])
    for r in doc["params"]:
        lines.append(f"  {r['name']:<{w}}  {r['role']:<6}  {r['type']:<5}  default {default_text(r)}")
        lines += _wrap("; ".join(x for x in (r["help"], f"accepts {r['accepts']}") if x), width, "      ")
    if doc["added_at_resolve"]:
        lines += ["", "Added to params when a case is resolved:"]
        for r in doc["added_at_resolve"]:
            lines += _wrap(f"{r['name']} (variants: {', '.join(r['variants'])}): {r['help']}", width, "  ")
    if doc["rules"]:
        lines += ["", "Rules:"] + [x for r in doc["rules"] for x in _wrap(f"{r['rule']}: {r['why']}", width, "  ")]
    lines += ["", "Variants:"] + [x for v in doc["variants"] for x in _variant_lines(v, width)]
    con.print("\n".join(lines), highlight=False)  # rich wraps the lines left longer than the console


def _variant_lines(v: dict, width: int) -> list[str]:
    """A variant (catalogue.variant_rows) for `list`: its source, launch parameters and kill switches, then its doc."""
    switches = "".join(f"; {k} from ${s['variable']}, shipped default {s['shipped_default']}"
                       for k, s in v["kill_switches"].items())
    return (_wrap(f"{v['name']} ({v['source']}; launch params: {', '.join(v['params']) or 'none'}{switches})", width, "  ")
            + _wrap(v["doc"], width, "      "))


def _wrap(text: str, width: int, first: str, rest: str = "      ") -> list[str]:
    """`text` wrapped to `width`, its first line indented by `first`, the others by `rest`, never
    inside a word (a variable name, a path)."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False)


@app.command(short_help="Any results file as a PR-style pivot.")
def show(
    results: Path = typer.Argument(..., help="A results .json file."),
    rows: Optional[str] = typer.Option(None, "--rows", help="Parameter along the rows (default: the family's pivot, "
                                       "e.g. block_size)."),
    cols: Optional[str] = typer.Option(None, "--cols", help="Parameter along the columns (default: the family's "
                                       "pivot, e.g. tokens)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Column in the cells (default: the family's, e.g. "
                                         "median_us; ref_check for a file without timings)."),
    reference: Optional[str] = REFERENCE_OPT,
    markdown: bool = MARKDOWN_OPT,
):
    """Print any results file as a PR-style pivot (--markdown: as pipe tables to paste), by default
    the one its page uses (the spec's pivot, recorded in the file)."""
    prov, records = load_results(results)
    if not records:
        raise UsageError(f"{results}: no records")
    by_case(records, str(results), "show")  # a pivot cell holds one case's number
    add_cycles(records)  # timing.cycles (median µs x the case's SM clock) where a clock is recorded
    pv = page_spec(prov, records).pivot  # the file's own pivot, else its (built-in) family's default
    given = {"rows": rows, "cols": cols}
    rows = rows or pv.get("rows", "label")
    cols = cols or pv.get("cols", "label")
    df = frame(records)
    if metric is None:
        metric = pv.get("metric", "median_us")
        if metric not in df.columns and "ref_check" in df.columns:
            why = "no timings: an interpreter or verify run" if "median_us" not in df.columns else \
                "the pivot's metric is not one of its columns"
            err.print(f"note: {results} has no {metric} ({why}); showing ref_check, the correctness check (--metric "
                      "picks another column)", highlight=False, soft_wrap=True)
            metric = "ref_check"
    for name, opt in (("rows", rows), ("cols", cols), ("metric", metric)):
        if opt not in df.columns:  # named as the user gave it: the option, or the file's own pivot
            where = f"--{name}" if given.get(name, opt) else f"{results}: provenance.page.pivot.{name}"
            raise UsageError(f"{where}: no column {opt!r} in {results}; columns: {', '.join(df.columns)}")
    names = list(records[0].params)
    tables = [("measured", title, t) for title, t in pivots(records, rows, cols, metric, names)]
    ref = None
    if reference:
        ref, tables = _beside_reference(results, records, reference, rows, cols, metric)
    for kind, title, t in tables:
        print_pivot(f"{prov.get('sweep', results.stem)}: {metric}" + (f" ({title})" if title else ""), t,
                    "x_ratio" if kind == "ratio" else metric, f"{rows} \\ {cols}", markdown)
    if ref is not None:
        out.print(f"reference: {ref.title} — {ref.source}", highlight=False)
    dev = prov.get("device", {}).get("name")
    if dev:
        out.print(printable(f"device: {dev}; command: {prov.get('command')}"), highlight=False)


def _beside_reference(results: Path, records: list, reference: str, rows: str, cols: str, metric: str):
    """show --reference: the published table and the pivots that set the measurement beside it."""
    from moebench.report.sweep import beside_reference  # pandas

    ref = load_reference(reference)
    if ref.family != records[0].family:
        raise UsageError(f"--reference: {ref.name} is a {ref.family!r} table; {results} is {records[0].family!r}")
    tables = beside_reference(records, ref, rows, cols, metric, list(records[0].params))
    if not tables:
        raise UsageError(f"--reference: no cell of {ref.name} matches a {rows} x {cols} cell of {results}")
    return ref, tables


@app.command(short_help="Rewrite a results file's page with today's report code.")
def render(results: Path = typer.Argument(..., help="A results .json file; its .md is written beside it."),
           force: bool = typer.Option(False, "--force", help="Replace a page that another spec made, that shows "
                                      "more records, or that moebench did not write.")):
    """Re-render a results file's markdown page with this version's report code (no re-run), from
    the results file alone: no spec file is read and no plugin imported. The results of `moebench ab`
    or `moebench pr` are refused: their pages are the ones those commands write. The page beside it is
    replaced only when it is this spec's and shows no more records (else --force)."""
    dest = results.with_suffix(".md")
    if results.suffix.lower() == ".md" or dest.resolve() == results.resolve():
        raise UsageError(f"{results}: render writes the page beside a results .json, so it would overwrite its own "
                         "input; give the .json")
    prov, records = load_results(results)
    if not records or "sweep" not in prov:
        raise UsageError(f"{results}: no records or no provenance to render")
    made_by = "pr" if "pr" in prov or any("pr_run" in r.timing for r in records) else \
        "ab" if "ab" in prov or any("ab_side" in r.timing for r in records) else None
    if made_by:
        raise UsageError(f"{results}: the results of `moebench {made_by}`; render writes sweep pages and would replace "
                         f"its page {dest.name}: not rendered (run `moebench {made_by}` again to remake it)")
    why = None if force else page_problem(dest, prov, len(records))
    if why:
        raise UsageError(why)
    spec = page_spec(prov, records)
    for note in spec.notes:
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    md = sweep_markdown(spec, records, prov)
    atomic_write_text(dest, page_text(md, prov, len(records)))
    out.print(f"Wrote {dest}", highlight=False)


@app.command(short_help="The GPU, its clocks, copy ceilings, empty-kernel floor.")
def device(
    out_dir: Path = typer.Option(DEFAULT_OUT, "--out", help="Results root: the ceilings are cached in "
                                 "OUT/<device>/device.json, where sweeps into the same OUT read them."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure again even if cached."),
):
    """The GPU, its clocks, and the measured copy ceilings and empty-kernel floor."""
    info = cuda_device("device", "nothing to measure")
    writable_dir(out_dir / info.slug, "--out")
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

"""`moebench history add | show | check`: a results history in one SQLite file, and change points
across it (moebench.analysis.history). Runs without torch."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from moebench.analysis import REF_PREFIX, read_results
from moebench.analysis.history import (WINDOW, add_results, case_text, check as run_check, open_db, order_notes,
                                       restate_with, series)
from moebench.cli.common import DEFAULT_OUT, FOREIGN_OPT, MARKDOWN_OPT, NOISE_OPT, err, gate_exit, out, print_rows
from moebench.core.cases import varying_params
from moebench.errors import UsageError

app = typer.Typer(no_args_is_help=True,
                  help="A results history in one SQLite file (DB), and change points across it.")

DB_OPT = typer.Option(DEFAULT_OUT / "history.sqlite", "--db", help="The history database (SQLite; made by `add`).")
SWEEP_OPT = typer.Option(None, "--sweep", help="Only this sweep's cases.")


@app.command(short_help="Store results files (provenance and every record).")
def add(
    results: list[Path] = typer.Argument(..., help="Results .json files (or .partial.jsonl) to store."),
    db: Path = DB_OPT,
):
    """Store each results file with its provenance, one transaction per file. One run is stored once:
    a file sharing measurements with a stored run (its stream, its final file, a resumed run)
    replaces it when it holds more timed records, else is skipped, so adding again is harmless;
    several `add` may run at once. A/B files, a record whose noise parts disagree and values of the
    wrong type are refused (exit 2)."""
    loaded = []
    for f in results:  # every file read before the database is touched: a bad one adds nothing
        if str(f).startswith(REF_PREFIX):
            raise UsageError(f"{f}: a published reference table, not a run; history stores results files")
        loaded.append((f, *read_results(f)))
    with open_db(db, create=True) as con:
        for f, prov, records in loaded:
            a = add_results(con, str(f), prov, records)
            for n in a.notes:
                err.print(n, style="yellow", highlight=False, soft_wrap=True)
            if not a.new:
                out.print(f"already stored {f}: " + (f"run {a.run_id}" if a.same_as == a.run_id else
                          f"the same run as {a.same_as} (its measurements, with no more timed records)"),
                          highlight=False)
                continue
            out.print(f"added {f}: run {a.run_id}, {a.records} records"
                      + (f", commit {str(prov.get('git_commit'))[:12]}" if prov.get("git_commit") else "")
                      + (f"; replaces run {', '.join(a.replaced)} (the same run, fewer timed records)"
                         if a.replaced else ""), highlight=False)


@app.command(short_help="A case's series across runs (no CASE: the cases stored).")
def show(
    case: Optional[str] = typer.Argument(None, help="A case id (or its first characters); without it, list the "
                                         "cases stored."),
    db: Path = DB_OPT,
    sweep: Optional[str] = SWEEP_OPT,
    markdown: bool = MARKDOWN_OPT,
):
    """One row per run of the case, in run order: commit, device, driver, median, the stated
    interval and the timing method. Without CASE: the cases with their number of runs."""
    with open_db(db) as con:
        found = series(con, sweep=sweep, case=case)
    if not found:
        raise UsageError(f"{db}: no case" + (f" {case!r}" if case else "") + (f" in sweep {sweep!r}" if sweep else "")
                         + "; `moebench history show --db DB` lists the cases")
    if case is None or len(found) > 1:
        keys = varying_params(found)
        head = ["sweep", "case", "params", "runs", "timed", "last µs"]
        rows = [[s.sweep, s.case_id, case_text(s, keys), str(len(s.points)),
                 str(sum(p.median_us is not None for p in s.points)),
                 next((f"{p.median_us:.4g}" for p in reversed(s.points) if p.median_us is not None), "—")]
                for s in found]
        print_rows(f"{db}: {len(found)} cases", head, rows, markdown, left=("sweep", "case", "params"))
        return
    s = found[0]
    head = ["#", "timestamp", "commit", "device", "driver", "µs", "± %", "interval µs", "status", "method"]
    rows = []
    for i, p in enumerate(s.points):
        iv = p.interval
        m = p.method
        rows.append([str(i + 1), p.timestamp or "—", (p.commit or "—")[:10], p.hardware.get("device") or "—",
                     p.hardware.get("driver") or "—", f"{p.median_us:.4g}" if p.median_us is not None else "—",
                     f"{100 * p.rel_noise:.2f}" if p.rel_noise is not None else "—",
                     f"{iv[0]:.4g} – {iv[1]:.4g}" if iv else "—", p.status,
                     " / ".join(str(v) for v in (m.get("timer"), m.get("estimator")) if v) or "—"])
    print_rows(f"{s.sweep} {s.case_id} {case_text(s)}: {len(s.points)} runs", head, rows, markdown,
               left=("timestamp", "commit", "device", "driver", "status", "method"))


@app.command(short_help="Change points per case (E-divisive means); exit 1 on a real regression.")
def check(
    db: Path = DB_OPT,
    sweep: Optional[str] = SWEEP_OPT,
    sig: float = typer.Option(0.05, "--sig", help="Significance level of the permutation test."),
    permutations: int = typer.Option(199, "--permutations", help="Permutations per test."),
    min_step: float = typer.Option(1.0, "--min-step", help="A smaller step (percent) is labelled noise."),
    window: int = typer.Option(WINDOW, "--window", help="Search each case's last N timed runs (4 to 1000): memory per "
                               "series grows with N², about 100 bytes x N², whatever the history's length."),
    markdown: bool = MARKDOWN_OPT,
    noise: str = NOISE_OPT,
    allow_foreign_model: bool = FOREIGN_OPT,
):
    """E-divisive means (Matteson & James 2014, as in MongoDB's CI) on each case's medians in run
    order (UTC instants; where commit ancestry in this git repository disagrees, it is said), over
    its last --window timed runs. Each change point is labelled: hardware/driver change, method
    change (a setting that changes the number; a noise-only one does not), noise (the step lies
    within the stated intervals or the runs' own scatter, or is below --min-step) or real (a
    regression or an improvement). Exit 1 when a real regression is found: a CI gate; exit 2 when
    it vouched for nothing (no case with 4 timed runs) or a case's latest run has no time."""
    with open_db(db) as con:
        found = series(con, sweep=sweep)
        notes = order_notes(con)
    if not found:
        raise UsageError(f"{db}: no records" + (f" of sweep {sweep!r}" if sweep else ""))
    for line in notes:
        err.print(line, style="yellow", highlight=False, soft_wrap=True)
    for line in restate_with(found, noise, allow_foreign=allow_foreign_model):
        out.print(line, highlight=False, soft_wrap=True)
    rep = run_check(found, sig=sig, permutations=permutations, min_step=min_step / 100, window=window)
    keys = varying_params(found)
    head = ["case", "params", "at run", "commit", "before µs", "after µs", "step %", "p", "label", "why"]
    rows = [[c.series.case_id, case_text(c.series, keys), str(c.index + 1), (c.at.commit or "—")[:10],
             f"{c.before_us:.4g}", f"{c.after_us:.4g}", f"{100 * c.step:+.2f}", f"{c.p:.3f}",
             Text(c.label + (f" ({c.direction})" if c.label == "real" else ""), _colour(c)), c.why] for c in rep.changes]
    if rows:
        print_rows(f"{db}: change points", head, rows, markdown, left=("case", "params", "commit", "label", "why"))
    out.print(f"{rep.checked} series checked ({rep.short} with fewer than 4 timed runs skipped); "
              f"{len(rep.changes)} change point(s), {sum(c.label == 'real' for c in rep.changes)} real, "
              f"{len(rep.regressions)} real regression(s)", style="bold", highlight=False)
    code, why = rep.gate()
    raise typer.Exit(gate_exit("history check", code, why))


def _colour(c) -> str:
    return {"real": "red" if c.direction == "regression" else "green", "noise": "dim"}.get(c.label, "yellow")

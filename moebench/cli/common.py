"""What every command module shares: the two consoles, the verbose flag, option parsers, the
backend choice, and rendering a pivot as a terminal table. Printing lives in moebench.cli only.

The consoles never interpret text: markup and emoji codes are off, so a variant label "[/]" or
a path "a:x:b.yaml" prints as written. Colour comes from `style=` and rich Text, never from
markup in a string. In a pipe (CI, a log file) they print at full width: a table is never cut
to 80 columns."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from moebench import startup
from moebench.analysis import GROUPS, metric_of, raw_value
from moebench.core import device as devices
from moebench import tritonpatch
from moebench.core.stats import median
from moebench.core.text import md_table, ordered, printable
from moebench.errors import BackendError, ExitCode, UsageError
from moebench.report.sweep import NOT_TAKEN, NOT_TAKEN_NOTE, STATUS_MARK, page_pivots, pivot_rows
from moebench.sources import plugins, upstream



class _Console(Console):
    def on_broken_pipe(self) -> None:
        """A reader that closed the pipe (`moebench list | head`): rich exits 1, which says a case
        failed; this says what a process the pipe's signal killed would (128 + SIGPIPE)."""
        self.quiet = True
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(ExitCode.INTERRUPTED + signal.SIGPIPE)


out = _Console(markup=False, emoji=False)
err = _Console(stderr=True, markup=False, emoji=False)
# verbose: -v; timings: print the wall table at the end (--timings, -v); signalled: the first signal
# of this command; in_run: inside a run's event loop; pending: a signal that landed in an import
# during a run, raised at the run's next event
STATE: dict = {"verbose": False, "timings": False, "signalled": None, "in_run": False}

# Where runs write unless --out says otherwise: a folder git ignores, so a bare run leaves a clean
# checkout and never touches the committed results/ (reference data, written only when named).
DEFAULT_OUT = Path("out")

# Width of a console that is not a terminal: wide enough that no table or line is ever cut or
# wrapped (rich would otherwise use 80 columns, or the width of whichever std stream is a terminal).
PIPE_WIDTH = 100_000


# Width of `list` in a pipe (`moebench list | less`, a log): its descriptions wrap inside their
# cells instead of making 1,200-character lines.
LIST_PIPE_WIDTH = 100


def listing_console() -> Console:
    """The console `list` prints on: `out` in a terminal, else one LIST_PIPE_WIDTH columns wide."""
    return out if out.is_terminal else _Console(markup=False, emoji=False, width=LIST_PIPE_WIDTH)


def fit_consoles() -> None:
    """Full width for each console whose stream is not a terminal; a terminal keeps its width."""
    for c in (out, err):
        c.width = PIPE_WIDTH if not c.is_terminal else None  # type: ignore[assignment]


def backend(interpret: bool, what: str = "", then: str | None = None) -> bool:
    """Set up the backend a run's kernels need and say whether it is the interpreter (--interpret,
    TRITON_INTERPRET=1, or no CUDA device): torch and triton imported, and under the interpreter
    TRITON_INTERPRET set before any kernel module (a plugin's too) is imported. With `then`, a
    command (`what`) that needs timings: the interpreter is a BackendError saying what to do."""
    named = f"{what}: " if what else ""
    try:
        import torch  # noqa: F401 - every backend needs it: imported here, in the wall table's backend row

        use_interp = devices.want_interpreter(interpret)
    except ImportError as e:  # torch is not installed in this Python
        raise BackendError(f"{named}{e.name or 'torch'} is not importable here; `make install` sets up .venv with "
                           "it") from None
    if use_interp and then is not None:
        raise BackendError(f"{named}no CUDA device is visible (the Triton interpreter on the CPU checks correctness "
                           f"only, and this needs timings); {then}")
    if use_interp:
        tritonpatch.interpret()
    devices.require_triton()
    return use_interp


def select_backend(interpret: bool, what: str = "", then: str | None = None):
    """The device a run uses: the CUDA device, or the Triton interpreter on the CPU (`backend`)."""
    use_interp = backend(interpret, what, then)
    with startup.phase("device (CUDA init, properties, NVML)"):
        return devices.detect(use_interp)


def cuda_device(what: str, then: str):
    """The CUDA device that `what` times on; a BackendError saying what to do (`then`) without one."""
    return select_backend(False, what, then)


class Signalled(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so a run stops between cases and keeps what it finished."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def second_interrupt(signum, _frame) -> None:
    """A second Ctrl-C (or SIGTERM) while the first one winds the run down: leave at once. Every
    finished record is already in the stream (fsynced) and result files are only ever renamed
    into place whole, so nothing is lost; unwinding again would only print tracebacks from the
    middle of the shutdown (torch's atexit hooks)."""
    startup.exit_now(signum, "interrupted again: stopping now; completed records are in the .partial.jsonl stream "
                             "(rerun with --resume)")


def _importing(frame) -> bool:
    """Whether `frame` (where a signal landed) is inside an import statement's work."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def first_interrupt(signum, frame) -> None:
    """The first Ctrl-C or SIGTERM: raised as KeyboardInterrupt where it lands (a run stops between
    cases and keeps what it finished), except in the middle of an import, where unwinding would
    leave a module half imported (later code then fails on it) or meet a library's bare `except`
    that swallows it. There it waits: in a run (`in_run`), until the run's next event
    (`raise_pending`); elsewhere nothing is written yet, so the command leaves at once."""
    STATE["signalled"] = signum
    signal.signal(signal.SIGINT, second_interrupt)
    signal.signal(signal.SIGTERM, second_interrupt)
    if _importing(frame):
        if STATE.get("in_run"):
            STATE["pending"] = signum
            return
        startup.exit_now(signum)
    _raise(signum)


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Signalled(signum)


def raise_pending() -> None:
    """Raise an interrupt that arrived while it could not be raised (or that something swallowed):
    a run calls this at each event, so no signal is lost."""
    signum = STATE.pop("pending", None) or STATE.get("signalled")
    if signum:
        _raise(signum)


def install_interrupts() -> None:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt (a run stops between cases and keeps what it
    finished); a second one exits at once (`second_interrupt`). Main thread only, where signals arrive."""
    if threading.current_thread() is threading.main_thread():
        STATE["signalled"] = None
        signal.signal(signal.SIGINT, first_interrupt)
        signal.signal(signal.SIGTERM, first_interrupt)


@contextmanager
def in_run() -> Iterator[None]:
    """The span of a run's event loop (main() installed the handlers): a first signal that lands in
    an import there waits for the run's next event (`raise_pending`) instead of ending the command."""
    was = STATE.get("in_run")
    STATE["in_run"] = True
    try:
        yield
    finally:
        STATE["in_run"] = was


def print_pivot(title: str, t, metric: str, corner: str, markdown: bool = False) -> None:
    """A pivot (rows x columns of one metric) as a table (print_rows); failed cells in red."""
    head, rows = pivot_rows(t, metric, corner)
    print_rows(title, head, [[Text(c, "red") if c.startswith("✗") else c for c in r] for r in rows], markdown,
               left=(corner,))


# More pivot tables than this print as one summary; the results page holds them all.
MAX_CONSOLE_TABLES = 4


def print_pivots(spec, records, page: Path | None = None) -> None:
    """The spec's pivots as terminal tables; past MAX_CONSOLE_TABLES, a summary that points to the page."""
    metric, corner, tables = page_pivots(spec, records)
    if len(tables) <= MAX_CONSOLE_TABLES:
        for title, t in tables:
            print_pivot(f"{spec.name}: {metric}" + (f" ({title})" if title else ""), t, metric, corner)
        if any(NOT_TAKEN in str(k) for _, t in tables for k in t.index):
            out.print(NOT_TAKEN_NOTE, style="dim")
        return
    out.print(f"{spec.name}: {metric} of {len(records)} cases in {len(tables)} tables, summed up here"
              + (f"; every table is in {page}" if page else ""))
    print_rows("", *summary_rows(records, metric), False, left=("variant",))


def summary_rows(records, metric: str) -> tuple[list[str], list[list[str]]]:
    """One row per variant label: how often each value of a categorical metric occurs (a path, a
    check verdict), or the least, median and largest value of a numeric one."""
    def value(r):
        if r.status != "ok":
            return STATUS_MARK.get(r.status, r.status)
        return raw_value(r, metric, GROUPS + ("params",))

    labels = ordered(r.label for r in records)
    numeric = all(metric_of(r, metric) is not None for r in records if r.status == "ok") and any(
        r.status == "ok" for r in records)
    if numeric:
        rows = []
        for lab in labels:
            mine = [r for r in records if r.label == lab]
            vals = [metric_of(r, metric) for r in mine if r.status == "ok"]
            rows.append([str(lab), str(len(mine)), *(f"{f(vals):.4g}" if vals else "—" for f in (min, median, max)),
                         str(sum(r.status != "ok" for r in mine))])
        return ["variant", "cases", "min", "median", "max", "failed"], rows
    kinds = ordered(str(value(r)) for r in records)
    rows = []
    for lab in labels:
        mine = [str(value(r)) for r in records if r.label == lab]
        rows.append([str(lab), *(str(mine.count(k)) for k in kinds)])
    return ["variant", *kinds], rows


class Bar:
    """Progress of long work on stderr: a rich bar in a terminal; in a pipe (CI, a log file) a plain
    line every `every` seconds with done/total, the current item and an ETA, so a long run is never
    silent."""

    def __init__(self, description: str, total: int, every: float = 5.0):
        self.description, self.total, self.every = description, total, every
        self.done, self.item = 0, ""
        self._clock = time.monotonic
        self._t0 = self._last = self._clock()
        self._rich = None
        if err.is_terminal:
            self._rich = Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[item]}", markup=False), console=err, transient=True)
            self._task = self._rich.add_task(description, total=total, item="")

    def __enter__(self) -> "Bar":
        if self._rich is not None:
            self._rich.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def note(self, item: str) -> None:
        self.item = item
        self._show()

    def describe(self, description: str) -> None:
        self.description = description
        self._show(force=True)

    def advance(self) -> None:
        self.done += 1
        self._show(force=self.done == self.total)

    def _show(self, force: bool = False) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=self.description, item=self.item, completed=self.done)
            return
        now = self._clock()
        if not force and now - self._last < self.every:
            return
        self._last = now
        elapsed = now - self._t0
        eta = ""
        if 0 < self.done < self.total:
            eta = f", ETA {elapsed / self.done * (self.total - self.done):.0f} s"
        err.print(f"{self.description}: {self.done}/{self.total} done, {elapsed:.0f} s{eta}"
                  + (f"; now {self.item}" if self.item and self.done < self.total else ""),
                  highlight=False, soft_wrap=True)


def print_failures(records, vary=()) -> None:
    """One line per case that did not pass, on stderr: status, case id, label, the varying
    parameters, the first line of the error. Unavailable cases (a kernel source not here) are
    one line per variant and reason."""
    missing: dict[tuple, int] = {}
    for r in records:
        if r.status == "unavailable":
            key = (r.label, r.error.splitlines()[0] if r.error else "")
            missing[key] = missing.get(key, 0) + 1
    for (label, why), n in missing.items():
        err.print(f"unavailable: {n} case{'s' if n != 1 else ''} of {label}: {why}", highlight=False, soft_wrap=True)
    for r in records:
        if r.status not in ("ok", "unavailable"):
            shown = ", ".join(f"{k}={v}" for k, v in r.params.items() if k in vary and v is not None)
            err.print(f"{r.status}: {r.case_id} {r.label}" + (f" [{shown}]" if shown else "")
                      + f": {r.error.splitlines()[0] if r.error else ''}", highlight=False, soft_wrap=True)


def exit_code(records, complete: bool = True) -> int:
    """A command's exit code from its records: 1 when a case failed (a record neither ok nor
    unavailable) or the records are not complete, else 0."""
    failed = not complete or any(r.status not in ("ok", "unavailable") for r in records)
    return ExitCode.CASE_FAILED if failed else ExitCode.OK


def gate_exit(name: str, code: int, why: str, *, closed: str = "", noted: bool = False) -> int:
    """A gate's exit code and why (`rep.gate()`), said on stderr under `name`: 2 is a UsageError
    (`why`, then `closed`), 1 is said in red; a pass that names what it did not vouch for (`noted`)
    in yellow."""
    if code == 2:
        raise UsageError(f"{name}: {why}{closed}")
    if code:
        err.print(f"{name}: {why}", style="red")
    elif noted:
        err.print(f"{name}: {why}", style="yellow", highlight=False, soft_wrap=True)
    return code


def comma_list(text: str | None) -> list[str]:
    """The items of a comma list (`a, b,,c` -> a, b, c): stripped, empty ones left out."""
    return [s.strip() for s in (text or "").split(",") if s.strip()]


# Options of the commands that print tables (show, compare, recommend, ab): markdown to paste into a PR.
MARKDOWN_OPT = typer.Option(False, "--markdown", rich_help_panel="Output", help="Print the tables as markdown pipe "
                            "tables, ready to paste into a pull request, instead of terminal tables.")


# Options of the commands that judge stated intervals (compare, history check).
NOISE_OPT = typer.Option("auto", "--noise", help="The device noise model (scripts/repro.py calibrate) whose run-to-run "
                         "terms widen the stated ones (max of the two), as the timer states them: auto (default) finds "
                         "results/<device>/noise/<sweep>.json of the repository for the runs' device and sweep, none "
                         "keeps each file's own, or a model file (refused when measured on another device or for "
                         "another sweep).")
FOREIGN_OPT = typer.Option(False, "--allow-foreign-model", help="Use a --noise model measured on another device or "
                           "for another sweep (said on stderr).")


def print_markdown(text: str) -> None:
    """Markdown on stdout as written: never wrapped (a wrapped row is no longer a table row), no
    highlighting."""
    out.print(text, highlight=False, soft_wrap=True)


def print_rows(title: str, head: list[str], rows: list[list], markdown: bool, *, left=()) -> None:
    """A table on stdout: a markdown pipe table under its title in bold (`markdown`), else a terminal
    table with the columns named in `left` aligned left, the others right. Text cells are made
    printable (they come from results files); a rich Text cell keeps its colour on the terminal."""
    title = printable(title)
    if markdown:
        print_markdown(f"**{title}**\n\n" + md_table(head, [[str(c) for c in r] for r in rows]) + "\n")
        return
    t = Table(title=title, title_justify="left")
    for h in head:
        t.add_column(printable(h), justify="left" if h in left else "right")
    for r in rows:
        t.add_row(*[c if isinstance(c, Text) else printable(c) for c in r])
    out.print(t)


# Options shared by the commands that run or list kernels.
SOURCES = "Plugins and sources"  # their panel in a command's --help
PLUGIN_OPT = typer.Option(None, "--plugin", rich_help_panel=SOURCES, help="A Python file that registers variants or "
                          "families (repeatable); see README 'Measure your own kernel' and docs/plugins.md.")
MEGATRON_OPT = typer.Option(None, "--megatron-lm", rich_help_panel=SOURCES, help="A Megatron-LM checkout to import the "
                            "upstream kernels from (sets $MOEBENCH_MEGATRON_LM); default: the installed megatron-core.")


def use_sources(plugin_files, megatron_lm, interpret: bool | None = None) -> None:
    """Point the upstream imports at a checkout and run the plugin files, before any spec is read.
    A command that runs kernels passes `interpret`: the backend is decided first, since @triton.jit
    in a plugin (or a spec's plugin) reads TRITON_INTERPRET when the file runs."""
    if interpret is not None:
        with startup.phase("backend (import torch, triton)"):
            try:
                backend(interpret)
            except BackendError:  # no torch or triton here: only a host-only family can run, and it needs neither
                pass
    if megatron_lm is not None:
        if not megatron_lm.is_dir():
            raise UsageError(f"--megatron-lm: {megatron_lm}: not a directory; give a Megatron-LM checkout (the "
                             "folder that holds megatron/core)")
        os.environ[upstream.ENV] = str(megatron_lm.resolve())
    with startup.phase("plugins"):
        plugins.use(plugin_files)


def print_timings() -> None:
    """The wall table on stderr: where this command's time went, from the process's start."""
    rows = startup.wall_rows()
    total = rows[-1][1] or 1.0
    tab = Table(title="Where the wall time went (--timings)", title_justify="left")
    for c, j in (("stage", "left"), ("s", "right"), ("share", "right")):
        tab.add_column(c, justify=j)
    for name, s in rows:
        tab.add_row(name, f"{s:.3f}", f"{100 * s / total:.1f}%", style="bold" if name == "total" else None)
    err.print(tab)

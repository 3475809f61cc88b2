"""The moebench command line (README's "Commands"): one Typer app assembled from one sub-app per
command group, each command thin: parse -> call the library -> render. main() turns errors and
signals into the exit codes of moebench.errors.ExitCode."""

from __future__ import annotations

from moebench import startup

if startup.is_the_command():  # the console script: SIGTERM/Ctrl-C exit 143/130 during the imports below too
    startup.exit_on_signals()

import signal
import sys
import traceback

import typer
from rich.markup import escape

from moebench.cli import analysis, history, info, parallel, pr, run
from moebench.cli.common import STATE, err, fit_consoles, install_interrupts
from moebench.tritonpatch import leave
from moebench.errors import ExitCode, Interrupted, MoebenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode="rich",
                  help="CUDA-graph microbenchmarks for the small kernels of MoE inference.\n\n"
                       "Exit codes: 0 ok; 1 a case failed; 2 a usage, spec or results-file error; 3 an internal "
                       "error (a bug); 130/143 interrupted (completed records saved).")
for sub in (run.app, info.app, analysis.app, pr.app, parallel.app):
    app.add_typer(sub)
app.add_typer(history.app, name="history")


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks on errors, and where a run's "
                                       "wall time went (as --timings).")):
    STATE["verbose"] = STATE["timings"] = verbose


def command():
    """The click command of `app`, its help made to print as written in rich's panels: markup in
    a help text is escaped (a `[nvbench]` stays), a paragraph's line breaks (a docstring's wrapping)
    are joined, and a flag shows no `<bool>` type beside it."""
    def tidy(cmd) -> None:
        if cmd.help:
            cmd.help = escape("\n\n".join(" ".join(p.split()) for p in cmd.help.split("\n\n")))
        try:  # click makes the --help option when first asked for it, and keeps it
            help_option = [cmd.get_help_option(cmd.context_class(cmd))]
        except Exception:  # noqa: BLE001 - another click: its --help keeps its look
            help_option = []
        for p in cmd.params + [h for h in help_option if h is not None]:
            if getattr(p, "help", None):
                p.help = escape(p.help)
            if getattr(p, "is_flag", False):
                p.metavar = ""
        for sub in getattr(cmd, "commands", {}).values():
            tidy(sub)

    cmd = typer.main.get_command(app)
    tidy(cmd)
    return cmd


startup.mark("imports (typer, rich, the command line)")  # from moebench's first line to here


def entry() -> None:
    """The console command (`moebench`, `python3 -m moebench`): `main`, then a quick exit (the
    fast_exit patch of moebench.tritonpatch; MOEBENCH_FAST_EXIT=0 keeps the ordinary exit)."""
    code: object = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt as e:  # one that escaped main's handlers: still an interrupt, never a traceback
        # (Python would print one and exit 1 for Signalled, a subclass of KeyboardInterrupt)
        startup.exit_now(getattr(e, "signum", 2))
    leave(code)


def main() -> None:
    fit_consoles()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        install_interrupts()
        _main()
    except SystemExit as e:
        signum = STATE.get("signalled")
        if signum and not (isinstance(e.code, int) and e.code >= ExitCode.INTERRUPTED):
            # a signal something swallowed, or whose exception surfaced as another error: still an interrupt
            err.print("interrupted")
            raise SystemExit(ExitCode.INTERRUPTED + signum) from None
        raise
    finally:
        if STATE.get("signalled"):
            # exiting after a signal: a later one must not interrupt the shutdown. Python resets its
            # own handlers to the default (die) when it finalizes, but leaves an ignored signal ignored.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:  # in-process callers (the tests) get their handlers back
            signal.signal(signal.SIGINT, handlers[0])
            signal.signal(signal.SIGTERM, handlers[1])


def _main() -> None:
    try:
        rc = command()(standalone_mode=False)  # click hands typer.Exit's code back in this mode
        signum = STATE.get("signalled")
        if signum and rc == ExitCode.INTERRUPTED + 2:  # typer turns a KeyboardInterrupt into a silent Exit(130)
            err.print("interrupted")
            sys.exit(ExitCode.INTERRUPTED + signum)
        sys.exit(int(rc) if isinstance(rc, int) else ExitCode.OK)
    except MoebenchError as e:
        if STATE["verbose"]:
            traceback.print_exc()
        err.print(f"error: {e}" if not isinstance(e, Interrupted) else str(e), highlight=False, soft_wrap=True)
        sys.exit(int(e.exit_code))
    except KeyboardInterrupt as e:
        err.print("interrupted")
        sys.exit(ExitCode.INTERRUPTED + getattr(e, "signum", 2))
    except Exception as e:  # click usage errors (typer may vendor click) and anything unexpected
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # a click UsageError / BadParameter
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort" or STATE.get("signalled"):  # click turns an interrupt into Abort
            err.print("interrupted")
            sys.exit(ExitCode.INTERRUPTED + (STATE.get("signalled") or 2))
        loop = "Symlink loop from "  # pathlib's resolve() before Python 3.13, on any path a command is given
        if isinstance(e, RuntimeError) and str(e).startswith(loop) and not STATE["verbose"]:
            where = str(e)[len(loop):].strip("'")
            err.print(f"error: {where}: a loop of symbolic links (one points back to itself); give the "
                      "real file", highlight=False, soft_wrap=True)
            sys.exit(ExitCode.USAGE)
        if STATE["verbose"]:
            traceback.print_exc()  # and still exit 3: -v changes what is said, not the code
        err.print(f"internal error: {type(e).__name__}: {e}" + ("" if STATE["verbose"] else
                  " (run with -v for the traceback)"), soft_wrap=True)
        sys.exit(ExitCode.INTERNAL)

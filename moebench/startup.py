"""Signals before the command line is up: the first thing `moebench` does, before any import.

From its first line `moebench` answers SIGTERM with exit 143 and Ctrl-C with exit 130. Until
`moebench.cli.main` installs the handlers that stop a run between cases (moebench.cli.common), a
signal ends the process at once: nothing has been written yet, and an interrupt raised in the
middle of the start-up imports (typer, rich, pandas, numpy) could leave a module half imported for
later code to trip over (an exit 3), be swallowed by a library's bare `except`, or print a
traceback. Standard library only, and written for any Python 3 (moebench/__main__.py runs it
before checking the interpreter's version).
"""

import os
import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_now(signum, message="interrupted"):
    """Flush what was printed, say `message` on stderr, leave with 128 + signum (no unwinding)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe, a stream already torn down: nothing more to say there
            pass
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass
    os._exit(128 + signum)


def _exit_on_signal(signum, _frame):
    exit_now(signum)


def exit_on_signals():
    """SIGINT and SIGTERM end the process at once with 128 + the signal (main thread only)."""
    for s in SIGNALS:
        try:
            signal.signal(s, _exit_on_signal)
        except ValueError:  # not the main thread: signals are not delivered here anyway
            return


def is_the_command():
    """Whether this process is the `moebench` console script (its wrapper is __main__), not a
    program that imports moebench.cli (the tests): only the command takes over the signals."""
    main = sys.modules.get("__main__")
    return os.path.basename(getattr(main, "__file__", None) or "") == "moebench"

"""The first thing `moebench` does, before any import: signals, and the clock of the wall table.

From its first line `moebench` answers SIGTERM with exit 143 and Ctrl-C with exit 130 at once
(nothing is written yet) until moebench.cli.main installs the handlers that stop a run between
cases; why an interrupt must not unwind through the start-up imports is in
moebench.cli.common.first_interrupt. Standard library only, written for any Python 3
(moebench/__main__.py runs it before checking the interpreter's version). The wall table
(`--timings`, `-v`): `phase`, `mark` and `add` (seconds measured elsewhere) fill its rows;
`wall_rows` lists them.
"""

import os
import signal
import sys
import time
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
T0 = time.perf_counter()  # when moebench's first line ran


def _since_exec():
    """Seconds from this process's start to now, from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            started = float(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return up - started if 0 <= up - started < 60 else None


PYTHON_START = _since_exec()  # the interpreter's start-up before T0 (resolution 10 ms)
_ROWS = {}  # stage -> seconds, in the order the stages first ran


@contextmanager
def phase(name):
    """Time the stage `name` of this command (repeated stages add up)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        _ROWS[name] = _ROWS.get(name, 0.0) + time.perf_counter() - t


def mark(name):
    """The time since the last stage ended, or since T0, that no row holds yet goes to row `name`."""
    _ROWS[name] = _ROWS.get(name, 0.0) + max(0.0, time.perf_counter() - T0 - sum(_ROWS.values()))


def add(name, seconds):
    _ROWS[name] = _ROWS.get(name, 0.0) + seconds


def wall_rows():
    """[(stage, seconds)] from the process's start to now: the interpreter's start-up, the timed
    stages, `other` for the rest, and `total` last; the rows before `total` add up to it."""
    rows = [("python start", PYTHON_START or 0.0)] + list(_ROWS.items())
    total = (PYTHON_START or 0.0) + time.perf_counter() - T0
    rows.append(("other", max(0.0, total - sum(s for _, s in rows))))
    return rows + [("total", total)]


def flush_std():
    """Flush stdout and stderr before an os._exit, skipping one that cannot be."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe (`| head`), a stream already torn down: nothing more to say there
            pass


def exit_now(signum, message="interrupted"):
    """Flush what was printed, say `message` on stderr, leave with 128 + signum (no unwinding)."""
    flush_std()
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

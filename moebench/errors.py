"""Errors a user can fix, and the exit codes. The CLI prints an error as one line and exits with
its `exit_code`."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What `moebench` returns. Interrupted runs return 128 + the signal (130 SIGINT, 143 SIGTERM)."""

    OK = 0
    CASE_FAILED = 1  # a case failed verification or raised; the table marks it
    USAGE = 2  # bad input: a spec, an option, a results file (one line names it)
    INTERNAL = 3  # a bug in moebench (run with -v for the traceback)
    INTERRUPTED = 128  # + signal number


def one_line(text: str, keep: str = "") -> str:
    """Escape line breaks and every other character that does not print (a terminal's escape
    sequences, the bidirectional overrides), all but those in `keep`, so a message stays one
    printable line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def first_line(e: BaseException) -> str:
    """An exception's message as one line: its first line, or its repr when it has no message."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else repr(e)


class MoebenchError(Exception):
    """Base class: a message meant for the user, no traceback needed."""

    exit_code = ExitCode.USAGE


class SpecError(MoebenchError):
    """A spec or config file is wrong: names the file, the key path and what was expected."""

    def __init__(self, path: object, key: str, message: str):
        self.path = one_line(str(path))
        self.key = one_line(str(key))
        self.message = one_line(str(message))
        where = f"{self.path}: {self.key}: " if self.key else f"{self.path}: "
        super().__init__(where + self.message)


class UsageError(MoebenchError):
    """Bad command-line input (unknown name, contradictory options, ...)."""


class BackendError(MoebenchError):
    """The runtime cannot do what was asked (no CUDA device, no triton, ...)."""


class Interrupted(MoebenchError):
    """A run was stopped by a signal; the message says what was kept."""

    def __init__(self, signum: int, message: str):
        self.exit_code = ExitCode.INTERRUPTED + signum
        super().__init__(message)


class Unavailable(Exception):
    """A variant's kernel source is missing here (an upstream kernel that is not installed, a
    plugin's dependency): its cases are recorded as `unavailable` with this message, which says
    what to install or point at. Not a failure: the sweep goes on and exits 0."""


class OutputError(MoebenchError):
    """A results file or folder cannot be written (a file where a folder is meant, no permission,
    the disk full): names the path and the reason, exit 2."""

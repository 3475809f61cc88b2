"""Errors a user can fix. The CLI prints them as one line and exits with `exit_code`."""

from __future__ import annotations


def one_line(text: str) -> str:
    """Escape line breaks and other control characters so a message stays one printable line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class MoebenchError(Exception):
    """Base class: a message meant for the user, no traceback needed."""

    exit_code = 2


class SpecError(MoebenchError):
    """A spec or config file is wrong: names the file, the key path and what was expected."""

    def __init__(self, path: object, key: str, message: str):
        self.path = one_line(str(path))
        self.key = one_line(str(key))
        self.message = one_line(str(message))
        key, message = self.key, self.message
        where = f"{self.path}: {key}: " if key else f"{self.path}: "
        super().__init__(where + message)


class UsageError(MoebenchError):
    """Bad command-line input (unknown name, contradictory options, ...)."""


class BackendError(MoebenchError):
    """The runtime cannot do what was asked (no CUDA device, no triton, ...)."""


class Interrupted(MoebenchError):
    """A sweep was stopped by a signal; completed records were saved."""

    def __init__(self, signum: int, message: str):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message)

"""Your own kernel from a file: plugins register variants of a family, or a whole family, through
the same calls the built-in families use. How one is written, loaded (--plugin, a spec's plugins:,
the `moebench.plugins` entry-point group, $MOEBENCH_PLUGINS) and what its failures do is
docs/plugins.md. Loaded files are listed in $MOEBENCH_PLUGINS too, so the per-GPU worker processes
load the same ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import signal
import sys
import threading
import time
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Callable

from moebench.errors import MoebenchError, UsageError, first_line

ENV = "MOEBENCH_PLUGINS"
GROUP = "moebench.plugins"
LIMIT_ENV = "MOEBENCH_PLUGIN_LIMIT"
DEFAULT_LIMIT_S = 120.0

# (resolved path, suffix) -> (module, sha256 of its bytes); the suffix is "" but for an arm's file
_LOADED: dict[tuple[Path, str], tuple[ModuleType, str]] = {}
_CURRENT: list[str] = []  # the plugin being loaded: what a variant registered now is recorded as
_SUFFIX: list[str] = []  # what the variant names it registers end with ("@on": one arm of `pr`)
_UNDO: list[list[Callable[[], None]]] = []  # per plugin loading now: what takes back what it registered
_INSTALLED = False


def current_source() -> str | None:
    """'plugin FILE' while a plugin file (or entry point) runs, else None."""
    return _CURRENT[-1] if _CURRENT else None


def current_suffix() -> str:
    """What the variant names a plugin file registers now end with: "" but while an arm's file
    runs (`suffix` of load_file)."""
    return _SUFFIX[-1] if _SUFFIX else ""


def on_failure(undo: Callable[[], None]) -> None:
    """While a plugin loads, call `undo` if it then fails: the catalogue (moebench.core.family, a
    floor above) takes back each variant and family a plugin registers this way, so one that fails
    while loading registers nothing (half a file run would leave a variant that runs). Outside a
    plugin's loading, a no-op."""
    if _UNDO:
        _UNDO[-1].append(undo)


def load_file(path: str | Path, where: str = "--plugin", suffix: str = "") -> ModuleType:
    """Run a plugin file once (later calls return the same module). Errors name the file and
    what went wrong, as a UsageError. With a `suffix` (moebench.sources.arms: "@on"), every variant
    it registers is named NAME + suffix, so two files registering one name coexist, and the file is
    left out of $MOEBENCH_PLUGINS (a worker loading it plainly would register the bare name)."""
    p = Path(path).expanduser()
    try:
        key = p.resolve()
    except (OSError, RuntimeError) as e:
        raise UsageError(f"{where}: {path}: cannot resolve ({e})") from None
    if (key, suffix) in _LOADED:
        return _LOADED[key, suffix][0]
    if not key.is_file():
        raise UsageError(f"{where}: {path}: no such file" + ("" if not key.exists() else " (not a regular file)"))
    if key.suffix != ".py":
        raise UsageError(f"{where}: {path}: expected a Python file (.py)")
    limit = import_limit()
    data = key.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    name = f"moebench_plugin_{key.stem.replace('-', '_')}_{digest[:8]}{suffix.replace('@', '_')}"
    spec = importlib.util.spec_from_file_location(name, key)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with _loading(f"plugin {key}", suffix, limit, keep=MoebenchError):
            spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if isinstance(e, _Failed):
            raise UsageError(f"{where}: {path}{_line_of(e.__cause__, key)}: {e}") from None
        raise
    _LOADED[key, suffix] = (module, digest)
    if suffix:
        return module
    listed = [x for x in os.environ.get(ENV, "").split(os.pathsep) if x]
    if str(key) not in listed:
        os.environ[ENV] = os.pathsep.join(listed + [str(key)])
    return module


def use(paths) -> None:
    for p in paths or ():
        load_file(p)


def load_installed() -> dict[str, str]:
    """Load the plugins listed in $MOEBENCH_PLUGINS and the installed entry points, once per
    process. One that fails breaks only itself: returns {"plugin WHERE": its one-line error}."""
    global _INSTALLED
    failed: dict[str, str] = {}
    if _INSTALLED:
        return failed
    _INSTALLED = True
    for p in [x for x in os.environ.get(ENV, "").split(os.pathsep) if x]:
        try:
            load_file(p, where=f"${ENV}")
        except UsageError as e:
            failed[f"plugin {p}"] = str(e)
    for ep in entry_points(group=GROUP):
        source = f"plugin {ep.value} (entry point {ep.name})"
        try:
            with _loading(source, "", import_limit()):
                ep.load()
        except _Failed as e:  # that plugin's error, one line
            failed[source] = f"entry point {ep.name} = {ep.value} ({GROUP}): {e}"
    return failed


def import_limit() -> float:
    """Seconds a plugin may take to load ($MOEBENCH_PLUGIN_LIMIT, default 120; 0 for none)."""
    raw = os.environ.get(LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"${LIMIT_ENV}={raw!r}: expected a number of seconds >= 0 (0: no limit)")
    return value


def _what(e: BaseException, limit: float, arrived: list) -> str | None:
    """What a plugin did wrong while it loaded, as a phrase; None for an interrupt that really
    arrived (a Ctrl-C or SIGTERM while it loaded: the command's to handle)."""
    if isinstance(e, _TooLong):
        return f"still running after {limit:g} s while loading (an endless loop?); ${LIMIT_ENV} sets the limit in seconds"
    if isinstance(e, SystemExit):
        return (f"the plugin called {getattr(e, 'how', 'sys.exit')}({e.code!r}) while loading; a plugin registers "
                "variants or a family and returns")
    if isinstance(e, KeyboardInterrupt):
        if arrived:
            return None
        return ("the plugin raised KeyboardInterrupt while loading, and no interrupt arrived; a plugin registers "
                "variants or a family and returns")
    return f"{type(e).__name__}: {first_line(e)}"


class _Failed(Exception):
    """What a plugin did wrong while it loaded (`_what`), raised from its exception."""


@contextlib.contextmanager
def _loading(source: str, suffix: str, limit: float, keep=()):
    """A plugin loading: what it registers is recorded as `source`, its variants named with
    `suffix`; its time limit, os._exit as an error (user_code). A plugin that fails registers
    nothing: what it registered before failing is taken back (`on_failure`). Any failure but `keep`
    and an interrupt that really arrived meanwhile (noted by _noting_signals; the handler in force
    still runs) comes out as _Failed."""
    _CURRENT.append(source)
    _SUFFIX.append(suffix)
    _UNDO.append([])
    arrived: list = []
    try:
        with time_limit(limit, _TooLong), user_code(), _noting_signals(arrived):
            yield
    except BaseException as e:  # noqa: BLE001 - any failure in a user's file is that file's error, one line
        for undo in reversed(_UNDO[-1]):
            undo()
        if isinstance(e, keep):
            raise
        what = _what(e, limit, arrived)
        if what is None:  # a real Ctrl-C or SIGTERM: the command's own business
            raise
        raise _Failed(what) from e
    finally:
        _CURRENT.pop()
        _SUFFIX.pop()
        _UNDO.pop()


@contextlib.contextmanager
def _noting_signals(arrived: list):
    if threading.current_thread() is not threading.main_thread():
        arrived.append(None)  # no handler can be set here: any interrupt counts as real
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum, frame):
        arrived.append(signum)
        handler = old[signum]
        if callable(handler):
            return handler(signum, frame)
        if handler != signal.SIG_IGN:  # the default action: end the process as the signal would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return None

    for s in old:
        signal.signal(s, note)
    try:
        yield
    finally:
        for s, handler in old.items():
            if signal.getsignal(s) is note:  # a handler the one in force set meanwhile stays
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)


class ExitCalled(SystemExit):
    """What os._exit raises while user code runs (`user_code`): an exit there is that code's error."""

    how = "os._exit"


_REAL_EXIT = os._exit
_guard = threading.Lock()
_guarded = 0  # blocks of user code running now (threads, nesting)


def _exit_as_error(code: int) -> None:
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if caller == "moebench" or caller.startswith("moebench."):  # moebench's own exit (a second Ctrl-C)
        _REAL_EXIT(code)
    raise ExitCalled(code)


@contextlib.contextmanager
def user_code():
    """While the block runs, os._exit called by anything but moebench raises ExitCalled instead of
    ending the process at once, with no files and no message: a plugin loading, or a case's
    builder, launch, input builder or reference, is user code, and an exit there is its error."""
    global _guarded
    with _guard:
        _guarded += 1
        os._exit = _exit_as_error
    try:
        yield
    finally:
        with _guard:
            _guarded -= 1
            if not _guarded:
                os._exit = _REAL_EXIT


class _TooLong(BaseException):
    """Raised inside a plugin still loading at the limit (a BaseException, so the plugin's own
    `except Exception` does not swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float | None, stop: Callable[[], BaseException], every: float = 0.0):
    """Raise stop() in the block once `seconds` have passed, and every `every` seconds after that
    (in case something swallowed the first); SIGALRM, so on the main thread only (elsewhere, or
    without a limit, no limit). A timer already running (a case's limit) is put back with what is
    left of it."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(_signum, _frame):
        raise stop()

    t0 = time.monotonic()
    old = signal.signal(signal.SIGALRM, alarm)
    before = signal.setitimer(signal.ITIMER_REAL, seconds, every)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if before[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(before[0] - (time.monotonic() - t0), 1e-3), before[1])


def loaded() -> list[dict]:
    """The plugin files this process runs, with their hashes, for a results file's provenance."""
    return [{"path": str(p), "sha256": digest, **({"suffix": sfx} if sfx else {})}
            for (p, sfx), (_, digest) in _LOADED.items()]


def _line_of(e: BaseException, path: Path) -> str:
    if isinstance(e, SyntaxError) and e.lineno:
        return f":{e.lineno}"
    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        if Path(fr.filename) == path:
            return f":{fr.lineno}"
    return ""


def where_in_plugin(e: BaseException) -> str | None:
    """FILE:LINE of the innermost frame in a plugin file this process loaded, in `e`'s traceback or
    those of the exceptions it was raised from, or None: where a plugin's error happened."""
    files = {str(p) for p, _ in _LOADED}
    chain: list[BaseException] = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for x in reversed(chain):  # innermost first: the interpreter re-raises a kernel's error as its own
        for fr in reversed(traceback.extract_tb(x.__traceback__)):
            if fr.filename in files:
                return f"{fr.filename}:{fr.lineno}"
    return None

"""Every place moebench changes Triton's own code (or the interpreter's exit), in one module, and
the one place moebench asks Triton what it compiled and launched.

`PATCHES` lists each change and the variable that turns it off; `MOEBENCH_TRITON_PATCHES=0` turns
every one off at once. None touches what a compiled kernel computes; each section below says why it
changes no result.

**Compile accounting** (`specializations()`) asks Triton which kernels it prepared while a block
ran: on a GPU, Triton's `knobs.runtime.jit_post_compile_hook` (called once per specialization this
process compiled or loaded from the disk cache; never for an in-memory cache hit). Under
TRITON_INTERPRET=1 nothing compiles: the interpreter rewrites each `@triton.jit` function's source
once (`InterpretedFunction.rewritten_fn`), so there a "specialization" is a function (a kernel, a
helper, or one of triton.language's own) prepared for the first time, and constexpr values make
no new one.

**Launch accounting**: under the interpreter `launches()` records each kernel a block launched and
how many programs it ran (GridExecutor and `set_grid_dim`, wrapped once, calling through), and
`undefined_names` reads a kernel's code for global names that do not exist (a GPU's compile fails
on those; the interpreter only when the line runs).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import dis
import functools
import hashlib
import importlib
import inspect
import os
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from moebench import startup

ALL_OFF = "MOEBENCH_TRITON_PATCHES"


@dataclass(frozen=True)
class Patch:
    name: str
    env: str  # the variable that turns it off
    off: str  # the value that does


PATCHES = (
    Patch("key_cache", "MOEBENCH_TRITON_KEY_CACHE", "0"),
    Patch("lang_once", "MOEBENCH_LANG_PATCH_ONCE", "0"),
    Patch("no_overflow_checks", "MOEBENCH_OVERFLOW_CHECKS", "1"),
    Patch("scalar_squeeze", "MOEBENCH_SCALAR_SQUEEZE", "0"),
    Patch("fast_exit", "MOEBENCH_FAST_EXIT", "0"),
)
BY_NAME = {p.name: p for p in PATCHES}


def enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether patch `name` may be applied: neither its own switch nor MOEBENCH_TRITON_PATCHES=0."""
    env = os.environ if environ is None else environ
    p = BY_NAME[name]
    if env.get(ALL_OFF, "").strip() == "0":
        return False
    return env.get(p.env, "").strip() != p.off


# --------------------------------------------------------------------------- key_cache
# Before its first compile or cache lookup in a process, Triton computes `triton_key()`: a SHA-256
# of its compiler, backend and language sources and of libtriton.so. The wrapper keeps the key
# Triton computed in a file beside Triton's cache, named by a signature of those files (path, size,
# modification time in ns) and Triton's version, and hands it back while the signature holds; else
# Triton's own function computes it again. The key is Triton's own, byte for byte, so kernels load
# from the same cache entries (Triton's compile warm-up pool hands its key to its workers the same
# way).

_key_installed = False


def _triton(name: str = "triton"):
    """Triton's module `name`, imported when first asked for (every command imports this module, and
    most never import triton), or None where this triton has no such module."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _triton_root() -> Path:
    return Path(_triton().__file__).resolve().parent


def signature(root: Path | None = None) -> str:
    """A hash of what triton_key() reads, by name, size and modification time: runtime/cache.py,
    everything under compiler/, backends/ and language/, and _C/libtriton.<ext>."""
    triton = _triton()
    root = root or _triton_root()
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    files = [root / "runtime" / "cache.py", root / "_C" / f"libtriton.{ext}"]
    for sub in ("compiler", "backends", "language"):
        for d, dirs, names in os.walk(root / sub):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            files += [Path(d) / n for n in sorted(names) if n.endswith(".py")]
    h = hashlib.sha256(f"{triton.__version__}\0{root}\0{ext}".encode())
    for f in files:
        try:
            st = f.stat()
            h.update(f"\0{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"\0{f}\0missing".encode())
    return h.hexdigest()


def cache_dir() -> Path:
    """Triton's cache directory (its knob, else TRITON_CACHE_DIR, else ~/.triton/cache)."""
    d = getattr(getattr(_triton("triton.knobs"), "cache", None), "dir", None)
    if d:
        return Path(d)
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def remembered(compute, where: Path, sig: str) -> str:
    """The key stored under `sig` in `where`, or `compute()`'s, then stored (written whole, by a
    rename: two processes at once both write the same text)."""
    path = where / f"{sig}.key"
    try:
        key = path.read_text()
        if key:
            return key
    except OSError:
        pass
    key = compute()
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".key-")
        with os.fdopen(fd, "w") as f:
            f.write(key)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: Triton's own computation stands, every time
    return key


def install_key_cache() -> bool:
    """Wrap triton.runtime.cache.triton_key (and the autotuner's imported name) once per process.
    Returns whether the wrapper is in place."""
    global _key_installed
    if _key_installed:
        return True
    if not enabled("key_cache"):
        return False
    cache = _triton("triton.runtime.cache")
    original = getattr(cache, "triton_key", None)
    if original is None:
        return False

    @functools.lru_cache(maxsize=None)
    def triton_key() -> str:
        try:
            sig = signature()
        except Exception:  # noqa: BLE001 - any trouble reading the files: Triton's own way
            return original()
        return remembered(original, cache_dir() / "moebench-triton-key", sig)

    cache.triton_key = triton_key
    autotuner = _triton("triton.runtime.autotuner")
    if getattr(autotuner, "triton_key", None) is original:
        autotuner.triton_key = triton_key
    _key_installed = True
    return True


# --------------------------------------------------------------------------- interpreter patches


def interpreting() -> bool:
    """Whether kernels run under Triton's interpreter (TRITON_INTERPRET=1): CPU tensors, correctness only."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def interpret() -> None:
    """Make kernel modules imported from now on run under the interpreter, with its patches."""
    os.environ["TRITON_INTERPRET"] = "1"  # read by @triton.jit at decoration time
    interpreter_patches()


def interpreter_patches() -> dict[str, bool]:
    """Apply the interpreter's patches that are switched on (nothing on a GPU run takes these
    paths). Returns which were installed by this call."""
    it = _triton("triton.runtime.interpreter")
    if it is None:
        return {}
    return {"lang_once": enabled("lang_once") and patch_lang_once(it),
            "scalar_squeeze": enabled("scalar_squeeze") and squeeze_scalars(it),
            "no_overflow_checks": enabled("no_overflow_checks") and skip_overflow_checks(it)}


class _Unpatched:
    """The scope of a nested call that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


def patch_lang_once(it) -> bool:
    """lang_once: the interpreter re-patches triton.language (an inspect.getmembers over several
    modules) on every call of a @triton.jit helper, once per program; here nested calls skip that
    while a launch in this thread has it patched. The launch has already patched those modules and restores them at its
    end, and the nested patches install the same functions. A nested call whose function sees a
    language module the launch did not patch still patches (until the launch ends). True when
    installed now."""
    original = getattr(it, "_patch_lang", None)
    if original is None or getattr(original, "_moebench_once", False) or not hasattr(it, "tl"):
        return False
    state = threading.local()
    langs_of = (it.tl, it.tl.core)

    modules: dict = {}  # fn -> ids of the language modules its globals hold (what a patch of it patches)

    def patch_lang(fn):
        seen = modules.get(fn)
        if seen is None:
            seen = modules[fn] = frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in langs_of))
        active = getattr(state, "patched", None)
        if active is not None and seen <= active:
            return _Unpatched()
        scope = original(fn)
        if active is not None:  # a nested call that saw other modules: patched until the launch ends
            active |= seen
            return scope
        state.patched = set(seen)
        restore = scope.restore

        def restore_all():
            state.patched = None
            restore()

        scope.restore = restore_all
        return scope

    patch_lang._moebench_once = True
    patch_lang._moebench_original = original
    it._patch_lang = patch_lang
    return True


def squeeze_scalars(it) -> bool:
    """scalar_squeeze: where this triton converts a scalar with `int(self.handle.data)` (<= 3.6),
    squeeze the array first, as later releases do (NumPy 2 refuses int() of a 1-element 1-d
    array). True when applied now."""
    patch = getattr(it, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_moebench_squeeze", False):
        return False
    try:
        old = "int(self.handle.data))" in inspect.getsource(patch)
    except (OSError, TypeError):
        return False
    if not old:
        return False

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._moebench_squeeze = True
    it._patch_lang_tensor = patched
    return True


def skip_overflow_checks(it=None) -> bool:
    """no_overflow_checks: with `sanitize_overflow` on (the interpreter's default) every integer add,
    sub and mul is redone in int64 and compared against the int32 range, and the result goes to
    `device_assert`, which returns at once unless `debug` is set (triton/language/semantic.py, 3.6
    to 3.9). With `debug` off, turning it off changes no result and no check; with `debug` on it
    stays on. True when it changed the interpreter's options."""
    it = it or _triton("triton.runtime.interpreter")
    builder = getattr(it, "interpreter_builder", None)
    opts = getattr(builder, "options", None)
    if opts is None or getattr(opts, "debug", True) or not getattr(opts, "sanitize_overflow", False):
        return False
    try:
        builder.options = dataclasses.replace(opts, sanitize_overflow=False)
    except (TypeError, ValueError, AttributeError):
        return False
    return True


# --------------------------------------------------------------------------- fast_exit


def leave(code: object) -> None:
    """End the console command with exit status `code` (what SystemExit carried). fast_exit: every
    results file is renamed into place and every stream closed by now; the process flushes its
    output, ends any worker process still there, and leaves with os._exit, skipping module teardown
    (torch, the CUDA context). Switched off: sys.exit."""
    if not enabled("fast_exit"):
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as Python itself would print it
        print(code, file=sys.stderr)
        code = 1
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        for child in mp.active_children():
            child.terminate()
            child.join(2.0)
    startup.flush_std()
    os._exit(code & 0xFF)


# --------------------------------------------------------------------------- compile accounting

_compiled: list = []  # every specialization Triton reported in this process, in order
_hook_lock = threading.Lock()
_hooked = None  # our recorder while it is the installed hook


def _hook() -> bool:
    """Chain a recorder onto knobs.runtime.jit_post_compile_hook (whatever hook was there still
    runs), again if something replaced it since. False where this triton has no such knob."""
    global _hooked
    with _hook_lock:
        runtime = getattr(_triton("triton.knobs"), "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return False
        before = runtime.jit_post_compile_hook
        if _hooked is not None and before is _hooked:
            return True

        def recorded(*args, **kwargs):
            fn = kwargs.get("fn")
            _compiled.append(("jit", getattr(fn, "module", None), getattr(fn, "name", None), kwargs.get("key")))
            return before(*args, **kwargs) if before is not None else None

        runtime.jit_post_compile_hook = _hooked = recorded
        return True


def _interpreted() -> set:
    fn = getattr(_triton("triton.runtime.interpreter"), "InterpretedFunction", None)
    return set(getattr(fn, "rewritten_fn", {}))


@contextlib.contextmanager
def specializations():
    """Yields a list that, when the block ends, holds one key per specialization Triton prepared
    during the block (see the module's docstring for what that means under the interpreter). A
    compile on another thread at the same moment is counted here too."""
    new: list = []
    _hook()
    start = len(_compiled)
    before = _interpreted()
    try:
        yield new
    finally:
        new.extend(_compiled[start:])
        new.extend(("interpreted", getattr(f, "__module__", None), getattr(f, "__qualname__", repr(f)))
                   for f in _interpreted() - before)


# --------------------------------------------------------------------------- launch accounting

_launch_lists: list[list] = []  # the lists of the `launches()` blocks open now
_grid_hooked = False
_launching = threading.local()


def _hook_grids() -> bool:
    """Wrap the interpreter's GridExecutor.__call__ (which kernel) and interpreter_builder's
    set_grid_dim (how many programs) once; False where this triton has neither."""
    global _grid_hooked
    it = _triton("triton.runtime.interpreter")
    executor, builder = getattr(it, "GridExecutor", None), getattr(it, "interpreter_builder", None)
    if executor is None or not hasattr(builder, "set_grid_dim"):
        return False
    with _hook_lock:
        if not _grid_hooked:
            call, set_grid_dim = executor.__call__, builder.set_grid_dim

            def launch(self, *args, **kwargs):
                _launching.fn = self.fn
                return call(self, *args, **kwargs)

            def grid(nx, ny, nz):
                for got in _launch_lists:
                    got.append((getattr(_launching, "fn", None), nx * ny * nz))
                return set_grid_dim(nx, ny, nz)

            executor.__call__, builder.set_grid_dim = launch, grid
            _grid_hooked = True
    return True


@contextlib.contextmanager
def launches():
    """Yields a list that, when the block ends, holds (kernel function, programs run) for every
    kernel the Triton interpreter launched during the block; nothing on a GPU."""
    got: list = []
    hooked = interpreting() and _hook_grids()
    if hooked:
        _launch_lists.append(got)
    try:
        yield got
    finally:
        if hooked:
            _launch_lists.remove(got)


@functools.lru_cache(maxsize=None)
def undefined_names(fn) -> tuple[tuple[str, int], ...]:
    """(name, line) of each global a kernel's code reads that neither its module nor the builtins
    define: Triton's compiler refuses such a kernel, whether or not the line would run."""
    out, codes = [], [getattr(fn, "__code__", None)]
    scope = getattr(fn, "__globals__", {})
    while codes:
        code = codes.pop()
        if code is None:
            continue
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in scope \
                    and not hasattr(builtins, ins.argval):
                out.append((ins.argval, ins.positions.lineno if ins.positions else code.co_firstlineno))
        codes += [c for c in code.co_consts if hasattr(c, "co_code")]
    return tuple(dict.fromkeys(out))

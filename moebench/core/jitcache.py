"""Triton's cache key, remembered between processes.

Before its first compile or cache lookup in a process, Triton computes `triton_key()`: a SHA-256 of
its own compiler, backend and language sources and of its native library (`libtriton.so`, several
hundred MB). On an H200 machine that took 0.4-0.8 s of every moebench command, before the first
kernel could load from Triton's cache (results/h200/TIMER.md, "Where each command's time goes").

The key changes only when those files do. `install()` wraps Triton's function: the key Triton
computed is kept in a file beside Triton's cache, named by a signature of those files (path, size,
modification time in ns) and Triton's version, and handed back while the signature holds; else
Triton's own function computes it again. The key is Triton's own, byte for byte, so kernels load
from the same cache entries. Triton does the same between its own processes (its compile warm-up
pool hands the parent's key to its workers). MOEBENCH_TRITON_KEY_CACHE=0 turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
import tempfile
from pathlib import Path

ENV = "MOEBENCH_TRITON_KEY_CACHE"
_installed = False


def _triton_root() -> Path:
    import triton

    return Path(triton.__file__).resolve().parent


def signature(root: Path | None = None) -> str:
    """A hash of what triton_key() reads, by name, size and modification time: runtime/cache.py,
    everything under compiler/, backends/ and language/, and _C/libtriton.<ext>."""
    import triton

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
    try:
        from triton import knobs

        d = knobs.cache.dir
        if d:
            return Path(d)
    except (ImportError, AttributeError):
        pass
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


def install() -> bool:
    """Wrap triton.runtime.cache.triton_key (and the autotuner's imported name) once per process.
    Returns whether the wrapper is in place."""
    global _installed
    if _installed:
        return True
    if os.environ.get(ENV, "").strip() == "0":
        return False
    try:
        import triton.runtime.cache as cache
    except ImportError:
        return False
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
    try:
        import triton.runtime.autotuner as autotuner

        if getattr(autotuner, "triton_key", None) is original:
            autotuner.triton_key = triton_key
    except ImportError:
        pass
    _installed = True
    return True

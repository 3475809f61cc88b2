"""Running kernels under Triton's interpreter (TRITON_INTERPRET=1): CPU tensors, correctness only.

Two changes to the interpreter, both applied by `compat` and neither touching a GPU run (compiled
kernels never take these paths).

Speed: the interpreter re-patches triton.language (an `inspect.getmembers` over several modules,
about 1 ms) on every call of a @triton.jit function from inside a kernel (`tl.cdiv`, a helper
such as count's `_count_chunk`), once per call per program. The launch has already patched those
modules and restores them at its end, and the nested patches install the same functions, so
`compat` makes a nested call skip the patch where the modules it sees are already patched in
this thread. A full `verify count-block` spent 78% of its time there.

Compatibility. Triton's interpreter turns a scalar tensor into a Python int (for a loop
bound: `tl.range(pid, n_rows, ...)`) with `int(array)`; up to triton 3.6 that array is a one-
element 1-d array (program ids and loaded scalars have shape (1,)), which NumPy 2 refuses with
"only 0-dimensional arrays can be converted to Python scalars". Later triton releases squeeze the
array first. Where the installed triton still has the old conversion, `enable` applies the same
squeeze; newer triton is left as it is. This changes nothing on a GPU: compiled kernels never
take this path.
"""

from __future__ import annotations

import inspect
import os


def enable() -> None:
    """Make kernel modules imported from now on run under the interpreter."""
    os.environ["TRITON_INTERPRET"] = "1"  # read by @triton.jit at decoration time
    compat()


def active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def compat() -> bool:
    """Apply the speed change, and the scalar-conversion fix if this triton needs it; True when
    the fix was applied."""
    try:
        from triton.runtime import interpreter as it
    except ImportError:
        return False
    patch_once(it)
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


class _Unpatched:
    """The scope of a nested call that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


def patch_once(it) -> bool:
    """Nested @triton.jit calls skip re-patching triton.language while a launch in this thread has
    it patched (see the module's docstring). True when installed now."""
    original = getattr(it, "_patch_lang", None)
    if original is None or getattr(original, "_moebench_once", False) or not hasattr(it, "tl"):
        return False
    import threading

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

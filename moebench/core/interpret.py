"""Running kernels under Triton's interpreter (TRITON_INTERPRET=1): CPU tensors, correctness only.

One compatibility fix. Triton's interpreter turns a scalar tensor into a Python int (for a loop
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
    """Apply the scalar-conversion fix if this triton needs it; True when it was applied."""
    try:
        from triton.runtime import interpreter as it
    except ImportError:
        return False
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

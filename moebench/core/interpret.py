"""Running kernels under Triton's interpreter (TRITON_INTERPRET=1): CPU tensors, correctness only.

`enable` sets the variable (read by @triton.jit when a kernel module is imported) and applies the
interpreter's patches; `compat` applies them alone. The patches themselves, with their reasons,
measured savings and off switches, live in moebench.core.tritonpatch; none changes a GPU run
(compiled kernels never take these paths).
"""

from __future__ import annotations

import os

from moebench.core import tritonpatch


def enable() -> None:
    """Make kernel modules imported from now on run under the interpreter."""
    os.environ["TRITON_INTERPRET"] = "1"  # read by @triton.jit at decoration time
    compat()


def active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def compat() -> dict[str, bool]:
    """Apply the interpreter's patches that are switched on (tritonpatch.interpreter_patches);
    returns which this call installed."""
    return tritonpatch.interpreter_patches()

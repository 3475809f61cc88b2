"""Upstream Megatron kernels, imported at run time where the user has them. Never copied here.

Where they come from (a checkout, else the installed megatron-core) is docs/method.md, 'Beside
Megatron's kernels'. Megatron-LM's main branch has all five seed kernels; megatron-core 0.19.2 has
both count kernels and ``_squared_relu_kernel``, not yet ``_silu_mul_bounded_kernel`` and
``_swiglu_kernel``.

Importing ``megatron.core`` takes about 15 s on an H200 (it pulls in much of Megatron), so nothing
is imported until a case needs a kernel, and then once per process. `status` answers without
importing anything (no torch): it finds the source file and looks for the kernel's definition in
its text, which is what `moebench list` shows. Whether the import then works (Megatron's own
dependencies) is known only at run time; a failed import makes the case `unavailable` with the
reason, never a failure.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from moebench.errors import Unavailable, first_line

ENV = "MOEBENCH_MEGATRON_LM"
DIST = "megatron-core"

# name -> (module, attribute): the upstream objects moebench variants launch
KERNELS = {
    "count_persistent": ("megatron.core.inference.moe.permute", "_count_local_tokens_kernel_persistent"),
    "count": ("megatron.core.inference.moe.permute", "_count_local_tokens_kernel"),
    "silu_mul_bounded": ("megatron.core.inference.moe.activations", "_silu_mul_bounded_kernel"),
    "swiglu": ("megatron.core.inference.moe.activations", "_swiglu_kernel"),
    "squared_relu": ("megatron.core.inference.moe.activations", "_squared_relu_kernel"),
    "fused_moe": ("megatron.core.inference.moe.fused_moe", "mcore_fused_moe"),
}

HOW = (f"install megatron-core on Python >= 3.12 (pip install 'moebench[upstream]'), or point --megatron-lm "
       f"or ${ENV} at a Megatron-LM checkout")


@dataclass
class Status:
    name: str
    module: str
    attr: str
    source: str | None  # "checkout PATH" | "megatron-core X.Y.Z" | None
    present: bool  # the definition is in the source text
    why: str = ""  # what is missing, and what to do


def checkout() -> Path | None:
    raw = os.environ.get(ENV, "").strip()
    return Path(raw).expanduser() if raw else None


def installed_version(dist: str = DIST) -> str | None:
    """An installed distribution's version, read from its metadata (no import: torch takes seconds,
    megatron.core longer)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _file_of(module: str, root: Path | None) -> tuple[Path | None, str | None]:
    """The source file of `module` in a checkout (root) or the installed distribution, and how to
    name that source."""
    rel = Path(*module.split(".")).with_suffix(".py")
    if root is not None:
        return root / rel, f"checkout {root}"
    version = installed_version()
    if version is None:
        return None, None
    return Path(str(metadata.distribution(DIST).locate_file(rel))), f"{DIST} {version}"


def status(name: str, root: Path | None = None) -> Status:
    """Where kernel `name` would come from (from checkout `root` if given), read from source text
    (no import, no torch)."""
    module, attr = KERNELS[name]
    root = root or checkout()
    path, source = _file_of(module, root)
    if path is None:
        why = f"no Megatron source here: {HOW}"
        if sys.version_info < (3, 12):
            why += f" (this is Python {sys.version_info.major}.{sys.version_info.minor})"
        return Status(name, module, attr, None, False, why)
    if not path.is_file():
        return Status(name, module, attr, source, False, f"{source} has no {module} ({path}); {HOW}")
    text = path.read_text(errors="replace")
    if f"def {attr}(" not in text:
        have = sorted({a for _, (m, a) in KERNELS.items() if m == module and f"def {a}(" in text})
        return Status(name, module, attr, source, False,
                      f"{source} has no {attr} in {module}" + (f" (it has {', '.join(have)})" if have else "")
                      + f"; {HOW}" + (" (Megatron-LM main has it)" if root is None else ""))
    return Status(name, module, attr, source, True)


_LOADED: dict[str, Any] = {}
_MODULES: dict[str, Any] = {}  # as _LOADED: the module each object came from
_ROOT: list[Path] = []  # the checkout one arm of `moebench pr` takes its kernels from (`rooted`)


@contextmanager
def rooted(root: Path):
    """While the block runs, `load` takes each kernel from checkout `root` (an arm of `moebench pr`)."""
    _ROOT.append(root)
    try:
        yield
    finally:
        _ROOT.pop()


def load(name: str) -> Any:
    """The upstream object `name` (a @triton.jit kernel, or a function), imported on first use;
    inside `rooted(ROOT)`, from ROOT's kernel module file run under a private module name, so two
    checkouts' kernels live side by side in one process. Raises Unavailable with the reason and
    what to do when it cannot be had here."""
    if _ROOT:
        return _run_file(name, _ROOT[-1])
    if name in _LOADED:
        return _LOADED[name]
    st = status(name)
    if not st.present:
        raise Unavailable(f"upstream {st.attr}: {st.why}")
    root = checkout()
    if root is not None:
        have = sys.modules.get("megatron")
        if have is not None and not any(Path(p).resolve().is_relative_to(root.resolve())
                                        for p in getattr(have, "__path__", [])):
            raise Unavailable(f"upstream {st.attr}: megatron is already imported from {list(have.__path__)}, not "
                              f"from the checkout {root}; run in a fresh process")
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    try:
        obj = getattr(importlib.import_module(st.module), st.attr)
    except Exception as e:  # noqa: BLE001 - Megatron's own imports can fail in many ways; all mean unavailable
        raise Unavailable(f"upstream {st.attr}: importing {st.module} from {st.source} failed: "
                          f"{type(e).__name__}: {first_line(e) if str(e).strip() else ''}") from None
    _LOADED[name] = obj
    _MODULES[name] = sys.modules[st.module]
    return obj


def require_args(kernel: Any, names: Sequence[str], what: str) -> None:
    """Raise Unavailable unless the upstream @triton.jit `kernel` takes every argument in `names`
    (moebench launches it by name, so a renamed argument upstream is a reason, not a crash)."""
    have = tuple(getattr(kernel, "arg_names", ()))
    missing = [n for n in names if n not in have]
    if missing:
        raise Unavailable(f"the upstream {what} kernel's arguments are {', '.join(have) or 'unknown'}; moebench "
                          f"launches it by name and misses {', '.join(missing)}")


def _run_file(name: str, root: Path) -> Any:
    key = f"{name}@{root}"
    if key not in _LOADED:
        st = status(name, root)
        if not st.present:
            raise Unavailable(f"upstream {st.attr}: {st.why}")
        path = _file_of(st.module, root)[0]
        private = f"moebench_upstream_{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}_{path.stem}"
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(private, path))
        sys.modules[private] = module
        try:
            module.__spec__.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - as in load: any failure means unavailable
            del sys.modules[private]
            raise Unavailable(f"upstream {st.attr}: running {path} failed: {type(e).__name__}: {e}") from None
        _LOADED[key], _MODULES[key] = getattr(module, st.attr), module
    return _LOADED[key]


def loaded_modules(root: Path | None = None) -> list:
    """The modules of the kernels loaded so far from checkout `root` (None: from the process's
    megatron), for what an arm of `moebench pr` ran."""
    mods = [m for k, m in _MODULES.items() if (k.endswith(f"@{root}") if root is not None else "@" not in k)]
    return list({id(m): m for m in mods}.values())


def provenance() -> dict:
    """What upstream source this process would use, for a results file. A checkout copied without
    its .git (to a machine without a registry) names its commit in $MOEBENCH_MEGATRON_LM_COMMIT."""
    root = checkout()
    if root is not None:
        return {"megatron_lm": str(root),
                "megatron_lm_commit": git_head(root) or os.environ.get(f"{ENV}_COMMIT") or None}
    return {"megatron_core": installed_version()}


def git_head(root: Path) -> str | None:
    """HEAD of the git repository whose top folder is `root`, else None."""
    try:
        r = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=root, capture_output=True, text=True,
                           timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = r.stdout.splitlines()
    # only the checkout's own repository: a copy inside another repository is not its commit
    if r.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root.resolve():
        return None
    return lines[1]

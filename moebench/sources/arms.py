"""Kernel sources per arm of `moebench pr` (docs/pr.md, "The arms"): two versions of one kernel in one
process, a plugin's variants suffixed by the arm (`histogram@on`), an upstream variant's clone run
inside `upstream.rooted(PATH)`. `modules` and `compiled` say afterwards which code ran; the counters
child re-creates the arms from `loaded()` (`restore`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from moebench.sources import plugins, upstream

_ARMS: list[dict] = []  # what was loaded, in order: {"plugin": path} or {"megatron_lm": path, "family": name}
_CHECKOUTS: dict[str, Path] = {}  # clone variant name -> the checkout it loads from


def suffix(side: str) -> str:
    return "@" + side.lower()


def load_plugin(path: str | Path, side: str) -> None:
    plugins.load_file(path, where=f"--{side.lower()} plugin=", suffix=suffix(side))
    _ARMS.append({"plugin": str(Path(path).resolve()), "side": side})


def clone_upstream(family, root: Path, side: str) -> list[str]:
    """Register `NAME@side` for each upstream variant of `family`, loading from checkout `root`."""
    made = []
    for v in [v for v in family.variants.values() if v.source == "upstream" and "@" not in v.name]:
        name = v.name + suffix(side)

        def build(inputs, params, device, _of=v.name):
            with upstream.rooted(root):
                return family.builder(_of)(inputs, params, device)

        family.variants[name] = dataclasses.replace(v, name=name, builder=build)
        _CHECKOUTS[name] = root
        made.append(name)
    _ARMS.append({"megatron_lm": str(root), "family": family.name, "side": side})
    return made


def loaded() -> list[dict]:
    return [dict(a) for a in _ARMS]


def restore(entries, family_of: Callable[[str], Any]) -> None:
    """Load the arms `loaded()` listed in another process (the counters child)."""
    for e in entries or ():
        if "plugin" in e:
            load_plugin(e["plugin"], e["side"])
        else:
            clone_upstream(family_of(e["family"]), Path(e["megatron_lm"]), e["side"])


def modules(family, variant: str) -> list:
    """The modules whose Triton kernels a variant's launch runs: a clone's, the kernel files it
    loaded from its checkout; an upstream variant's, those of the process's megatron; any other's,
    the module of its builder (a plugin file, a family's kernels.py)."""
    v = family.variants[variant]
    if variant in _CHECKOUTS or v.source == "upstream":
        return upstream.loaded_modules(_CHECKOUTS.get(variant))
    m = sys.modules.get(getattr(v.builder, "__module__", None) or "") if v.builder is not None else None
    return [m] if m is not None else []


def checkout(variant: str) -> Path | None:
    return _CHECKOUTS.get(variant)


def compiled(mods) -> dict[str, list[str]]:
    """Per Triton kernel defined in the modules `mods`, the hashes of its compiled entries (read defensively:
    `device_caches` of triton 3.6 to 3.9); none under the interpreter, which compiles nothing."""
    out: dict[str, list[str]] = {}
    for m in mods:
        for name, fn in list(vars(m).items()):
            caches = getattr(fn, "device_caches", None)
            if not isinstance(caches, dict):
                continue
            hashes = set()
            for entry in list(caches.values()):
                cache = entry[0] if isinstance(entry, tuple) and entry else entry
                for k in list(cache.values()) if isinstance(cache, dict) else ():
                    if isinstance(getattr(k, "hash", None), str):
                        hashes.add(k.hash)
            if hashes:
                out[f"{m.__name__}.{name}"] = sorted(hashes)
    return out

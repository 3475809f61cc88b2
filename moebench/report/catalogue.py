"""What `moebench list FAMILY` says about a family, as data: every key of the `params` dict its
builders receive (name, type, default, meaning, shape or launch), the keys the family adds at
resolve time, its rules, and its variants (parameters, kill switches with their shipped defaults,
source). Torch-free: nothing is built or launched.

The keys a family adds at resolve time (FamilySpec.resolve_more: the layer's resolved count and
act launches) are found by resolving each variant once on a stand-in case (every parameter at its
default, or a value of its type) and a stand-in device whose properties read as their names."""

from __future__ import annotations

from typing import Any

from moebench.core.family import REQUIRED, FamilySpec, Param


class _AnyDevice:
    """The device at resolve time, when there is none: each property reads as its name."""

    def __getattr__(self, name: str) -> str:
        return f"<device {name}>"


def _stand_in(p: Param) -> Any:
    if p.default is not REQUIRED:
        return p.default
    if p.choices:
        return p.choices[0]
    return {int: int(p.min or 1), float: float(p.min or 1.0), bool: False}.get(p.type, "")


def default_text(row: dict) -> str:
    """A parameter row's default as `list FAMILY` prints it."""
    if row["required"]:
        return f"model config's {row['model_key']}" if row["model_key"] else "required"
    return f"{row['default']!r}" + (f" (0: the device's {row['auto']})" if row["auto"] else "")


def param_rows(fam: FamilySpec) -> list[dict]:
    """One row per parameter a builder receives, in declaration order."""
    return [{"name": n, "role": p.role, "type": p.type.__name__, "required": p.default is REQUIRED,
             "default": None if p.default is REQUIRED else p.default, "model_key": p.model_key, "auto": p.auto,
             "accepts": p.allowed(), "help": p.help} for n, p in fam.params.items()]


def resolved_rows(fam: FamilySpec) -> list[dict]:
    """The keys `resolve` adds beyond the family's parameters, with the variants that get them."""
    sample = {n: _stand_in(p) for n, p in fam.params.items()}
    what = " ".join((fam.resolve_more.__doc__ or "").split(". ")[0].split()) if fam.resolve_more else ""
    added: dict[str, dict] = {}
    for v in fam.variants:
        try:
            got, _ = fam.resolve(v, dict(sample), _AnyDevice(), {})
        except Exception as e:  # noqa: BLE001 - a plugin's resolve_more that needs a real case
            added.setdefault("?", {"name": "?", "variants": [], "help": f"depends on the case ({e})"})["variants"].append(v)
            continue
        for k in got.keys() - sample.keys():
            added.setdefault(k, {"name": k, "variants": [], "help": what})["variants"].append(v)
    return list(added.values())


def variant_rows(fam: FamilySpec) -> list[dict]:
    return [{"name": v.name, "source": v.source, "doc": v.doc, "params": list(v.params),
             "kill_switches": {k: {"variable": var, "shipped_default": d} for k, (var, d) in v.env.items()},
             "ignores": [n for n in fam.launch_params if n not in v.launch_params], "twins": list(v.twins)}
            for v in fam.variants.values()]


def family_doc(fam: FamilySpec) -> dict:
    """Everything `list FAMILY` shows (and `list FAMILY --json` prints)."""
    return {"family": fam.name, "doc": fam.doc, "origin": fam.origin, "params": param_rows(fam),
            "added_at_resolve": resolved_rows(fam), "rules": [{"rule": r, "why": why} for r, why in fam.rules],
            "variants": variant_rows(fam)}

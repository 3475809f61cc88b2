"""The catalogue of kernel families: their parameters and variant names.

This package is torch-free on purpose: `moebench validate` and the spec loader check a sweep
against it on any machine. The kernels themselves live in `moebench.kernels.<family>` and are
imported only when a sweep runs (`load_impl`).

A *parameter* is either a shape parameter (``role="shape"``: it decides the inputs; variants that
share the shape parameters see the same inputs and must agree) or a launch parameter
(``role="launch"``: block size, grid cap, warps; it only changes how the same work is launched).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any = REQUIRED
    role: str = "shape"  # "shape" | "launch"
    choices: tuple | None = None
    pow2: bool = False
    min: float | None = None
    max: float | None = None
    model_key: str | None = None  # default taken from the model config under this key
    help: str = ""

    def check(self, value: Any) -> str | None:
        """Return what was expected if `value` is not acceptable, else None."""
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"expected an integer, got {_show(value)}"
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"expected a number, got {_show(value)}"
        elif self.type is str:
            if not isinstance(value, str):
                return f"expected a string, got {_show(value)}"
        elif self.type is bool:
            if not isinstance(value, bool):
                return f"expected true or false, got {_show(value)}"
        if self.choices is not None and value not in self.choices:
            return f"expected one of {', '.join(map(str, self.choices))}; got {_show(value)}"
        if self.pow2 and (value <= 0 or value & (value - 1)):
            return f"must be a power of two, got {value}"
        if self.min is not None and value < self.min:
            return f"must be >= {self.min:g}, got {value}"
        if self.max is not None and value > self.max:
            return f"must be <= {self.max:g}, got {value}"
        return None


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} {value!r}"[:80]
    return repr(value)


@dataclass(frozen=True)
class VariantSpec:
    name: str
    doc: str
    params: tuple[str, ...] = ()  # launch parameters this variant reads


@dataclass(frozen=True)
class FamilySpec:
    name: str
    doc: str
    module: str  # implementation module, imported lazily
    params: dict[str, Param]
    variants: dict[str, VariantSpec]
    # cross-parameter rules: (expression over params, message); a case violating one is a spec error
    rules: tuple[tuple[str, str], ...] = ()
    host_only: bool = False  # evaluated on the host: no kernels, no timing
    default_pivot: dict = field(default_factory=dict)

    @property
    def shape_params(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.params.items() if p.role == "shape")

    @property
    def launch_params(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.params.items() if p.role == "launch")


_FAMILY_MODULES = (
    "moebench.families.count",
    "moebench.families.activation",
    "moebench.families.combine",
)

_CATALOGUE: dict[str, FamilySpec] | None = None


def catalogue() -> dict[str, FamilySpec]:
    global _CATALOGUE
    if _CATALOGUE is None:
        cat = {}
        for mod in _FAMILY_MODULES:
            try:
                fam = importlib.import_module(mod).FAMILY
            except ModuleNotFoundError as e:  # a family not written yet
                if e.name == mod:
                    continue
                raise
            cat[fam.name] = fam
        _CATALOGUE = cat
    return _CATALOGUE


def get_family(name: str) -> FamilySpec:
    cat = catalogue()
    if name not in cat:
        raise KeyError(name)
    return cat[name]


def load_impl(family: FamilySpec):
    """Import the kernel module of a family (torch, triton)."""
    return importlib.import_module(family.module)

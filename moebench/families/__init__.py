"""Kernel families, one folder each: ``moebench/families/<name>/`` (a torch-free ``__init__.py``
with ``FAMILY = FamilySpec(...)``, and ``kernels.py``). Every sub-package here is a family.

The family contract (Param, FamilySpec, Built, Check, Preset, REQUIRED) and the catalogue live in
core (moebench.core.family): the case pipeline and the spec reader use them without knowing any
family. This module re-exports them so that plugins written as ``from moebench.families import
FamilySpec, get_family, Built, ...`` keep working; moebench's own code imports moebench.core.family.
"""

from moebench.core.family import (BUILTIN, REQUIRED, Built, Check, FamilySpec, Param, Preset, VariantSpec, broken,
                                  catalogue, cdiv, family_error, get_family, next_pow2, register_family)

__all__ = ["BUILTIN", "REQUIRED", "Built", "Check", "FamilySpec", "Param", "Preset", "VariantSpec", "broken",
           "catalogue", "cdiv", "family_error", "get_family", "next_pow2", "register_family"]

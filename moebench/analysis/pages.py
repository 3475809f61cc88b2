"""What a reader knows of the spec and family behind a results file, from the file alone.

A results file is data: the readers (render, merge, show, compare, recommend, plot) never open a
spec file it names (loading a spec runs its `plugins:`) and never import a plugin, an entry point or
$MOEBENCH_PLUGINS to find its family. What a page needs of its spec is in the file's provenance
(`page`, `cases`: moebench.core.provenance.provenance); a family is looked up among the built-in ones.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from moebench.core.family import BUILTIN
from moebench.core.records import Record


@dataclass
class PageSpec:
    """What a results page needs of the spec that made it, from the results file alone
    (provenance.page): a reader never loads a spec named in a file, since loading runs its
    `plugins:`. Duck-types the parts of a Spec that moebench.report.sweep.sweep_markdown reads."""

    name: str
    family: Any
    description: str
    pivot: dict
    baseline: dict | None
    model: dict
    path: str | None
    sha256: str | None
    notes: list[str]


class RecordsFamily:
    """A family known only from its records (a plugin's: readers never import plugins): its
    parameter names, no sections of its own."""

    def __init__(self, name: str, records: list[Record], host_only: bool = False):
        self.name, self.host_only, self.origin = name, host_only, "records"
        self.params = {k: None for r in records for k in r.params}
        self.default_pivot: dict = {}
        self.layers_per_launch = None
        self.graph_launches = None
        self.variants: dict = {}
        self.shape_params: tuple = ()

    def borrowed_work(self, variants) -> list[str]:
        """None: the variants are the plugin's own family's, so no work model is borrowed."""
        return []


def builtin_family(name: str):
    """The built-in family of that name (its torch-free declarations), or None: a reader never
    loads a plugin, an entry point or $MOEBENCH_PLUGINS to find one."""
    for mod in BUILTIN:
        try:
            fam = importlib.import_module(f"moebench.families.{mod}").FAMILY
        except Exception:  # noqa: BLE001 - a broken family breaks only itself: its pages lose their sections
            continue
        if fam.name == name:
            return fam
    return None


def page_spec(prov: dict, records: list[Record]) -> PageSpec:
    """The PageSpec of a results file, from its provenance.page; a family that is not built in
    (a plugin's) is known by its records alone."""
    page = prov.get("page") if isinstance(prov.get("page"), dict) else {}
    notes = []
    fam_name = page.get("family") if isinstance(page.get("family"), str) else (records[0].family if records else "")
    fam = builtin_family(fam_name)
    host_only = page.get("host_only") is True or bool(fam is not None and fam.host_only)
    if fam is None:
        fam = RecordsFamily(fam_name, records, host_only)
        notes.append(f"family {fam_name!r} is not built in (a plugin's; readers never import plugins): the page "
                     "has its pivots, without the family's own sections")
    baseline = page.get("baseline")
    pivot = {**fam.default_pivot, **(page.get("pivot") or {})}
    return PageSpec(name=str(prov.get("sweep") or ""), family=fam, description=str(page.get("description") or ""),
                    pivot=dict(pivot), baseline=baseline if isinstance(baseline, dict) else None,
                    model={"moe_layers": page.get("moe_layers")}, path=prov.get("spec_path"),
                    sha256=prov.get("spec_sha256"), notes=notes)

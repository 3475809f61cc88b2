"""What a reader knows of the spec and family behind a results file, from the file alone.

A results file is data: the readers (render, merge, show, compare, recommend, plot) never open a
spec file it names (loading a spec runs its `plugins:`) and never import a plugin, an entry point or
$MOEBENCH_PLUGINS to find its family. What a page needs of its spec is in the file's provenance
(`page`, `cases`: moebench.core.provenance.provenance); a family is looked up among the built-in ones.
"""

from __future__ import annotations

from typing import Any

from moebench.core.records import Record


class PageSpec:
    """What a results page needs of the spec that made it, read from the results file alone
    (provenance.page, written by moebench.core.provenance.provenance): the readers (render, merge) never open a spec file
    named inside a results file, since loading a spec runs its `plugins:`. Duck-types the parts of
    a Spec that moebench.report.sweep.sweep_markdown reads."""

    def __init__(self, *, name: str, family: Any, description: str, pivot: dict, baseline: dict | None,
                 model: dict, path: str | None, sha256: str | None, notes: list[str]):
        self.name, self.family, self.description, self.pivot = name, family, description, pivot
        self.baseline, self.model, self.path, self.sha256, self.notes = baseline, model, path, sha256, notes


class RecordsFamily:
    """A family known only from its records (a plugin's: readers never import plugins): its
    parameter names, no sections of its own."""

    def __init__(self, name: str, records: list[Record], host_only: bool = False):
        self.name, self.host_only, self.origin = name, host_only, "records"
        self.params = {k: None for r in records for k in r.params}
        self.default_pivot: dict = {}
        self.sections = self.ab_sections = self.layers_per_launch = None
        self.variants: dict = {}
        self.shape_params: tuple = ()


def builtin_family(name: str):
    """The built-in family of that name (its torch-free declarations), or None: a reader never
    loads a plugin, an entry point or $MOEBENCH_PLUGINS to find one."""
    import importlib

    from moebench.core.family import BUILTIN

    for mod in BUILTIN:
        try:
            fam = importlib.import_module(f"moebench.families.{mod}").FAMILY
        except Exception:  # noqa: BLE001 - a broken family breaks only itself: its pages lose their sections
            continue
        if fam.name == name:
            return fam
    return None


def page_spec(prov: dict, records: list[Record]) -> PageSpec:
    """The PageSpec of a results file: provenance.page where the file has it, else (an older file)
    the built-in family's pivot and the baseline of provenance.settings, without a description."""
    page = prov.get("page") if isinstance(prov.get("page"), dict) else {}
    notes = []
    fam_name = page.get("family") if isinstance(page.get("family"), str) else (records[0].family if records else "")
    fam = builtin_family(fam_name)
    host_only = page.get("host_only") is True or bool(fam is not None and fam.host_only)
    if fam is None:
        fam = RecordsFamily(fam_name, records, host_only)
        notes.append(f"family {fam_name!r} is not built in (a plugin's; readers never import plugins): the page "
                     "has its pivots, without the family's own sections")
    if not page:
        page = _builtin_page(prov)
        notes.append("written by an older moebench without provenance.page: " + (
            f"the description and pivot are today's, from moebench's own {prov.get('spec_path')}" if page else
            "the page has no description, and the family's default pivot"))
    settings = prov.get("settings") if isinstance(prov.get("settings"), dict) else {}
    baseline = page.get("baseline", settings.get("baseline"))
    pivot = {**fam.default_pivot, **(page.get("pivot") or {})}
    return PageSpec(name=str(prov.get("sweep") or ""), family=fam, description=str(page.get("description") or ""),
                    pivot=dict(pivot), baseline=baseline if isinstance(baseline, dict) else None,
                    model={"moe_layers": page.get("moe_layers")}, path=prov.get("spec_path"),
                    sha256=prov.get("spec_sha256"), notes=notes)


def _builtin_page(prov: dict) -> dict:
    """For an older results file made from one of moebench's own sweeps (spec_path
    ``sweeps/NAME.yaml``, relative to the checkout): that file's description and pivot, read as
    data (yaml.safe_load; never load_spec, which runs a spec's plugins). {} otherwise."""
    import yaml

    from moebench.core.spec import builtin_sweeps

    name, path = prov.get("sweep"), prov.get("spec_path")
    found = next((p for p in builtin_sweeps() if p.stem == name and path == f"sweeps/{p.name}"), None)
    if found is None:
        return {}
    try:
        doc = yaml.safe_load(found.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(doc, dict) or "plugins" in doc:
        return {}
    page = {}
    if isinstance(doc.get("description"), str):
        page["description"] = doc["description"]
    pivot = doc.get("pivot")
    if isinstance(pivot, dict) and all(isinstance(v, str) for v in pivot.values()):
        page["pivot"] = pivot
    return page

"""The seed PRs' published tables, kept as reference data (moebench/analysis/reference/*.yaml), as
records that sit beside a measurement in `show --reference`, `plot --reference` and
`recommend ref:NAME`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moebench.core.records import Record
from moebench.core.cases import case_id
from moebench.core.spec import read_yaml
from moebench.errors import UsageError


REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


@dataclass
class Reference:
    """A seed PR's published table, as records."""

    name: str
    title: str
    source: str
    device: str
    family: str
    label: str
    timer: str
    records: list[Record]

    def provenance(self) -> dict:
        return {"sweep": self.name, "reference": True, "source": self.source, "timer": self.timer,
                "device": {"name": self.device}, "command": f"(published: {self.source})"}


def reference_names() -> list[str]:
    return sorted(p.stem for p in REFERENCE_DIR.glob("*.yaml"))


def load_reference(name: str) -> Reference:
    """moebench/analysis/reference/NAME.yaml as records (one per published cell), labelled with the
    reference's label so they sit beside a measurement without being mistaken for one. NAME must
    be one of the shipped tables (no paths), read with the specs' hardened YAML loader."""
    known = reference_names()
    if name not in known:
        raise UsageError(f"unknown reference {name!r}; known: {', '.join(known) or 'none'} (the shipped tables)")
    path = REFERENCE_DIR / f"{name}.yaml"
    doc, _ = read_yaml(path)
    if not isinstance(doc, dict) or "family" not in doc:
        raise UsageError(f"{path}: not a reference table (expected a mapping with family, table or points)")
    fam, label = doc["family"], doc.get("label", name)
    variant = doc.get("variant", "reference")
    fixed = dict(doc.get("fixed") or {})
    cells: list[tuple[dict, dict]] = []  # (params, values)
    tab = doc.get("table")
    if tab:
        metric = tab.get("metric", "median_us")
        cols = tab["col_values"]
        for row_val, vals in tab["values"].items():
            if len(vals) != len(cols):
                raise UsageError(f"{path}: table.values.{row_val}: {len(vals)} values for {len(cols)} columns")
            for c, v in zip(cols, vals):
                if v is not None:
                    cells.append(({**fixed, tab["rows"]: row_val, tab["cols"]: c}, {metric: v}))
    for pt in doc.get("points") or ():  # one mapping per point: parameters and published values
        params = {k: v for k, v in pt.items() if k not in _REF_VALUE_KEYS}
        values = {k: v for k, v in pt.items() if k in _REF_VALUE_KEYS}
        cells.append(({**fixed, **params}, values))
    records = []
    for params, values in cells:
        rec = Record(sweep=name, family=fam, case_id=case_id(fam, label, params), variant=variant, label=label,
                     status="ok", params=params)
        for k, v in values.items():
            (rec.timing if k in _REF_TIMING_KEYS else rec.work)[k] = v
        rec.timing["timer"] = doc.get("timer", "published")
        records.append(rec)
    return Reference(name=doc.get("name", name), title=doc.get("title", name), source=str(doc.get("source", "")),
                     device=str(doc.get("device", "")), family=fam, label=label, timer=str(doc.get("timer", "")),
                     records=records)


_REF_TIMING_KEYS = ("median_us", "min_us", "max_us", "iqr_us", "rel_noise")
_REF_VALUE_KEYS = _REF_TIMING_KEYS + ("floor_us", "x_floor", "bytes", "gbps", "occupancy_pct")

"""Row labels and the tie text of the pages (records only); the tie rule itself is
moebench.analysis.fastest, which recommend reads too. Its own module so that the sweep page and the
families' sections (report/sections) both read it without importing each other."""

from __future__ import annotations

from typing import Any

from moebench.analysis import half_width
from moebench.core.records import Record
from moebench.core.text import varying

# A row label part for a parameter the variant does not take (legacy's grid_cap: its grid is min(M, 512)).
NOT_TAKEN = "·"


def _label(x: Any) -> Any:
    """An index value for display: None (a parameter the variant does not read) as NOT_TAKEN."""
    if x is None or (isinstance(x, float) and x != x):  # None or NaN
        return NOT_TAKEN
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


def full_labels(records: list[Record], names: list[str] | None = None) -> list[str]:
    """Each record's label, with the parameters of `names` (default: every parameter) that vary
    among the records of that label appended as `, name=value`: a label swept over an axis inside
    its variant entry names the value, so two configurations never share a name. The caller
    leaves out what its table already shows (the shape keys, the columns)."""
    names = list(dict.fromkeys(k for r in records for k in r.params)) if names is None else names
    by_label: dict[str, list[Record]] = {}
    for r in records:
        by_label.setdefault(r.label, []).append(r)
    inner = {lab: [k for k in varying([q.params for q in rs], names)] for lab, rs in by_label.items()}
    return [r.label + "".join(f", {k}={_label(r.params[k])}" for k in inner[r.label] if r.params.get(k) is not None)
            for r in records]


def fastest_text(tied: list[Record], name=lambda r: r.label) -> str:
    """`name 2.13` for one winner; `tie: a 2.13 ± 0.06, b 2.19 ± 0.08` when intervals overlap."""
    if len(tied) == 1:
        return name(tied[0])
    return "tie: " + "; ".join(f"{name(r)} {r.timing['median_us']:.2f} ± {half_width(r):.2f}" for r in tied)

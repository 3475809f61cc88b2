"""Which configuration is fastest, and when the numbers cannot say: the tie rule every page uses
(records only). Its own module so that the sweep page and the families' sections (report/sections)
both read it without importing each other."""

from __future__ import annotations

from typing import Any

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


def half_width(r: Record) -> float:
    """The ~95% half-width of a record's median_us (rel_noise x median); 0 without a noise estimate."""
    m = r.timing.get("median_us")
    return abs(m * (r.timing.get("rel_noise") or 0.0)) if m is not None else 0.0


def fastest(records: list[Record]) -> list[Record]:
    """The timed record with the least median_us first, then every other whose interval (median ±
    half_width) overlaps the fastest's, fastest first. More than one is a tie: the numbers do not
    say which of them is faster, so a page names them all instead of picking a winner inside the
    noise."""
    timed = sorted((r for r in records if r.status == "ok" and r.timing.get("median_us") is not None),
                   key=lambda r: r.timing["median_us"])
    if not timed:
        return []
    best = timed[0]
    top = best.timing["median_us"] + half_width(best)
    return [best] + [r for r in timed[1:] if r.timing["median_us"] - half_width(r) <= top]


def fastest_text(tied: list[Record], name=lambda r: r.label) -> str:
    """`name 2.13` for one winner; `tie: a 2.13 ± 0.06, b 2.19 ± 0.08` when intervals overlap."""
    if len(tied) == 1:
        return name(tied[0])
    return "tie: " + "; ".join(f"{name(r)} {r.timing['median_us']:.2f} ± {half_width(r):.2f}" for r in tied)


TIE_NOTE = ("the fastest configuration's ~95% interval (median ± its rel_noise) overlaps those of the others "
            "named with it, so these numbers do not say which of them is faster.")

"""`show --reference`: measured pivots beside a published reference table and their ratio."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from moebench.analysis import metric_of, value_of
from moebench.analysis.reference import Reference
from moebench.core.records import Record
from moebench.report.sweep import pivots


def beside_reference(records: list[Record], ref: Reference, rows: str, cols: str, metric: str,
                     param_names: list[str]) -> list[tuple[str, str, Any]]:
    """For `show --reference`: (kind, title, table) for each measured pivot ("measured"), the
    reference over the same rows and columns ("reference"), and measured / reference ("ratio").
    Cells are matched on the (rows, cols) values alone; other parameters are whatever each side
    held fixed. Pivots with no reference cell at all are left out."""
    ref_cells = {(value_of(r, rows), value_of(r, cols)): metric_of(r, metric) for r in ref.records}
    out = []
    for title, t in pivots(records, rows, cols, metric, param_names):
        def row_val(key):
            return key[-1] if isinstance(key, tuple) else key

        ref_t = pd.DataFrame([[ref_cells.get((row_val(k), c)) for c in t.columns] for k in t.index],
                             index=t.index, columns=t.columns)
        ratio = pd.DataFrame([[_ratio(t.loc[k, c], ref_t.loc[k, c]) for c in t.columns] for k in t.index],
                             index=t.index, columns=t.columns)
        if ref_t.isna().all().all():
            continue
        pre = f"{title}, " if title else ""
        out += [("measured", title, t), ("reference", f"{pre}{ref.label}", ref_t),
                ("ratio", f"{pre}measured ÷ {ref.label}", ratio)]
    return out


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and not math.isnan(a) and not math.isnan(b):
        return a / b
    return None

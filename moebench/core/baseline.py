"""Each timed record read against the baseline launch of its shape (speedup, Δµs, per-step
projection): the run driver and the merge of a sharded run add these to records before they are
written, so the numbers are the records' own, not a page's. Both find a shape's baseline by one
rule (`baseline_ids`): the case whose variant and launch values are the spec's baseline, whatever
its label."""

from __future__ import annotations

from typing import Iterable, Mapping

from moebench.core.cases import is_baseline
from moebench.core.records import Record


def launch_layers(family, params: dict) -> int:
    """MoE layers one launch of a case covers: 1 unless the family says otherwise."""
    hook = family.layers_per_launch
    return max(1, int(hook(params))) if hook is not None else 1


def baseline_ids(spec, cases: Iterable[tuple[str, str, dict]]) -> dict[str, str | None]:
    """(case id, variant, params) of each case -> the id of the case among them that is the spec's
    baseline launch at its shape; None where none is (or the spec has no baseline)."""
    cases = list(cases)
    shape = spec.family.shape_params
    at: dict[tuple, str] = {}
    for cid, variant, params in cases:
        if is_baseline(spec, variant, params):
            at[tuple(params.get(k) for k in shape)] = cid
    return {cid: at.get(tuple(params.get(k) for k in shape)) for cid, _, params in cases}


def add_baseline_deltas(spec, records: list[Record]) -> None:
    """Read every timed record against the baseline launch of the same shape among `records`."""
    timed = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None]
    base = baseline_ids(spec, [(r.case_id, r.variant, r.params) for r in timed])
    add_deltas(records, base, (spec.model or {}).get("moe_layers"), spec.family)


def add_deltas(records: list[Record], baseline_of: Mapping[str, str | None], layers: int | None, family) -> None:
    """Every timed record against the median of the record `baseline_of` names for it (case id ->
    the baseline's case id): speedup, Δµs, and the per-step projection Δµs x MoE layers / layers
    per launch (nothing without both medians)."""
    by_id = {r.case_id: r for r in records}
    for r in records:
        b = by_id.get(baseline_of.get(r.case_id) or "")
        base = b.timing.get("median_us") if b is not None and b.status == "ok" else None
        m = r.timing.get("median_us")
        if m is None or base is None:
            continue
        r.work["baseline_us"] = base
        r.work["speedup"] = round(base / m, 3) if m > 0 else None
        r.work["delta_us"] = round(m - base, 4)
        if layers:
            r.work["per_step_delta_us"] = round((m - base) * layers / launch_layers(family, r.params), 2)

"""Each timed record read against the baseline launch of its shape (speedup, Δµs, per-step
projection): the run driver and the merge of a sharded run add these to records before they are
written, so the numbers are the records' own, not a page's."""

from __future__ import annotations

from moebench.core.cases import is_baseline
from moebench.core.records import Record


def launch_layers(family, params: dict) -> int:
    """MoE layers one launch of a case covers: 1 unless the family says otherwise."""
    hook = getattr(family, "layers_per_launch", None)
    return max(1, int(hook(params))) if hook is not None else 1


def add_baseline_deltas(spec, records: list[Record]) -> None:
    """Read every timed record against the baseline launch of the same shape: speedup, Δµs, and
    the per-step projection Δµs x MoE layers (from the model config), like the seed PRs do."""
    if not spec.baseline:
        return
    fam = spec.family
    base_by_shape: dict[tuple, float] = {}
    for r in records:
        if r.status == "ok" and r.timing.get("median_us") is not None and is_baseline(spec, r.variant, r.params):
            base_by_shape[tuple((k, r.params.get(k)) for k in fam.shape_params)] = r.timing["median_us"]
    layers = spec.model.get("moe_layers") if spec.model else None
    for r in records:
        set_delta(r, base_by_shape.get(tuple((k, r.params.get(k)) for k in fam.shape_params)), layers, fam)


def set_delta(r: Record, base: float | None, layers: int | None, family) -> None:
    """One timed record against its baseline's median: speedup, Δµs and the per-step projection
    Δµs x MoE layers / layers per launch (nothing without both medians)."""
    m = r.timing.get("median_us")
    if m is None or base is None:
        return
    r.work["baseline_us"] = base
    r.work["speedup"] = round(base / m, 3) if m > 0 else None
    r.work["delta_us"] = round(m - base, 4)
    if layers:
        r.work["per_step_delta_us"] = round((m - base) * layers / launch_layers(family, r.params), 2)

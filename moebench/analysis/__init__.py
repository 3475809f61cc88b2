"""Deciding from numbers: reading results, and the statistics behind `moebench ab`, `compare` and
`recommend` (moebench.analysis.ab, .compare, .recommend), the seed PRs' published tables kept as
reference data (.reference) and the plots (.plot).

Pure Python over lists of floats and Records: no torch, no kernel, nothing printed. The CLI
(moebench.cli.analysis) renders what these functions return.

Conventions: times are µs per launch and lower is better (compare takes a metric's direction from
`metric_direction`). Relative quantities are fractions inside (0.05 is 5%); percent appears only in
text. ON is the candidate and OFF the control, as in the seed PRs' A/B tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from moebench.core.records import Record, load_results
from moebench.core.text import varying
from moebench.errors import UsageError

# ============================================================================ reading results

REF_PREFIX = "ref:"


def read_results(arg: str | Path) -> tuple[dict, list[Record]]:
    """A results JSON (or .partial.jsonl), or `ref:NAME` for a reference table. Anything that is
    not one raises UsageError naming the file; so does a file with no records."""
    text = str(arg)
    if text.startswith(REF_PREFIX):
        from moebench.analysis.reference import load_reference

        ref = load_reference(text[len(REF_PREFIX):])
        return ref.provenance(), ref.records
    path = Path(text)
    prov, records = load_results(path)
    if not records:
        raise UsageError(f"{path}: no records (expected a results file with a non-empty 'records' list)")
    return prov, records


def by_case(records: Sequence[Record], name: str, command: str) -> dict[str, Record]:
    """The records of `name` by case id; a UsageError where a case has more than one (an ab or pr
    file holds one per measurement), since `command` reads one number per case."""
    out: dict[str, Record] = {}
    for r in records:
        if r.case_id in out:
            raise UsageError(f"{name} has more than one record for case {r.case_id} ({r.label} {params_text(r.params)}); "
                             f"{command} needs one record per case (an ab or pr file holds one per measurement)")
        out[r.case_id] = r
    return out


def value_of(rec: Record, key: str) -> Any:
    """A parameter of a record by name; `label` and `variant` name the record's own fields. A
    launch parameter the variant does not read (None in params) is taken from the launch group,
    where the variant records what it used (legacy's grid cap 512, shipped's block size)."""
    if key in ("label", "variant"):
        return getattr(rec, key)
    v = rec.params.get(key)
    return rec.launch.get(key) if v is None else v


# The record groups a metric is looked up in, in this order (a key is in one of them)
GROUPS = ("timing", "work", "cross", "checks")


def raw_value(rec: Record, key: str, groups: Sequence[str] = GROUPS) -> Any:
    """`key` as stored in the first of the record's `groups` that holds it; None where none does."""
    for g in groups:
        grp = getattr(rec, g)
        if key in grp:
            return grp[key]
    return None


def metric_of(rec: Record, metric: str = "median_us") -> float | None:
    """The metric of an ok record (raw_value) as a finite number, or None."""
    v = raw_value(rec, metric) if rec.status == "ok" else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def varying_keys(records: Sequence[Record]) -> list[str]:
    """`label` (if more than one) then the parameters that take more than one value."""
    return varying([{"label": r.label, **r.params} for r in records])


def params_text(params: dict, keys: Sequence[str] | None = None) -> str:
    """`k=v, ...` over `keys` (default: every key whose value is set)."""
    keys = [k for k, v in params.items() if v is not None] if keys is None else keys
    return ", ".join(f"{k}={params.get(k)}" for k in keys)


def half_width(r: Record) -> float:
    """The ~95% half-width of a record's median_us (rel_noise x median); 0 without a noise estimate."""
    m = r.timing.get("median_us")
    return abs(m * (r.timing.get("rel_noise") or 0.0)) if m is not None else 0.0


def separated_faster(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """(mean, half-width) a is faster than b and their intervals do not overlap: the one interval
    rule of the ties, `history check` and `recommend --emit`."""
    return a[0] + a[1] < b[0] - b[1]


def tied_with_least(items: Sequence, time: Callable[[Any], float], half: Callable[[Any], float]) -> list:
    """The item of least time first, then every other whose interval (time ± half) overlaps its
    own, by time. More than one is a tie: the numbers do not say which of them is faster, so a page,
    `recommend` and `plot` name them all instead of picking a winner inside the noise."""
    ranked = sorted(items, key=time)
    if not ranked:
        return []
    least = (time(ranked[0]), half(ranked[0]))
    return ranked[:1] + [x for x in ranked[1:] if not separated_faster(least, (time(x), half(x)))]


def fastest(records: list[Record]) -> list[Record]:
    """The timed records tied with the least median_us (tied_with_least, half_width), fastest first."""
    timed = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None]
    return tied_with_least(timed, lambda r: r.timing["median_us"], half_width)


TIE_NOTE = ("the fastest configuration's ~95% interval (median ± its rel_noise) overlaps those of the others "
            "named with it, so these numbers do not say which of them is faster.")


def describe(keys: Sequence[str], values: Sequence[Any]) -> str:
    return params_text(dict(zip(keys, values)), keys) or "all"


def results_json_layout(prov: dict, records: list[Record], **extra: Any) -> str:
    """The results JSON layout of moebench.core.records ({"provenance", "records"}), with extra
    top-level sections (ab summaries) that load_results ignores."""
    return json.dumps({"provenance": prov, "records": [r.to_json() for r in records], **extra},
                      indent=1, default=str) + "\n"

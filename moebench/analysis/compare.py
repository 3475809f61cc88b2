"""`moebench compare`: two results files, per case SAME / FASTER / SLOWER / UNCLEAR, noise-aware."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from moebench.analysis import metric_of, varying_keys
from moebench.core.records import Record
from moebench.errors import UsageError


VERDICTS = ("SAME", "FASTER", "SLOWER", "UNCLEAR")

COMPARE_RULE = (
    "Per case (matched by case_id), d = (new - base) / base on the median per launch, and the noise "
    "n = sqrt(nb² + nn²), where nb, nn are the two rows' rel_noise: the ~95% half-width of each median "
    "(McGill's notch, 1.57·IQR/√replays, over the median). With t the threshold: FASTER or SLOWER when "
    "|d| ≥ t and |d| > n (resolved from zero and at least t); SAME when |d| + n < t (any change is "
    "inside ±t); UNCLEAR otherwise (a change of t or more cannot be confirmed or ruled out), and when "
    "a row has no noise estimate. nvbench's compare calls a change SAME when |d| ≤ min(noise) of the "
    "two rows; this rule adds the threshold so that a resolved but immaterial change stays SAME.")


@dataclass
class CompareRow:
    case_id: str
    label: str
    params: dict[str, Any]
    base_us: float | None
    new_us: float | None
    diff: float | None  # (new - base) / base
    noise: float | None  # combined relative noise
    verdict: str  # one of VERDICTS, or "—" when the case could not be compared
    note: str = ""
    new_status: str = "ok"
    judged: bool = False  # both medians and both noise estimates were there: the verdict rests on data


@dataclass
class CompareReport:
    rows: list[CompareRow]  # matched cases (compared or not)
    only_base: list[Record]
    only_new: list[Record]
    threshold: float
    metric: str
    vary: list[str] = field(default_factory=list)  # parameters that tell the matched cases apart

    def counts(self) -> dict[str, int]:
        c = {v: 0 for v in VERDICTS}
        c["—"] = 0
        for r in self.rows:
            c[r.verdict] = c.get(r.verdict, 0) + 1
        return c

    @property
    def regressions(self) -> list[CompareRow]:
        return [r for r in self.rows if r.verdict == "SLOWER"]

    @property
    def failed_in_new(self) -> list[CompareRow]:
        return [r for r in self.rows if r.new_status not in ("ok", "unavailable")]

    def gate(self) -> tuple[int, str]:
        """The exit code of `--fail-on-regression` and why. Fails closed: 2 when the files cannot
        support a verdict (nothing compared, a case of BASE missing from NEW, a matched case without
        both times and noise estimates); else 1 when a case is SLOWER or failed in NEW; else 0."""
        if not self.rows:
            return 2, "BASE and NEW share no case: nothing was compared"
        blind = [r for r in self.rows if not r.judged and r.new_status in ("ok", "unavailable")]
        if blind:
            return 2, (f"{len(blind)} of {len(self.rows)} matched cases could not be judged "
                       f"({blind[0].case_id} {blind[0].label}: {blind[0].note or 'no verdict'})")
        if self.only_base:
            return 2, f"{len(self.only_base)} cases of BASE are not in NEW, so the gate cannot vouch for them"
        if self.failed_in_new:
            r = self.failed_in_new[0]
            return 1, f"{len(self.failed_in_new)} cases failed in NEW ({r.case_id} {r.label}: {r.new_status})"
        if self.regressions:
            return 1, f"{len(self.regressions)} cases are SLOWER"
        return 0, "no regression"

    def summary(self) -> str:
        c = self.counts()
        parts = [f"{c[v]} {v}" for v in VERDICTS]
        line = f"{len(self.rows)} matched cases: " + ", ".join(parts)
        if c["—"]:
            line += f", {c['—']} not compared"
        if self.only_base or self.only_new:
            line += f"; {len(self.only_base)} only in BASE, {len(self.only_new)} only in NEW"
        worst = max((r for r in self.rows if r.diff is not None and r.verdict == "SLOWER"),
                    key=lambda r: r.diff, default=None)
        if worst is not None:
            which = ", ".join(f"{k}={worst.params.get(k)}" for k in self.vary) or _short(worst.params)
            line += f"; worst regression {100 * worst.diff:+.1f}% ({worst.label} {which})"
        return line + f" (threshold {100 * self.threshold:g}%)"


def record_noise(rec: Record) -> float | None:
    """A row's relative uncertainty of its median: timing.rel_noise, else 1.57·IQR/√n/median
    from iqr_us and n_replays; None when neither is there (or it is not finite)."""
    t = rec.timing
    v = t.get("rel_noise")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) if math.isfinite(v) and v >= 0 else None
    iqr, n, m = t.get("iqr_us"), t.get("n_replays"), t.get("median_us")
    if all(isinstance(x, (int, float)) for x in (iqr, n, m)) and n >= 3 and m > 0:
        return 1.57 * iqr / math.sqrt(n) / m
    return None


def classify(base: float, new: float, base_noise: float | None, new_noise: float | None,
             threshold: float) -> tuple[str, float, float | None]:
    """(verdict, d, n) by COMPARE_RULE."""
    d = (new - base) / base
    if base_noise is None or new_noise is None:
        return "UNCLEAR", d, None
    n = math.hypot(base_noise, new_noise)
    if abs(d) >= threshold and abs(d) > n:
        return ("SLOWER" if d > 0 else "FASTER"), d, n
    if abs(d) + n < threshold:
        return "SAME", d, n
    return "UNCLEAR", d, n


GROUPS = ("timing", "work", "cross", "checks")


def _raw(rec: Record, metric: str) -> Any:
    for g in GROUPS:
        grp = getattr(rec, g)
        if metric in grp:
            return grp[metric]
    return None


def check_times(records: list[Record], name: str, metric: str) -> None:
    """Fail closed on the inputs: the metric must be a column of the file, and every value it has
    in a passing record must be a positive, finite number (a NaN or a zero time would read as a
    huge speed-up)."""
    if not any(metric in getattr(r, g) for r in records for g in GROUPS):
        cols = sorted({k for r in records for k, v in r.timing.items() if isinstance(v, (int, float))})
        raise UsageError(f"--metric: {name} has no column {metric!r}"
                         + (f"; its timing columns: {', '.join(cols)}" if cols else
                            " and no timings at all (an interpreter run records none)"))
    for r in records:
        v = _raw(r, metric)
        if r.status != "ok" or v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise UsageError(f"{name}: case {r.case_id} ({r.label} {_short(r.params)}): {metric} is {v!r}; a time "
                             "must be a positive number")


def compare_records(base: list[Record], new: list[Record], *, threshold: float = 0.05,
                    metric: str = "median_us") -> CompareReport:
    check_times(base, "BASE", metric)
    check_times(new, "NEW", metric)
    bmap, nmap = _by_case(base, "BASE"), _by_case(new, "NEW")
    rows = []
    for cid, b in bmap.items():
        n = nmap.get(cid)
        if n is None:
            continue
        row = CompareRow(cid, b.label, b.params, metric_of(b, metric), metric_of(n, metric), None, None, "—",
                         new_status=n.status)
        if b.status != "ok" or n.status != "ok":
            which = [f"{s} {r.status}" for s, r in (("BASE", b), ("NEW", n)) if r.status != "ok"]
            row.note = "; ".join(which)
        elif row.base_us is None or row.new_us is None:
            row.note = "no timing in " + " and ".join(s for s, v in (("BASE", row.base_us), ("NEW", row.new_us))
                                                      if v is None)
        elif row.base_us <= 0:
            row.note = "BASE time is not positive"
        else:
            row.verdict, row.diff, row.noise = classify(row.base_us, row.new_us, record_noise(b),
                                                        record_noise(n), threshold)
            row.judged = row.noise is not None
            if row.noise is None:
                row.note = "no noise estimate"
            notes = [f"{s} clock dropped" for s, r in (("BASE", b), ("NEW", n)) if r.timing.get("clock_ok") is False]
            if notes:
                row.note = "; ".join(([row.note] if row.note else []) + notes)
        rows.append(row)
    only_base = [b for cid, b in bmap.items() if cid not in nmap]
    only_new = [n for cid, n in nmap.items() if cid not in bmap]
    vary = [k for k in varying_keys([bmap[r.case_id] for r in rows]) if k != "label"]
    return CompareReport(rows, only_base, only_new, threshold, metric, vary)


def _by_case(records: list[Record], name: str) -> dict[str, Record]:
    out: dict[str, Record] = {}
    for r in records:
        if r.case_id in out:
            raise UsageError(f"{name} has more than one record for case {r.case_id} ({r.label} {_short(r.params)}); "
                             "compare needs one record per case (an ab file holds one per iteration)")
        out[r.case_id] = r
    return out


def _short(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items() if v is not None)

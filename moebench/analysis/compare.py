"""`moebench compare`: two results files, per case SAME / FASTER / SLOWER / NOISY / UNCLEAR, noise-aware."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebench.analysis import GROUPS, by_case, metric_of, params_text, raw_value, read_results
from moebench.analysis.comparable import FileNoise, check_comparable, file_noise, model_for
from moebench.core.cases import varying_params
from moebench.core.records import Record
from moebench.core.stats import median
from moebench.errors import UsageError


VERDICTS = ("SAME", "FASTER", "SLOWER", "NOISY", "UNCLEAR")

# Two files whose SM clocks (the median over the compared records) differ by more than this are
# said to differ: µs then mix the code's change with the clock's; --cycles compares µs x MHz.
CLOCK_TOLERANCE = 0.02

# Which way is better, per metric: a time (any *_us, cycles) or a ratio to a floor is better lower;
# a throughput or a speed-up is better higher. A metric in neither is refused.
HIGHER_IS_BETTER = frozenset({"gbps", "speedup", "tflops", "gflops"})
LOWER_IS_BETTER = frozenset({"cycles", "x_floor", "x_empty", "x_floor_plus_empty", "over_empty_us"})

def metric_direction(metric: str, *, lower_only: bool = False) -> bool:
    """True when higher is better, False when lower is; UsageError for a metric of unknown direction
    (`lower_only`: the caller ranks times alone, so the message offers only those)."""
    if metric in HIGHER_IS_BETTER and not lower_only:
        return True
    if metric in LOWER_IS_BETTER or metric.endswith("_us"):
        return False
    lower = f"a time (median_us or another *_us), {', '.join(sorted(LOWER_IS_BETTER))}"
    if metric in HIGHER_IS_BETTER:
        raise UsageError(f"--metric: a higher {metric} is better, and this command ranks a time or a ratio to a "
                         f"floor, where lower is better; expected {lower}")
    raise UsageError(f"--metric: moebench does not know whether a higher or a lower {metric!r} is better; expected "
                     + (lower if lower_only else f"{lower} (lower is better) or "
                        f"{', '.join(sorted(HIGHER_IS_BETTER))} (higher is better)"))


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
    base_status: str = "ok"
    judged: bool = False  # both medians and both noise estimates were there: the verdict rests on data
    base_mhz: float | None = None  # the SM clock of each record (mean of start and end), when recorded
    new_mhz: float | None = None
    base_cycles: float | None = None  # the value x the clock (µs x MHz), for a time metric
    new_cycles: float | None = None


@dataclass
class CompareReport:
    rows: list[CompareRow]  # matched cases (compared or not)
    only_base: list[Record]
    only_new: list[Record]
    threshold: float
    metric: str
    vary: list[str] = field(default_factory=list)  # parameters that tell the matched cases apart
    higher_is_better: bool = False
    cycles: bool = False  # base_us/new_us hold cycles (µs x MHz)
    noise_models: dict[str, str] = field(default_factory=dict)  # BASE/NEW -> how its half-widths were taken
    notes: list[str] = field(default_factory=list)  # what a reader must know: clocks, settings allowed to differ

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
    def failed_in_new(self) -> list[tuple[str, str, str]]:
        """(case id, label, status) of each case that failed in NEW, matched in BASE or not."""
        return ([(r.case_id, r.label, r.new_status) for r in self.rows if r.new_status not in ("ok", "unavailable")]
                + [(r.case_id, r.label, r.status) for r in self.only_new if r.status not in ("ok", "unavailable")])

    @property
    def unclear(self) -> list[CompareRow]:
        return [r for r in self.rows if r.verdict == "UNCLEAR" and r.judged]

    @property
    def noisy(self) -> list[CompareRow]:
        return [r for r in self.rows if r.verdict == "NOISY"]

    def noisy_note(self) -> str:
        """What the gate did not vouch for: the NOISY cases and how wide their noise is."""
        if not self.noisy:
            return ""
        ns = sorted(100 * (r.noise or 0) for r in self.noisy)
        span = f"±{ns[0]:.1f}%" if len(ns) == 1 else f"±{ns[0]:.1f}% to ±{ns[-1]:.1f}%"
        return (f"{len(self.noisy)} of {len(self.rows)} cases are NOISY: their difference is inside their stated "
                f"measured run-to-run noise ({span}), which cannot resolve a change of {100 * self.threshold:g}%, so the gate does not "
                f"vouch for them at that threshold (e.g. {self.noisy[0].case_id} {self.noisy[0].label}: "
                f"{100 * (self.noisy[0].diff or 0):+.2f}%)")

    def gate(self, *, allow_unclear: bool = False, strict_noise: bool = False) -> tuple[int, str]:
        """The exit code of `--fail-on-regression` and why, by docs/gate.md's "The CI gate": 1 (a case
        failed in NEW or is SLOWER), 2 (the files cannot support a verdict: the gate fails closed) or 0;
        `allow_unclear` and `strict_noise` are the options of those names. A NOISY case that passes is
        named in the reason (noisy_note)."""
        if self.failed_in_new:
            cid, label, status = self.failed_in_new[0]
            return 1, f"{len(self.failed_in_new)} cases failed in NEW ({cid} {label}: {status})"
        if self.regressions:
            return 1, f"{len(self.regressions)} cases are SLOWER"
        if not self.rows or all(r.new_status == r.base_status == "unavailable" for r in self.rows):
            return 2, "BASE and NEW share no measured case: nothing was compared"
        # a case unavailable in both files (its kernel source was on neither machine) was measured in
        # neither: nothing to vouch for, nothing lost; a case BASE timed and NEW could not is blind
        blind = [r for r in self.rows if not r.judged and not (r.new_status == r.base_status == "unavailable")]
        if blind:
            return 2, (f"{len(blind)} of {len(self.rows)} matched cases could not be judged "
                       f"({blind[0].case_id} {blind[0].label}: {blind[0].note or 'no verdict'})")
        if self.only_base:
            return 2, f"{len(self.only_base)} cases of BASE are not in NEW, so the gate cannot vouch for them"
        if self.unclear and not allow_unclear:
            r = self.unclear[0]
            return 2, (f"{len(self.unclear)} of {len(self.rows)} cases are UNCLEAR (e.g. {r.case_id} {r.label}: "
                       f"{100 * (r.diff or 0):+.2f}% ± {100 * (r.noise or 0):.2f}%), so the gate cannot vouch for "
                       f"them at {100 * self.threshold:g}%; pass --allow-unclear to let them through, or raise "
                       "--threshold")
        if self.noisy and strict_noise:
            return 2, self.noisy_note() + "; --strict-noise fails them"
        if not any(r.verdict in ("SAME", "FASTER") for r in self.rows):
            return 2, (self.noisy_note() + "; it" if self.noisy else "no case is SAME or FASTER: the gate") + \
                " can vouch for no case at this threshold"
        return 0, "no regression" + (f"; {self.noisy_note()}" if self.noisy else "")

    def summary(self) -> str:
        c = self.counts()
        parts = [f"{c[v]} {v}" for v in VERDICTS]
        line = f"{len(self.rows)} matched cases: " + ", ".join(parts)
        if c["—"]:
            line += f", {c['—']} not compared"
        if self.only_base or self.only_new:
            line += f"; {len(self.only_base)} only in BASE, {len(self.only_new)} only in NEW"
        worst = max((r for r in self.rows if r.diff is not None and r.verdict == "SLOWER"),
                    key=lambda r: -r.diff if self.higher_is_better else r.diff, default=None)
        if worst is not None:
            which = params_text(worst.params, self.vary) or params_text(worst.params)
            line += f"; worst regression {100 * worst.diff:+.1f}% ({worst.label} {which})"
        return line + f" (threshold {100 * self.threshold:g}%)"


def record_mhz(rec: Record) -> float | None:
    """The SM clock of a record: the mean of timing.sm_clock_start_mhz and _end_mhz (either alone
    when only one is there), None when neither is."""
    vals = [v for v in (rec.timing.get("sm_clock_start_mhz"), rec.timing.get("sm_clock_end_mhz"))
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0]
    return sum(vals) / len(vals) if vals else None


def record_cycles(rec: Record, metric: str = "median_us") -> float | None:
    """A time metric in SM clock cycles (µs x MHz), from the record's own clock; None without one."""
    v, mhz = metric_of(rec, metric), record_mhz(rec)
    return v * mhz if v is not None and mhz is not None and metric.endswith("_us") else None


def add_cycles(records: list[Record]) -> int:
    """Set timing.cycles (the median in SM clock cycles) on every record whose clock is known, for
    the per-case tables (show --metric cycles); returns how many got one."""
    n = 0
    for r in records:
        c = record_cycles(r)
        if c is not None:
            r.timing["cycles"] = round(c, 1)
            n += 1
    return n


def classify(base: float, new: float, base_noise: float | None, new_noise: float | None,
             threshold: float, higher_is_better: bool = False, *,
             within: tuple[float, float] | None = None) -> tuple[str, float, float | None]:
    """(verdict, d, n): d = (new - base) / base, n = hypot of the two judged half-widths, the verdict
    by docs/gate.md's table (a drop is SLOWER for a higher-is-better metric; NOISY only with
    `within`, the within-run half-widths, given where both run-to-run terms are measured). nvbench
    calls a change SAME when |d| <= min(noise); the threshold keeps an immaterial but resolved change SAME."""
    d = (new - base) / base
    if base_noise is None or new_noise is None:
        return "UNCLEAR", d, None
    n = math.hypot(base_noise, new_noise)
    if abs(d) >= threshold and abs(d) > n:
        return ("SLOWER" if (d > 0) != higher_is_better else "FASTER"), d, n
    if abs(d) + n < threshold:
        return "SAME", d, n
    if within is not None and abs(d) <= n and math.hypot(*within) < threshold:
        return "NOISY", d, n
    return "UNCLEAR", d, n


def check_times(records: list[Record], name: str, metric: str) -> None:
    """Fail closed on the inputs: the metric must be a column of the file, and every value it has
    in a passing record must be a positive, finite number (a NaN or a zero time would read as a
    huge speed-up). The metric may be `cycles` where the records carry an SM clock."""
    if metric == "cycles":
        add_cycles(records)
    if not any(r.timing.get("median_us") is not None for r in records):
        raise UsageError(f"{name} holds no timings (an interpreter or a verify run records none)")
    if not any(metric in getattr(r, g) for r in records for g in GROUPS):
        cols = sorted({k for r in records for k, v in r.timing.items() if isinstance(v, (int, float))})
        raise UsageError(f"--metric: {name} has no column {metric!r}; its timing columns: {', '.join(cols)}")
    for r in records:
        v = raw_value(r, metric)
        if r.status != "ok" or v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise UsageError(f"{name}: case {r.case_id} ({r.label} {params_text(r.params)}): {metric} is {v!r}; a time "
                             "must be a positive number")


def compare_records(base: list[Record], new: list[Record], *, threshold: float = 0.05, metric: str = "median_us",
                    cycles: bool = False, noise: tuple[FileNoise, FileNoise] | None = None) -> CompareReport:
    """Per case SAME / FASTER / SLOWER / NOISY / UNCLEAR (classify). `noise`: each file's judged
    half-widths (moebench.analysis.comparable.file_noise; default: from the records alone, every
    run-to-run term assumed). `cycles`: compare a time metric in SM clock cycles (µs x MHz, each
    record's own clock) instead of µs; a record without a clock is then not judged."""
    check_times(base, "BASE", metric)
    check_times(new, "NEW", metric)
    higher = metric_direction(metric)
    if cycles and not metric.endswith("_us"):
        raise UsageError(f"--cycles: compares a time (a *_us metric) in clock cycles; {metric!r} is not one")
    bmap, nmap = by_case(base, "BASE", "compare"), by_case(new, "NEW", "compare")
    fb, fn = noise or (file_noise({}, base, None, name="BASE"), file_noise({}, new, None, name="NEW"))
    rows = []
    for cid, b in bmap.items():
        n = nmap.get(cid)
        if n is None:
            continue
        row = CompareRow(cid, b.label, b.params, metric_of(b, metric), metric_of(n, metric), None, None, "—",
                         new_status=n.status, base_status=b.status, base_mhz=record_mhz(b), new_mhz=record_mhz(n),
                         base_cycles=record_cycles(b, metric), new_cycles=record_cycles(n, metric))
        if cycles:
            row.base_us, row.new_us = row.base_cycles, row.new_cycles
        if b.status != "ok" or n.status != "ok":
            which = [f"{s} {r.status}" for s, r in (("BASE", b), ("NEW", n)) if r.status != "ok"]
            row.note = "; ".join(which)
        elif row.base_us is None or row.new_us is None:
            what = "clock" if cycles else "timing"
            row.note = f"no {what} in " + " and ".join(
                s for s, v in (("BASE", row.base_us), ("NEW", row.new_us)) if v is None)
        else:
            xb, xn = fb.by_case.get(cid), fn.by_case.get(cid)
            # NOISY rests on measured run-to-run terms only: an assumed one never makes a case NOISY
            within = (xb.within, xn.within) if xb and xn and xb.measured and xn.measured else None
            row.verdict, row.diff, row.noise = classify(row.base_us, row.new_us, xb and xb.rel, xn and xn.rel,
                                                        threshold, higher, within=within)
            row.judged = row.noise is not None
            if row.noise is None:
                row.note = "no interval stated: " + "; ".join(  # which part each side lacks
                    f"{s} has no " + " or ".join(f"timing.{k}" for k in ("rel_noise", "rerun_rel") if r.timing.get(k) is None)
                    for s, x, r in (("BASE", xb, b), ("NEW", xn, n)) if x is None)
            notes = [f"{s} clock dropped" for s, r in (("BASE", b), ("NEW", n)) if r.timing.get("clock_ok") is False]
            if row.base_mhz and row.new_mhz and abs(row.new_mhz / row.base_mhz - 1) > CLOCK_TOLERANCE:
                notes.append(f"clock {row.base_mhz:.0f} -> {row.new_mhz:.0f} MHz")
            if notes:
                row.note = "; ".join(([row.note] if row.note else []) + notes)
        rows.append(row)
    only_base = [b for cid, b in bmap.items() if cid not in nmap]
    only_new = [n for cid, n in nmap.items() if cid not in bmap]
    vary = list(varying_params([bmap[r.case_id] for r in rows]))
    rep = CompareReport(rows, only_base, only_new, threshold, metric, vary, higher_is_better=higher, cycles=cycles,
                        noise_models={"BASE": fb.describe(), "NEW": fn.describe()})
    rep.notes += fb.notes + fn.notes + _clock_notes(rows, cycles)
    return rep


def compare_files(base: Path, new: Path, *, threshold: float = 0.05, metric: str = "median_us", cycles: bool = False,
                  noise: str = "auto", allow_settings: bool = False, allow_device: bool = False,
                  allow_foreign_model: bool = False) -> tuple[CompareReport, list[str]]:
    """`moebench compare BASE NEW`: the two files read, held to the comparability rule
    (check_comparable), each record's noise judged (file_noise) and widened to `noise`'s model
    (model_for), then compared; returns the report and the notes a reader must see first."""
    pb, rb = read_results(base)
    pn, rn = read_results(new)
    notes = check_comparable(pb, pn, allow_settings=allow_settings, allow_device=allow_device)
    judged = []
    for name, path, prov, recs in (("BASE", base, pb, rb), ("NEW", new, pn, rn)):
        fnoise = file_noise(prov, recs, path, name=name, allow_foreign=allow_foreign_model)
        model, line = model_for(noise, prov, allow_foreign=allow_foreign_model)
        fnoise.restate(model, f"--noise {noise}")
        judged.append(fnoise)
        notes += [f"{name}: {line}"] if line else []
    if pb.get("spec_sha256") and pn.get("spec_sha256") and pb["spec_sha256"] != pn["spec_sha256"]:
        notes.append("the two runs come from different spec files (sha256 differs); cases are matched by case_id")
    return compare_records(rb, rn, threshold=threshold, metric=metric, cycles=cycles, noise=(judged[0], judged[1])), notes


def _clock_notes(rows: list[CompareRow], cycles: bool) -> list[str]:
    """Whether the two files ran at other SM clocks (the median over the matched records)."""
    cb = [r.base_mhz for r in rows if r.base_mhz]
    cn = [r.new_mhz for r in rows if r.new_mhz]
    if not cb or not cn:
        return [] if not cycles else ["--cycles: " + ("BASE" if not cb else "NEW") + " records no SM clock"]
    mb, mn = median(cb), median(cn)
    if abs(mn / mb - 1) <= CLOCK_TOLERANCE:
        return []
    return [f"the SM clocks differ: BASE {mb:.0f} MHz, NEW {mn:.0f} MHz (median over the cases, {100 * (mn / mb - 1):+.1f}%, "
            f"beyond ±{100 * CLOCK_TOLERANCE:g}%): "
            + ("compared in cycles (µs x MHz)" if cycles else "µs mix the change with the clock's; --cycles compares "
               "in clock cycles")]

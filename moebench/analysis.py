"""Deciding from numbers: the statistics behind `moebench ab`, `compare` and `recommend`, and the
seed PRs' published tables kept as reference data (moebench/reference/*.yaml).

Pure Python over lists of floats and Records: no torch, nothing printed. The CLI
(moebench.cli_analysis) renders what these functions return.

Conventions: times are µs per launch and lower is better, unless a function takes
`lower_is_better`. Relative quantities are fractions inside (0.05 is 5%); percent appears only in
text. ON is the candidate and OFF the control, as in the seed PRs' A/B tables.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from moebench.errors import UsageError
from moebench.records import Record, load_results
from moebench.stats import mean, pooled_sd, stdev

OFF, ON = "OFF", "ON"

# ============================================================================ reading results

REF_PREFIX = "ref:"


def read_results(arg: str | Path) -> tuple[dict, list[Record]]:
    """A results JSON (or .partial.jsonl), or `ref:NAME` for a reference table. Anything that is
    not one raises UsageError naming the file; so does a file with no records."""
    text = str(arg)
    if text.startswith(REF_PREFIX):
        ref = load_reference(text[len(REF_PREFIX):])
        return ref.provenance(), ref.records
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory, expected a results .json file")
    try:
        prov, records = load_results(path)
    except (AttributeError, OSError) as e:  # valid JSON that is not an object, unreadable file
        raise UsageError(f"{path}: not a moebench results file ({type(e).__name__}: {e})") from None
    if not isinstance(prov, dict):
        raise UsageError(f"{path}: not a moebench results file (provenance is not an object)")
    if not records:
        raise UsageError(f"{path}: no records (expected a results file with a non-empty 'records' list)")
    return prov, records


def value_of(rec: Record, key: str) -> Any:
    """A parameter of a record by name; `label` and `variant` name the record's own fields. A
    launch parameter the variant does not read (None in params) is taken from the launch group,
    where the variant records what it used (legacy's grid cap 512, shipped's block size)."""
    if key in ("label", "variant"):
        return getattr(rec, key)
    v = rec.params.get(key)
    return rec.launch.get(key) if v is None else v


def metric_of(rec: Record, metric: str = "median_us") -> float | None:
    """The metric of an ok record (timing, work or cross group), or None."""
    if rec.status != "ok":
        return None
    for g in (rec.timing, rec.work, rec.cross, rec.checks):
        v = g.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def varying_keys(records: Sequence[Record]) -> list[str]:
    """`label` (if more than one) then the parameters that take more than one value."""
    out = []
    if len({r.label for r in records}) > 1:
        out.append("label")
    names: list[str] = []
    for r in records:
        names += [k for k in r.params if k not in names]
    for k in names:
        if len({repr(r.params.get(k)) for r in records}) > 1:
            out.append(k)
    return out


def describe(keys: Sequence[str], values: Sequence[Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values)) or "all"


# ============================================================================ reference tables

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


@dataclass
class Reference:
    """A seed PR's published table: records built from it, plus the figures around it."""

    name: str
    title: str
    source: str
    device: str
    family: str
    label: str
    timer: str
    units: dict[str, str]
    records: list[Record]
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    ab: dict[str, Any] | None = None
    path: Path | None = None

    def provenance(self) -> dict:
        return {"sweep": self.name, "reference": True, "source": self.source, "timer": self.timer,
                "device": {"name": self.device}, "command": f"(published: {self.source})"}


def reference_names() -> list[str]:
    return sorted(p.stem for p in REFERENCE_DIR.glob("*.yaml"))


def load_reference(name: str) -> Reference:
    """moebench/reference/NAME.yaml as records (one per published cell), labelled with the
    reference's label so they sit beside a measurement without being mistaken for one."""
    import yaml

    from moebench.cases import case_id

    path = REFERENCE_DIR / f"{name}.yaml"
    if not path.exists():
        raise UsageError(f"unknown reference {name!r}; known: {', '.join(reference_names()) or 'none'}")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
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
                     units=dict(doc.get("units") or {}), records=records, notes=list(doc.get("notes") or []),
                     facts=dict(doc.get("facts") or {}), ab=doc.get("ab"), path=path)


_REF_TIMING_KEYS = ("median_us", "min_us", "max_us", "iqr_us", "rel_noise")
_REF_VALUE_KEYS = _REF_TIMING_KEYS + ("floor_us", "x_floor", "bytes", "gbps", "occupancy_pct")


def reference_arms(ref: Reference) -> list["Arm"]:
    """The published A/B iterations of a reference (empty where only arm means were published)."""
    ab = ref.ab or {}
    return [Arm(a["side"], [float(v) for v in a["values"]]) for a in ab.get("arms") or ()]


def beside_reference(records: list[Record], ref: Reference, rows: str, cols: str, metric: str,
                     param_names: list[str]) -> list[tuple[str, str, Any]]:
    """For `show --reference`: (kind, title, table) for each measured pivot ("measured"), the
    reference over the same rows and columns ("reference"), and measured / reference ("ratio").
    Cells are matched on the (rows, cols) values alone; other parameters are whatever each side
    held fixed. Pivots with no reference cell at all are left out."""
    import pandas as pd

    from moebench.report import pivots

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


# ============================================================================ A/B arms


@dataclass
class Arm:
    side: str  # OFF | ON
    values: list[float]  # one per iteration, in order

    @property
    def mean(self) -> float:
        return mean(self.values)


@dataclass
class ABStats:
    """What an interleaved A/B says, in the terms the seed PRs argue with.

    - `sd_off`, `sd_on`: the sample sd of all iterations of a side, arms pooled together, so
      arm-to-arm drift counts as noise (seed 000's "pooled sd is 18.0 (OFF) and 23.2 (ON)").
      `within_sd_*` pools only the spread inside each arm, for comparison.
    - separation: whether the worst ON iteration beats the best OFF one ("every ON iteration
      beats every OFF iteration"), the reverse, or neither; `margin` is the gap between them
      (negative when the arms overlap).
    - `effect`: |Δ of means| over the larger of the two sds, the conservative reading of
      "the win is ~23× the run-to-run noise".
    """

    arms: list[Arm]
    lower_is_better: bool
    off_mean: float
    on_mean: float
    delta: float  # on_mean - off_mean
    rel: float  # delta / off_mean
    sd_off: float
    sd_on: float
    within_sd_off: float
    within_sd_on: float
    worst_on: float  # max(ON) when lower is better, else min(ON)
    best_off: float  # min(OFF) when lower is better, else max(OFF)
    separation: str  # "better" | "worse" | "overlap"
    margin: float  # >0: the gap by which the sides separate; <=0: the overlap
    effect: float  # |delta| / max(sd_off, sd_on); inf when both sides have no spread

    @property
    def noise(self) -> float:
        return max(self.sd_off, self.sd_on)

    @property
    def n_off(self) -> int:
        return sum(len(a.values) for a in self.arms if a.side == OFF)

    @property
    def n_on(self) -> int:
        return sum(len(a.values) for a in self.arms if a.side == ON)


def ab_stats(arms: Sequence[Arm], *, lower_is_better: bool = True) -> ABStats:
    off = [a for a in arms if a.side == OFF]
    on = [a for a in arms if a.side == ON]
    if not off or not on or any(not a.values for a in arms):
        raise ValueError("an A/B needs at least one OFF and one ON arm, each with values")
    xo = [v for a in off for v in a.values]
    xn = [v for a in on for v in a.values]
    sign = -1.0 if lower_is_better else 1.0  # "goodness" = sign * value: bigger is better
    worst_on = sign * min(sign * v for v in xn)
    best_off = sign * max(sign * v for v in xo)
    if sign * worst_on > sign * best_off:
        separation, margin = "better", abs(worst_on - best_off)
    elif min(sign * v for v in xo) > max(sign * v for v in xn):
        separation = "worse"
        margin = min(sign * v for v in xo) - max(sign * v for v in xn)
    else:
        separation, margin = "overlap", -abs(worst_on - best_off)
    mo, mn = mean(xo), mean(xn)
    sd_o, sd_n = stdev(xo), stdev(xn)
    noise = max(sd_o, sd_n)
    delta = mn - mo
    effect = abs(delta) / noise if noise > 0 else (math.inf if delta else 0.0)
    return ABStats(arms=list(arms), lower_is_better=lower_is_better, off_mean=mo, on_mean=mn, delta=delta,
                   rel=delta / mo if mo else math.nan, sd_off=sd_o, sd_on=sd_n,
                   within_sd_off=pooled_sd([a.values for a in off]), within_sd_on=pooled_sd([a.values for a in on]),
                   worst_on=worst_on, best_off=best_off, separation=separation, margin=margin, effect=effect)


def separation_text(st: ABStats, unit: str = "µs", digits: int = 3) -> str:
    """One sentence in the seed PRs' words, e.g. "max(ON) = 2.113 < min(OFF) = 8.041 µs — every ON
    iteration beats every OFF iteration, with a 5.928 µs margin"."""
    lo = st.lower_is_better
    on_f, off_f = ("max", "min") if lo else ("min", "max")
    d = f"{{:.{digits}f}}"
    w, b = d.format(st.worst_on), d.format(st.best_off)
    if st.separation == "better":
        rel = "<" if lo else ">"
        return (f"{on_f}(ON) = {w} {rel} {off_f}(OFF) = {b} {unit} — every ON iteration beats every OFF "
                f"iteration, with a {d.format(st.margin)} {unit} margin")
    if st.separation == "worse":
        return (f"every OFF iteration beats every ON iteration (ON is {'slower' if lo else 'worse'} in all "
                f"{st.n_on}), by a {d.format(st.margin)} {unit} margin")
    rel = "≥" if lo else "≤"
    return (f"the arms overlap: {on_f}(ON) = {w} {rel} {off_f}(OFF) = {b} {unit}, so ON does not beat OFF in "
            "every iteration")


def noise_text(st: ABStats, unit: str = "µs", digits: int = 3) -> str:
    d = f"{{:.{digits}f}}"
    what = "win" if (st.delta < 0) == st.lower_is_better and st.delta else "difference"
    if st.noise == 0:
        return f"Both sides have no spread (sd 0 {unit}): the effect in noise units is undefined."
    return (f"Pooled sd is {d.format(st.sd_off)} (OFF) and {d.format(st.sd_on)} (ON) {unit}, so the {what} "
            f"is ~{st.effect:.{0 if st.effect >= 10 else 1}f}× the run-to-run noise of this configuration.")


@dataclass
class Projection:
    layers: int
    before: float  # off per launch x layers
    after: float
    delta: float  # after - before


def per_step(off_us: float, on_us: float, layers: int | None) -> Projection | None:
    """Per-step cost of a kernel launched once per MoE layer: µs per launch x layers. None when
    the layer count is unknown (the spec names no model, or its model has no moe_layers)."""
    if not layers:
        return None
    return Projection(layers, off_us * layers, on_us * layers, (on_us - off_us) * layers)


def projection_text(p: Projection | None) -> str:
    if p is None:
        return "Per-step projection: none (the spec's model config gives no moe_layers)."
    return (f"Projected per step: {p.before:.1f} → {p.after:.1f} µs/step ({p.delta:+.1f} µs) over "
            f"{p.layers} MoE layers, one launch each.")


# ============================================================================ compare

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


def compare_records(base: list[Record], new: list[Record], *, threshold: float = 0.05,
                    metric: str = "median_us") -> CompareReport:
    bmap, nmap = _by_case(base, "BASE"), _by_case(new, "NEW")
    rows = []
    for cid, b in bmap.items():
        n = nmap.get(cid)
        if n is None:
            continue
        row = CompareRow(cid, b.label, b.params, metric_of(b, metric), metric_of(n, metric), None, None, "—")
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


# ============================================================================ recommend


@dataclass
class ConfigRegret:
    config: tuple  # values of the configuration keys
    times: dict[tuple, float | None]  # shape -> time (None: failed, untimed or not run)
    regrets: dict[tuple, float]  # shape -> time / best - 1 (inf where there is no time)
    worst: float
    worst_at: tuple | None
    weighted: float | None  # sum(w * regret) / sum(w) over the weighted shapes
    wins: list[tuple]  # shapes where this configuration is the best


@dataclass
class Recommendation:
    group_keys: list[str]
    group: tuple
    config_keys: list[str]
    over_keys: list[str]
    shapes: list[tuple]
    best: dict[tuple, tuple[tuple, float]]  # shape -> (config, time)
    configs: list[ConfigRegret]
    robust: ConfigRegret  # minimax regret
    weights: dict[tuple, float] | None = None
    weighted_choice: ConfigRegret | None = None
    metric: str = "median_us"

    def config_text(self, c: ConfigRegret) -> str:
        return describe(self.config_keys, c.config)

    def shape_text(self, s: tuple | None) -> str:
        return describe(self.over_keys, s) if s is not None else "—"

    def shapes_text(self, shapes: Sequence[tuple]) -> str:
        """"tokens=256, 1024" for one --over key; "a=1, b=2; a=3, b=4" for several."""
        if len(self.over_keys) == 1:
            return f"{self.over_keys[0]}=" + ", ".join(str(s[0]) for s in shapes)
        return "; ".join(self.shape_text(s) for s in shapes)


def recommend_keys(records: list[Record], family=None, over: Sequence[str] | None = None,
                   by: Sequence[str] | None = None) -> tuple[list[str], list[str], list[str]]:
    """(over, config, group) keys. `over`: the shapes to take the worst case across (default: the
    family's pivot columns). `config`: what is being chosen (default: label and the varying
    launch parameters, or every other varying key when the family is unknown). `group`: the other
    varying shape parameters; each of their combinations gets its own recommendation."""
    vary = varying_keys(records)
    launch = set(getattr(family, "launch_params", ()) or ())
    if over:
        over = list(over)
    else:
        col = (getattr(family, "default_pivot", None) or {}).get("cols")
        over = [col] if col in vary else [k for k in vary if k != "label" and k not in launch][:1]
    if not over:
        raise UsageError("--over: nothing varies across shapes in these results; name the shape parameter "
                         f"to take the worst case over (varying: {', '.join(vary) or 'none'})")
    names = {k for r in records for k in r.params} | {"label", "variant"}
    for k in list(over) + list(by or ()):
        if k not in names:
            raise UsageError(f"no parameter {k!r} in these results; parameters: {', '.join(sorted(names))}")
    if by:
        config = list(by)
    elif family is not None:
        config = [k for k in vary if k not in over and (k == "label" or k in launch)]
    else:
        config = [k for k in vary if k not in over]
    if not config:
        raise UsageError("nothing to choose between: no launch parameter or variant varies apart from "
                         f"{', '.join(over)} (varying: {', '.join(vary)}); pass --by")
    group = [k for k in vary if k not in over and k not in config]
    return over, config, group


def parse_weights(text: str | None, over: list[str], shape_values: Iterable[tuple]) -> dict[tuple, float] | None:
    """"256=0.7,16384=0.3" -> {(256,): 0.7, (16384,): 0.3}, checked against the swept values."""
    if not text:
        return None
    if len(over) != 1:
        raise UsageError(f"--weights: needs a single --over parameter, got {', '.join(over)}")
    known = {str(s[0]): s for s in shape_values}
    out: dict[tuple, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        k, sep, v = part.partition("=")
        if not sep:
            raise UsageError(f"--weights: expected VALUE=WEIGHT, got {part!r}")
        if k.strip() not in known:
            raise UsageError(f"--weights: {over[0]}={k.strip()} was not swept; swept: {', '.join(known)}")
        try:
            w = float(v)
        except ValueError:
            raise UsageError(f"--weights: weight of {k.strip()} must be a number, got {v!r}") from None
        if not math.isfinite(w) or w < 0:
            raise UsageError(f"--weights: weight of {k.strip()} must be >= 0, got {v}")
        out[known[k.strip()]] = w
    if not out or sum(out.values()) <= 0:
        raise UsageError("--weights: at least one weight must be positive")
    return out


def regret_table(records: list[Record], over: list[str], config_keys: list[str], group_keys: list[str], *,
                 metric: str = "median_us", weights_text: str | None = None) -> list[Recommendation]:
    """Regret of each configuration at each shape: time / the shape's best time - 1. The robust
    choice minimises the worst-case regret across shapes (ties: the lower weighted, then mean,
    regret); with weights, the weighted choice minimises the weighted mean regret instead. A
    configuration with no time at some shape (failed, untimed) has infinite regret there."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(tuple(value_of(r, k) for k in group_keys), []).append(r)
    out = []
    all_shapes = ordered(tuple(value_of(r, k) for k in over) for r in records)
    weights = parse_weights(weights_text, over, all_shapes)
    for gkey in ordered(groups):
        recs = groups[gkey]
        table: dict[tuple, dict[tuple, float | None]] = {}
        for r in recs:
            cfg = tuple(value_of(r, k) for k in config_keys)
            shape = tuple(value_of(r, k) for k in over)
            t = metric_of(r, metric)
            row = table.setdefault(cfg, {})
            if t is not None or shape not in row:
                row[shape] = t
        shapes = [s for s in ordered(s for row in table.values() for s in row)
                  if any(row.get(s) is not None for row in table.values())]
        if not shapes:
            continue
        best: dict[tuple, tuple[tuple, float]] = {}
        for s in shapes:
            cands = [(t, cfg) for cfg, row in table.items() if (t := row.get(s)) is not None]
            t, cfg = min(cands, key=lambda x: x[0])
            best[s] = (cfg, t)
        configs = []
        for cfg in ordered(table):
            row = table[cfg]
            times = {s: row.get(s) for s in shapes}
            regrets = {s: (t / best[s][1] - 1.0 if t is not None and best[s][1] > 0 else math.inf)
                       for s, t in times.items()}
            worst_at = max(shapes, key=lambda s: regrets[s])
            weighted = None
            if weights:
                ws = [(w, regrets[s]) for s, w in weights.items() if s in regrets and w > 0]
                tot = sum(w for w, _ in ws)
                weighted = sum(w * r for w, r in ws) / tot if tot else None
            wins = [s for s in shapes if best[s][0] == cfg]
            configs.append(ConfigRegret(cfg, times, regrets, regrets[worst_at], worst_at, weighted, wins))

        def key(c: ConfigRegret):
            mean_r = sum(c.regrets.values()) / len(c.regrets)
            return (c.worst, c.weighted if c.weighted is not None else 0.0, mean_r)

        robust = min(configs, key=key)
        wchoice = None
        if weights and any(c.weighted is not None for c in configs):
            wchoice = min((c for c in configs if c.weighted is not None), key=lambda c: (c.weighted, c.worst))
        out.append(Recommendation(group_keys, gkey, config_keys, over, shapes, best, configs, robust,
                                  weights, wchoice, metric))
    if not out:
        raise UsageError(f"no {metric} in these results: recommend needs timed results (a GPU sweep; an "
                         "interpreter run checks correctness only)")
    return out


def explain(rec: Recommendation) -> list[str]:
    """The argument in sentences, seed-000 style: the robust point, where it loses and by how
    much, and what the per-shape winners cost elsewhere."""
    r = rec.robust
    lines = []
    if not math.isfinite(r.worst):
        return [f"No configuration has a time at every shape; nothing can be recommended across "
                f"{', '.join(rec.over_keys)}."]
    at = r.worst_at
    lines.append(f"Robust choice (minimax regret): {rec.config_text(r)} — never more than "
                 f"{100 * r.worst:.1f}% off the per-shape best (worst at {rec.shape_text(at)}: "
                 f"{_t(r.times[at])} vs {_t(rec.best[at][1])} µs).")
    if not r.wins:
        lines.append("It is the fastest at no swept shape: the right point on the curve, not the minimum.")
    else:
        lines.append(f"It is also the fastest at {rec.shapes_text(r.wins)}.")
    for c in rec.configs:
        if c is r or not c.wins:
            continue
        tail = (f"but {100 * c.worst:.1f}% off the best at {rec.shape_text(c.worst_at)}"
                if math.isfinite(c.worst) else f"but has no time at {rec.shape_text(c.worst_at)}")
        lines.append(f"{rec.config_text(c)} is the fastest at {rec.shapes_text(c.wins)}, {tail}.")
    if rec.weights is not None and rec.weighted_choice is not None:
        w = ", ".join(f"{rec.shape_text(s)}: {v:g}" for s, v in rec.weights.items())
        wc = rec.weighted_choice
        lines.append(f"Weighted ({w}): {rec.config_text(wc)} has the least expected regret, "
                     f"{100 * wc.weighted:.1f}%" + (" — the same choice." if wc is r else
                                                    f"; the robust choice's is {100 * r.weighted:.1f}%."))
    return lines


def _t(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}".rstrip("0").rstrip(".") if v < 100 else f"{v:,.1f}"


def ordered(items: Iterable) -> list:
    """Distinct items in sorted order, numbers numerically, None last."""
    seen = list(dict.fromkeys(items))

    def key(t):
        t = t if isinstance(t, tuple) else (t,)
        return tuple((0, float(x), "") if isinstance(x, (int, float)) and not isinstance(x, bool)
                     else (1, 0.0, str(x)) for x in t)

    return sorted(seen, key=key)


# ============================================================================ A/B settings


@dataclass(frozen=True)
class Setting:
    """One KEY=VAL of `ab --off/--on`: a spec parameter, or an environment variable (env:NAME)."""

    key: str
    value: Any
    env: bool = False

    def text(self) -> str:
        return f"{'env:' if self.env else ''}{self.key}={self.value}"


def parse_setting(text: str, family, option: str) -> Setting:
    """Parse and check one KEY=VAL against the family's parameters (values as YAML scalars)."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"{option}: expected KEY=VAL or env:NAME=VAL, got {text!r}")
    if key.startswith("env:"):
        name = key[4:]
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise UsageError(f"{option}: {key!r} is not an environment variable name")
        return Setting(name, raw, env=True)
    if key not in family.params:
        raise UsageError(f"{option}: unknown parameter {key!r} of family {family.name!r}; expected one of "
                         f"{', '.join(family.params)} (or env:NAME=VAL for an environment variable)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    p = family.params[key]
    if p.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    problem = p.check(value)
    if problem:
        raise UsageError(f"{option}: {key}: {problem}")
    return Setting(key, value)


def settings_text(settings: Sequence[Setting]) -> str:
    return ", ".join(s.text() for s in settings) or "the spec as written"


def results_json_layout(prov: dict, records: list[Record], **extra: Any) -> str:
    """The results JSON layout of moebench.records ({"provenance", "records"}), with extra
    top-level sections (ab summaries) that load_results ignores."""
    return json.dumps({"provenance": prov, "records": [r.to_json() for r in records], **extra},
                      indent=1, default=str) + "\n"

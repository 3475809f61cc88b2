"""A results history across commits, drivers and machines, and change points in it.

The store is one SQLite file (the standard library's sqlite3): no new dependency; WAL journaling
and one IMMEDIATE transaction per added file, so several `history add` at once each land whole and
none is lost (a writer waits up to `BUSY_S` for another); one file that can be committed beside the
results it summarises (the last connection to close folds the WAL back into it).

Tables (schema version `SCHEMA_VERSION`, kept in `meta`; a file of another version is refused):

- meta(key, value): app = moebench-history, schema_version.
- runs: one row per results file, keyed by its run id (provenance.run_id when a run states one,
  else the SHA-256 of the file's provenance and records, so adding a file twice adds it once), with
  its provenance: device, driver, CUDA, torch, triton, SM/memory clocks, commit, spec hash, timing
  settings (the method), cross checks, command, timestamp, and the whole provenance as JSON.
- records: one row per record of a run: case id, variant, status, median, the noise fields
  (rel_noise = the stated ~95% half-width as a fraction; rel_noise_within; rerun_rel), timer,
  estimator, L2 state, the SM clock at the start and end of its timing, and the record as JSON.

`check` runs E-divisive means (moebench.analysis.edivisive) on each case's series of medians, in
run order (the run's timestamp, then the order added), and labels every change point:

- hardware/driver change: device, driver, CUDA, torch, triton or the SM/memory clock differ between
  the runs on either side of the step;
- method change: the timing method or its settings differ there;
- noise: the step lies within the stated intervals: [m(1-r), m(1+r)] before and after overlap,
  m the median of a side's medians and r the median of its rel_noise, or, where wider, the runs'
  own scatter: 1.96 * s / sqrt(k) / m, s the robust sd (1.4826 * median absolute residual about
  each side's median) pooled over both sides, k the side's runs;
- noise too: a step smaller than `min_step` (default 1%, `--min-step`);
- real: otherwise, a regression (slower after) or an improvement.

Nothing here prints, imports torch or runs a kernel.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from moebench.errors import UsageError

APP = "moebench-history"
SCHEMA_VERSION = 1
BUSY_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    added_seq INTEGER NOT NULL,
    added_at TEXT NOT NULL,
    source TEXT,
    sweep TEXT,
    timestamp TEXT,
    git_commit TEXT,
    spec_sha256 TEXT,
    device_name TEXT,
    device_slug TEXT,
    driver TEXT,
    cuda TEXT,
    torch TEXT,
    triton TEXT,
    sm_clock_max_mhz INTEGER,
    mem_clock_max_mhz INTEGER,
    timing_settings TEXT,
    cross_checks TEXT,
    command TEXT,
    provenance TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    idx INTEGER NOT NULL,
    sweep TEXT,
    family TEXT,
    case_id TEXT NOT NULL,
    variant TEXT,
    label TEXT,
    status TEXT,
    params TEXT,
    median_us REAL,
    rel_noise REAL,
    rel_noise_within REAL,
    rerun_rel REAL,
    timer TEXT,
    estimator TEXT,
    l2 TEXT,
    sm_clock_start_mhz INTEGER,
    sm_clock_end_mhz INTEGER,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX IF NOT EXISTS records_case ON records (sweep, case_id);
"""

# ============================================================================ the database


def _refuse(path: Path, why: str) -> UsageError:
    return UsageError(f"{path}: {why}")


@contextmanager
def open_db(path: Path | str, *, create: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to a history database, its schema checked. `create`: make the file (and its
    schema) when missing; otherwise a missing file is a UsageError. A file that is not SQLite, a
    SQLite file that is not a moebench history, or a history of another schema version is refused
    with one line (UsageError, exit 2)."""
    path = Path(path)
    if path.is_dir():
        raise _refuse(path, "is a directory, expected a history database file")
    if not path.exists() and not create:
        raise _refuse(path, "no such history database (make one with `moebench history add RESULTS --db PATH`)")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = sqlite3.connect(str(path), timeout=BUSY_S, isolation_level=None)
    except sqlite3.Error as e:
        raise _refuse(path, f"cannot open ({e})") from None
    try:
        try:
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}")
            _check_or_init(con, path, create)
        except sqlite3.DatabaseError as e:
            raise _refuse(path, f"not a moebench history database ({e})") from None
        yield con
    finally:
        con.close()


def _check_or_init(con: sqlite3.Connection, path: Path, create: bool) -> None:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and create:
        con.execute("PRAGMA journal_mode = WAL")
        with _write(con):
            if not {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        con.execute(stmt)
                con.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                [("app", APP), ("schema_version", str(SCHEMA_VERSION))])
        tables = {"meta"}
    if "meta" not in tables:
        raise _refuse(path, "a SQLite database but not a moebench history (no meta table)")
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("app") != APP:
        raise _refuse(path, f"a SQLite database but not a moebench history (meta.app is {meta.get('app')!r}, "
                            f"expected {APP!r})")
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise _refuse(path, f"history schema_version {meta.get('schema_version')!r}; this moebench reads version "
                            f"{SCHEMA_VERSION} only")


@contextmanager
def _write(con: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taken at once (BEGIN IMMEDIATE): a concurrent writer waits for it."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def run_id(prov: dict, records: Sequence[Any]) -> str:
    """The run's own id if it states one, else a hash of what it holds."""
    if isinstance(prov.get("run_id"), str) and prov["run_id"]:
        return prov["run_id"]
    blob = json.dumps({"provenance": prov, "records": [r.to_json() for r in records]}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _js(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


@dataclass
class Added:
    source: str
    run_id: str
    records: int
    new: bool  # False: the run was already in the database (nothing added)


def add_results(con: sqlite3.Connection, source: str, prov: dict, records: Sequence[Any]) -> Added:
    """Store one results file (its provenance and every record) in one transaction; a run already
    stored (same run id) is left as it is."""
    rid = run_id(prov, records)
    dev = prov.get("device") if isinstance(prov.get("device"), dict) else {}
    with _write(con):
        if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (rid,)).fetchone():
            return Added(source, rid, len(records), False)
        seq = con.execute("SELECT COALESCE(MAX(added_seq), 0) + 1 FROM runs").fetchone()[0]
        con.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rid, seq, time.strftime("%Y-%m-%dT%H:%M:%S%z"), source, prov.get("sweep"), prov.get("timestamp"),
             prov.get("git_commit"), prov.get("spec_sha256"), dev.get("name"), dev.get("slug"), dev.get("driver"),
             dev.get("cuda"), dev.get("torch"), dev.get("triton"), dev.get("sm_clock_max_mhz"),
             dev.get("mem_clock_max_mhz"), _js(prov.get("timing")), _js(prov.get("cross_checks")),
             prov.get("command"), _js(prov)))
        rows = []
        for i, r in enumerate(records):
            t = r.timing or {}
            rows.append((rid, i, r.sweep, r.family, r.case_id, r.variant, r.label, r.status, _js(r.params),
                         _num(t.get("median_us")) if r.status == "ok" else None, _num(t.get("rel_noise")),
                         _num(t.get("rel_noise_within")), _num(t.get("rerun_rel")), t.get("timer"),
                         t.get("estimator"), t.get("l2"), t.get("sm_clock_start_mhz"), t.get("sm_clock_end_mhz"),
                         _js(r.to_json())))
        con.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return Added(source, rid, len(records), True)


# ============================================================================ series


@dataclass
class Point:
    """One run's value of one case, with what it needs to be judged."""

    run_id: str
    timestamp: str | None
    commit: str | None
    median_us: float | None
    rel_noise: float | None
    status: str
    hardware: dict[str, Any]
    method: dict[str, Any]
    source: str | None = None
    rel_noise_within: float | None = None
    rerun_rel: float | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.median_us is None or self.rel_noise is None:
            return None
        return self.median_us * (1 - self.rel_noise), self.median_us * (1 + self.rel_noise)


@dataclass
class Series:
    sweep: str
    case_id: str
    variant: str
    label: str
    params: dict[str, Any]
    points: list[Point] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.sweep}/{self.case_id}"


_SELECT = """
SELECT r.sweep, r.case_id, r.variant, r.label, r.params, r.status, r.median_us, r.rel_noise, r.rel_noise_within,
       r.rerun_rel, r.timer, r.estimator,
       r.l2, r.sm_clock_start_mhz, g.run_id, g.timestamp, g.git_commit, g.device_name, g.driver, g.cuda, g.torch,
       g.triton, g.sm_clock_max_mhz, g.mem_clock_max_mhz, g.timing_settings, g.source, r.record
FROM records r JOIN runs g ON g.run_id = r.run_id
"""


def series(con: sqlite3.Connection, *, sweep: str | None = None, case: str | None = None) -> list[Series]:
    """Every case's series in run order (timestamp, then the order added). `case`: a case id or
    its prefix; `sweep`: one sweep only."""
    where, args = [], []
    if sweep:
        where.append("r.sweep = ?")
        args.append(sweep)
    if case:
        where.append("r.case_id LIKE ?")
        args.append(case.replace("%", "").replace("_", "") + "%")
    q = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + \
        " ORDER BY r.sweep, r.case_id, COALESCE(g.timestamp, ''), g.added_seq, r.idx"
    out: dict[tuple, Series] = {}
    for (sw, cid, var, lab, params, status, med, rel, within, rerun, timer, est, l2, clk, rid, ts, commit, dev, drv,
         cuda, torch_v, triton_v, smax, mmax, tset, src, rec) in con.execute(q, args):
        s = out.setdefault((sw, cid), Series(sw, cid, var, lab, json.loads(params or "{}")))
        hw = {"device": dev, "driver": drv, "cuda": cuda, "torch": torch_v, "triton": triton_v,
              "sm_clock_max_mhz": smax, "mem_clock_max_mhz": mmax, "sm_clock_mhz": clk}
        method = {"timer": timer, "estimator": est, "l2": l2, "settings": json.loads(tset or "null")}
        if s.points and s.points[-1].run_id == rid:  # a case twice in one run (resumed): keep the last
            s.points.pop()
        s.points.append(Point(rid, ts, commit, med if status == "ok" else None, rel, status, hw, method, src,
                              within, rerun))
    return list(out.values())


# ============================================================================ change points

REAL, METHOD, HARDWARE, NOISE = "real", "method change", "hardware/driver change", "noise"
# a step smaller than this is labelled noise whatever the intervals say: the change point search
# picks the most extreme split of a series, so a tiny step it finds in pure jitter can still clear
# the intervals of its two sides (0.15% steps, 2 of 600 synthetic case series with 0.1% jitter)
MIN_STEP = 0.01
# an SM clock that moved more than this between two runs counts as a hardware difference
CLOCK_TOLERANCE = 0.05


@dataclass
class Change:
    series: Series
    index: int  # the first point after the step (index into series.points)
    p: float
    before_us: float
    after_us: float
    before_rel: float | None
    after_rel: float | None
    label: str  # REAL, METHOD, HARDWARE or NOISE
    direction: str  # regression | improvement
    why: str

    @property
    def step(self) -> float:
        return self.after_us / self.before_us - 1.0

    @property
    def at(self) -> Point:
        return self.series.points[self.index]

    @property
    def regression(self) -> bool:
        return self.label == REAL and self.direction == "regression"


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def spread(*sides: Sequence[Point]) -> float:
    """A robust sd of one run's median about its side's median, pooled over the sides (so a side of
    two runs borrows the other's): 1.4826 * the median absolute residual; 0 with fewer than 4 runs."""
    res = []
    for side in sides:
        m = _median([x.median_us for x in side])
        res += [abs(x.median_us - m) for x in side]
    return 1.4826 * _median(res) if len(res) >= 4 else 0.0


def _differs(a: dict, b: dict, keys: Sequence[str]) -> list[str]:
    out = []
    for k in keys:
        x, y = a.get(k), b.get(k)
        if k == "sm_clock_mhz":
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 and \
                    abs(y / x - 1) > CLOCK_TOLERANCE:
                out.append(f"SM clock {x} -> {y} MHz")
        elif x != y and not (x is None or y is None):
            out.append(f"{k} {x} -> {y}")
    return out


def _method_diff(a: dict, b: dict) -> list[str]:
    out = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in ("timer", "estimator", "l2") if a.get(k) != b.get(k)]
    sa, sb = a.get("settings") or {}, b.get("settings") or {}
    if isinstance(sa, dict) and isinstance(sb, dict):
        out += [f"timing.{k} {sa.get(k)!r} -> {sb.get(k)!r}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    elif sa != sb:
        out.append("timing settings differ")
    return out


HARDWARE_KEYS = ("device", "driver", "cuda", "torch", "triton", "sm_clock_max_mhz", "mem_clock_max_mhz", "sm_clock_mhz")


def label_change(s: Series, pts: list[Point], lo: int, k: int, hi: int, p: float, min_step: float = 0.0) -> Change:
    """Label the step at pts[k] between the segments pts[lo:k] and pts[k:hi] (timed points only)."""
    before, after = pts[lo:k], pts[k:hi]
    mb, ma = _median([x.median_us for x in before]), _median([x.median_us for x in after])
    rb_list = [x.rel_noise for x in before if x.rel_noise is not None]
    ra_list = [x.rel_noise for x in after if x.rel_noise is not None]
    # each side's half-width: the stated one, or the runs' own scatter about their median where
    # that is wider (runs of one commit in fresh processes spread further than one run states)
    sd = spread(before, after)
    rb = max(_median(rb_list), 1.96 * sd / math.sqrt(len(before)) / mb) if rb_list else None
    ra = max(_median(ra_list), 1.96 * sd / math.sqrt(len(after)) / ma) if ra_list else None
    direction = "regression" if ma > mb else "improvement"
    hw = _differs(pts[k - 1].hardware, pts[k].hardware, HARDWARE_KEYS)
    method = _method_diff(pts[k - 1].method, pts[k].method)
    separated = None
    if rb is not None and ra is not None:
        separated = ma * (1 - ra) > mb * (1 + rb) or ma * (1 + ra) < mb * (1 - rb)
    iv = (f"[{mb * (1 - (rb or 0)):.4g}, {mb * (1 + (rb or 0)):.4g}] -> "
          f"[{ma * (1 - (ra or 0)):.4g}, {ma * (1 + (ra or 0)):.4g}] µs")
    if separated is False:
        label, why = NOISE, f"within the stated intervals {iv}"
    elif abs(ma / mb - 1) < min_step:
        label, why = NOISE, f"a step of {100 * (ma / mb - 1):+.2f}%, below --min-step {100 * min_step:g}%"
    elif hw:
        label, why = HARDWARE, "; ".join(hw)
    elif method:
        label, why = METHOD, "; ".join(method)
    else:
        label = REAL
        why = f"intervals separated {iv}" if separated else "no stated interval (rel_noise) to weigh it against"
    idx = s.points.index(pts[k])
    return Change(s, idx, p, mb, ma, rb, ra, label, direction, why)


def changes(s: Series, *, sig: float = 0.05, permutations: int = 199, seed: int = 0,
            min_step: float = MIN_STEP) -> list[Change]:
    """E-divisive change points of the series' medians (timed points only), each labelled."""
    from moebench.analysis.edivisive import e_divisive

    pts = [x for x in s.points if x.median_us is not None]
    if len(pts) < 4:
        return []
    cps = e_divisive([x.median_us for x in pts], sig=sig, permutations=permutations, seed=seed)
    cuts = [0] + [c.index for c in cps] + [len(pts)]
    return [label_change(s, pts, cuts[i], cuts[i + 1], cuts[i + 2], cps[i].p, min_step) for i in range(len(cps))]


@dataclass
class CheckReport:
    checked: int  # series with enough points
    short: int  # series with fewer than 4 timed points
    changes: list[Change]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]


def restate(all_series: Sequence[Series], model) -> int:
    """Re-state every point's interval with a device noise model (moebench.core.noise.NoiseModel):
    the within-run half-width with max(the stated run-to-run term, the model's term for the case) in
    quadrature, as the timer states it when the model is in force. Runs made before a model existed
    state only the default term, which the between-process (and between-commit) spread of some
    cases exceeds. Returns how many points were re-stated."""
    from moebench.core.noise import restated

    n = 0
    for s in all_series:
        if s.case_id not in model.cases:
            continue
        for x in s.points:
            if x.rel_noise is None:
                continue
            x.rel_noise = restated(x.rel_noise, x.rel_noise_within, x.rerun_rel, model, s.case_id)
            n += 1
    return n


def restate_with(all_series: Sequence[Series], setting: str = "auto") -> list[str]:
    """Re-state each sweep's intervals with its device noise model (`restate`): `auto` finds
    results/<device>/noise/<sweep>.json of the repository for the one device a sweep's runs were
    timed on (moebench.core.noise.resolve: another device's model is ignored), `none` keeps the
    stated intervals, anything else is a model file for every sweep. Returns one line per sweep
    saying what was used."""
    from moebench.core.noise import load, resolve
    from moebench.core.text import slugify

    if setting == "none":
        return []
    by_sweep: dict[str, list[Series]] = {}
    for s in all_series:
        by_sweep.setdefault(s.sweep, []).append(s)
    lines = []
    for sweep, group in sorted(by_sweep.items()):
        if setting != "auto":
            model = load(Path(setting))
        else:
            devices = {x.hardware.get("device") for s in group for x in s.points if x.hardware.get("device")}
            if len(devices) != 1:
                lines.append(f"{sweep}: no noise model ({len(devices)} devices in its runs): stated intervals")
                continue
            (name,) = devices
            choice = resolve("auto", sweep=sweep, device_name=name, device_slug=slugify(name))
            model = choice.model
            if model is None:
                lines.append(f"{sweep}: no noise model for {name}" + (f" ({choice.note})" if choice.note else "")
                             + ": stated intervals")
                continue
        n = restate(group, model)
        lines.append(f"{sweep}: intervals re-stated with {model.describe()} ({n} runs of the cases it holds)")
    return lines


def check(all_series: Sequence[Series], *, sig: float = 0.05, permutations: int = 199, seed: int = 0,
          min_step: float = MIN_STEP) -> CheckReport:
    if not 0 < sig < 1:
        raise UsageError(f"--sig: expected a significance level in (0, 1), got {sig:g}")
    if not 0 <= min_step < 1:
        raise UsageError(f"--min-step: expected a percentage in [0, 100), got {100 * min_step:g}")
    if permutations < 19:
        raise UsageError(f"--permutations: expected at least 19 (p can be no smaller than 1/(1+R)), got {permutations}")
    found, checked, short = [], 0, 0
    for s in all_series:
        if sum(x.median_us is not None for x in s.points) < 4:
            short += 1
            continue
        checked += 1
        found += changes(s, sig=sig, permutations=permutations, seed=seed, min_step=min_step)
    return CheckReport(checked, short, found)


def case_text(s: Series, keys: Sequence[str] | None = None) -> str:
    """"label[k=v,...]" over `keys` (default: the first four set), the unset ones left out."""
    keys = keys if keys is not None else [k for k, v in s.params.items() if v is not None][:4]
    return f"{s.label}[" + ",".join(f"{k}={s.params[k]}" for k in keys if s.params.get(k) is not None) + "]"


def varying_params(all_series: Sequence[Series]) -> list[str]:
    """The parameters that tell these series apart."""
    keys: list[str] = []
    for s in all_series:
        keys += [k for k in s.params if k not in keys]
    return [k for k in keys if len({_js(s.params.get(k)) for s in all_series}) > 1]

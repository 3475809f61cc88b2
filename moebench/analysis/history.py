"""A results history across commits, drivers and machines, and change points in it, as
docs/history.md describes: one SQLite file (`open_db`, `add_results`, `series`) and the labelled
E-divisive change points of each case's medians (`check`, `label_change`). Nothing here prints,
imports torch or runs a kernel."""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from moebench.analysis import separated_faster
from moebench.analysis.comparable import differences, file_noise, model_for, settings_of
from moebench.core.noise import restated
from moebench.core.stats import median
from moebench.errors import UsageError

APP = "moebench-history"
SCHEMA_VERSION = 2
BUSY_S = 60.0
INT64 = 2**63 - 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    added_seq INTEGER NOT NULL,
    added_at TEXT NOT NULL,
    source TEXT,
    sweep TEXT,
    timestamp TEXT,
    utc TEXT NOT NULL,
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
    settings TEXT,
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
    fingerprint TEXT,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX IF NOT EXISTS records_case ON records (sweep, case_id);
CREATE INDEX IF NOT EXISTS records_fingerprint ON records (fingerprint);
"""

# ============================================================================ the database


def _refuse(path: Path, why: str) -> UsageError:
    return UsageError(f"{path}: {why}")


@contextmanager
def open_db(path: Path | str, *, create: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to a history database, its schema checked. `create`: make the file (and its
    schema) when missing; otherwise a missing file is a UsageError. A file that is not SQLite, a
    SQLite file that is not a moebench history, a history of another schema version, or one holding
    objects moebench did not create, is refused with one line (UsageError, exit 2)."""
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
            con.execute("PRAGMA trusted_schema = OFF")
            _check_or_init(con, path, create)
        except sqlite3.OperationalError as e:
            if not _busy(e):
                raise _refuse(path, f"not a moebench history database ({e})") from None
            raise _refuse(path, f"busy: another process held it for over {BUSY_S:.0f} s ({e}); try again") from None
        except sqlite3.DatabaseError as e:
            raise _refuse(path, f"not a moebench history database ({e})") from None
        yield con
    finally:
        con.close()


def _objects(con: sqlite3.Connection) -> set[tuple[str, str, str]]:
    return {(t, n, " ".join((sql or "").split())) for t, n, sql in
            con.execute("SELECT type, name, sql FROM sqlite_master")}


def _expected() -> set[tuple[str, str, str]]:
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(_SCHEMA)
        return _objects(mem)
    finally:
        mem.close()


def _check_or_init(con: sqlite3.Connection, path: Path, create: bool) -> None:
    found = _objects(con)
    if not found and create:
        _wal(con)
        with _write(con):
            if not _objects(con):
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        con.execute(stmt)
                con.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                [("app", APP), ("schema_version", str(SCHEMA_VERSION))])
        found = _objects(con)
    if ("table", "meta") not in {(t, n) for t, n, _ in found}:
        raise _refuse(path, "a SQLite database but not a moebench history (no meta table)")
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("app") != APP:
        raise _refuse(path, f"a SQLite database but not a moebench history (meta.app is {str(meta.get('app'))[:40]!r}, "
                            f"expected {APP!r})")
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise _refuse(path, f"history schema_version {str(meta.get('schema_version'))[:20]!r}; this moebench reads "
                            f"version {SCHEMA_VERSION} only (add the results files to a new database)")
    extra = sorted(found - _expected())
    if extra:
        t, n, _ = extra[0]
        raise _refuse(path, f"holds {len(extra)} object(s) moebench did not create (e.g. {t} {n[:40]!r}); a history "
                            "database holds its own tables only, and SQL stored in one is never run")


def _busy(e: sqlite3.Error) -> bool:
    return getattr(e, "sqlite_errorname", "").startswith("SQLITE_BUSY") or "locked" in str(e)


def _wal(con: sqlite3.Connection) -> None:
    """Switch a new database to WAL. SQLite answers "database is locked" at once, without waiting
    out busy_timeout, while another connection is in it (two `history add` making one new file):
    retry until BUSY_S has passed."""
    deadline = time.monotonic() + BUSY_S
    while True:
        try:
            con.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if not _busy(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


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
        return prov["run_id"][:64]
    blob = json.dumps({"provenance": prov, "records": [r.to_json() for r in records]}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fingerprint(rec: Any) -> str | None:
    """The hash of a timed record's case and measurement (its timing group): equal in a run's stream,
    its final file and a run resumed from them; None for a record without a median."""
    if rec.status != "ok" or rec.timing.get("median_us") is None:
        return None
    return hashlib.sha256(json.dumps([rec.case_id, rec.timing], sort_keys=True, default=str).encode()).hexdigest()[:24]


def utc_instant(ts: Any) -> str | None:
    """A stamp with its UTC offset (2026-12-01T17:06:05+0000, or -05:00, or Z) as the UTC instant
    2026-12-01T17:06:05Z, which sorts as time does; None when it is not one."""
    try:
        t = datetime.fromisoformat(ts.strip())
    except (AttributeError, TypeError, ValueError):
        return None
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if t.tzinfo else None


def _js(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


class _Typed:
    """Values read from a results file, typed for the database on the way in: a wrong type or an
    integer SQLite cannot hold is a UsageError naming the file and the key (exit 2)."""

    def __init__(self, source: str):
        self.source = source

    def bad(self, key: str, want: str, v: Any) -> UsageError:
        return UsageError(f"{self.source}: {key}: expected {want}, got {json.dumps(v, default=str)[:60]}")

    def text(self, v: Any, key: str) -> str | None:
        if v is None or isinstance(v, str):
            return v
        raise self.bad(key, "text", v)

    def integer(self, v: Any, key: str) -> int | None:
        if v is None:
            return None
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) > INT64:
            raise self.bad(key, "an integer", v)
        return v


@dataclass
class Added:
    source: str
    run_id: str
    records: int
    new: bool  # False: the run was already in the database (nothing added)
    replaced: list[str] = field(default_factory=list)  # runs it replaces (the same run, fewer measurements)
    same_as: str | None = None  # the stored run it is part of, when not new
    notes: list[str] = field(default_factory=list)


def add_results(con: sqlite3.Connection, source: str, prov: dict, records: Sequence[Any]) -> Added:
    """Store one results file (its provenance and every record) in one transaction. The same run
    (a shared measurement: `fingerprint`) is stored once, as the file holding more timed records."""
    ty = _Typed(source)
    if "ab" in prov or len({r.case_id for r in records}) < len(records):
        raise UsageError(f"{source}: an A/B file or one with several records of a case (one per arm and iteration), "
                         "not a sweep run; history stores sweep runs")
    utc = utc_instant(prov.get("timestamp"))
    if utc is None:
        raise ty.bad("provenance.timestamp", "the run's start as an ISO time with its UTC offset",
                     prov.get("timestamp"))
    dev = prov.get("device") if isinstance(prov.get("device"), dict) else {}
    settings = settings_of(prov)
    fnoise = file_noise(prov, records, source, name=source)
    rid = run_id(prov, records)
    row = (rid, ty.text(source, "source"), ty.text(prov.get("sweep"), "provenance.sweep"), ty.text(prov.get("timestamp"),
           "provenance.timestamp"), utc, ty.text(prov.get("git_commit"), "provenance.git_commit"),
           ty.text(prov.get("spec_sha256"), "provenance.spec_sha256"),
           ty.text(settings["device"].get("name"), "provenance.device.name"),
           *(ty.text(dev.get(k), f"provenance.device.{k}") for k in ("slug", "driver", "cuda", "torch", "triton")),
           *(ty.integer(dev.get(k), f"provenance.device.{k}") for k in ("sm_clock_max_mhz", "mem_clock_max_mhz")),
           _js(settings), _js(prov.get("cross_checks")), ty.text(prov.get("command"), "provenance.command"), _js(prov))
    rows, prints = [], []
    for i, r in enumerate(records):
        t, key = r.timing or {}, f"records[{i}].timing"
        # a time is positive and finite once read (moebench.core.records)
        med = float(t["median_us"]) if r.status == "ok" and t.get("median_us") is not None else None
        x = fnoise.by_case.get(r.case_id) if med is not None else None
        fp = fingerprint(r)
        prints += [fp] if fp else []
        rows.append((rid, i, r.sweep, r.family, r.case_id, r.variant, r.label, r.status, _js(r.params), med,
                     x and x.rel, x and x.within, x and x.term, ty.text(t.get("timer"), f"{key}.timer"),
                     ty.text(t.get("estimator"), f"{key}.estimator"), ty.text(t.get("l2"), f"{key}.l2"),
                     ty.integer(t.get("sm_clock_start_mhz"), f"{key}.sm_clock_start_mhz"),
                     ty.integer(t.get("sm_clock_end_mhz"), f"{key}.sm_clock_end_mhz"), fp, _js(r.to_json())))
    with _write(con):
        if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (rid,)).fetchone():
            return Added(source, rid, len(records), False, same_as=rid, notes=fnoise.notes)
        same: dict[str, int] = {}
        for k in range(0, len(prints), 500):
            chunk = prints[k:k + 500]
            q = f"SELECT DISTINCT run_id FROM records WHERE fingerprint IN ({','.join('?' * len(chunk))})"
            for (other,) in con.execute(q, chunk):
                same[other] = con.execute("SELECT COUNT(fingerprint) FROM records WHERE run_id = ?",
                                          (other,)).fetchone()[0]
        if same and max(same.values()) >= len(prints):
            return Added(source, rid, len(records), False, same_as=max(same, key=same.get), notes=fnoise.notes)
        for other in same:
            con.execute("DELETE FROM records WHERE run_id = ?", (other,))
            con.execute("DELETE FROM runs WHERE run_id = ?", (other,))
        seq = con.execute("SELECT COALESCE(MAX(added_seq), 0) + 1 FROM runs").fetchone()[0]
        con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rid, seq, time.strftime("%Y-%m-%dT%H:%M:%S%z"), *row[1:]))
        con.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return Added(source, rid, len(records), True, replaced=sorted(same), notes=fnoise.notes)


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


_SELECT = """
SELECT r.sweep, r.case_id, r.variant, r.label, r.params, r.status, r.median_us, r.rel_noise, r.rel_noise_within,
       r.rerun_rel, r.timer, r.estimator, r.l2, r.sm_clock_start_mhz, g.run_id, g.timestamp, g.git_commit
FROM records r JOIN runs g ON g.run_id = r.run_id
"""
_RUNS = """SELECT run_id, device_name, driver, cuda, torch, triton, sm_clock_max_mhz, mem_clock_max_mhz, settings
FROM runs"""


def series(con: sqlite3.Connection, *, sweep: str | None = None, case: str | None = None) -> list[Series]:
    """Every case's series in run order (the UTC instant, then the order added). `case`: a case id
    or its prefix; `sweep`: one sweep only. A run's hardware and settings are read once and shared
    by its points."""
    runs = {}
    for rid, dev, drv, cuda, torch_v, triton_v, smax, mmax, settings in con.execute(_RUNS):
        runs[rid] = ({"device": dev, "driver": drv, "cuda": cuda, "torch": torch_v, "triton": triton_v,
                      "sm_clock_max_mhz": smax, "mem_clock_max_mhz": mmax}, json.loads(settings or "{}"))
    where, args = [], []
    if sweep:
        where.append("r.sweep = ?")
        args.append(sweep)
    if case:
        where.append("r.case_id LIKE ?")
        args.append(case.replace("%", "").replace("_", "") + "%")
    q = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + \
        " ORDER BY r.sweep, r.case_id, g.utc, g.added_seq, r.idx"
    out: dict[tuple, Series] = {}
    for (sw, cid, var, lab, params, status, med, rel, within, rerun, timer, est, l2, clk, rid, ts,
         commit) in con.execute(q, args):
        s = out.get((sw, cid))
        if s is None:
            s = out[(sw, cid)] = Series(sw, cid, var, lab, json.loads(params or "{}"))
        hw, settings = runs[rid]
        method = {"timer": timer, "estimator": est, "l2": l2, "settings": settings}
        s.points.append(Point(rid, ts, commit, med if status == "ok" else None, rel, status,
                              {**hw, "sm_clock_mhz": clk}, method, within, rerun))
    return list(out.values())


def order_notes(con: sqlite3.Connection, repo: Path | None = None) -> list[str]:
    """Where the runs' time order and their commits' ancestry disagree: a run whose commit is a
    strict ancestor of an earlier run's commit (both in the git repository at `repo`, default the
    working directory; commits it does not hold are not judged). The runs stay in time order."""
    runs = con.execute("SELECT git_commit, timestamp FROM runs ORDER BY utc, added_seq").fetchall()
    commits = [c for c, _ in runs]
    distinct = sorted({c for c in commits if isinstance(c, str) and c and c.isalnum()})
    if len(distinct) < 2:
        return []
    try:
        r = subprocess.run(["git", "cat-file", "--batch-check"], input="\n".join(distinct) + "\n", cwd=repo,
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    known = {c for c, line in zip(distinct, r.stdout.splitlines()) if line.split()[1:2] == ["commit"]}
    out = []
    for i in range(1, len(runs)):
        (a, ta), (b, tb) = runs[i - 1], runs[i]
        if a in known and b in known and a != b and subprocess.run(
                ["git", "merge-base", "--is-ancestor", b, a], cwd=repo, capture_output=True).returncode == 0:
            out.append(f"runs {i} and {i + 1}: time order and commit ancestry disagree ({b[:10]}, run {i + 1} at {tb}, "
                       f"is an ancestor of {a[:10]}, run {i} at {ta}); the runs are ordered by time")
    return out


# ============================================================================ change points

REAL, METHOD, HARDWARE, NOISE = "real", "method change", "hardware/driver change", "noise"
# a step smaller than this is labelled noise whatever the intervals say: the change point search
# picks the most extreme split of a series, so a tiny step it finds in pure jitter can still clear
# the intervals of its two sides
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


def spread(*sides: Sequence[Point]) -> float:
    """A robust sd of one run's median about its side's median, pooled over the sides (so a side of
    two runs borrows the other's): 1.4826 * the median absolute residual; 0 with fewer than 4 runs."""
    res = []
    for side in sides:
        m = median([x.median_us for x in side])
        res += [abs(x.median_us - m) for x in side]
    return 1.4826 * median(res) if len(res) >= 4 else 0.0


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
    """The timing method (timer, estimator, L2 state) or a setting that changes the number (the
    comparability rule: a noise-only setting is not a method change)."""
    out = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in ("timer", "estimator", "l2") if a.get(k) != b.get(k)]
    return out + [f"timing.{d}" if not d.startswith("$") else d
                  for d in differences(a.get("settings") or {}, b.get("settings") or {}).number]


HARDWARE_KEYS = ("device", "driver", "cuda", "torch", "triton", "sm_clock_max_mhz", "mem_clock_max_mhz", "sm_clock_mhz")


def label_change(s: Series, pts: list[Point], lo: int, k: int, hi: int, p: float, min_step: float = 0.0) -> Change:
    """Label the step at pts[k] between the segments pts[lo:k] and pts[k:hi] (timed points only)."""
    before, after = pts[lo:k], pts[k:hi]
    mb, ma = median([x.median_us for x in before]), median([x.median_us for x in after])
    rb_list = [x.rel_noise for x in before if x.rel_noise is not None]
    ra_list = [x.rel_noise for x in after if x.rel_noise is not None]
    # each side's half-width: the stated one, or the runs' own scatter about their median where
    # that is wider (runs of one commit in fresh processes spread further than one run states)
    sd = spread(before, after)
    rb = max(median(rb_list), 1.96 * sd / math.sqrt(len(before)) / mb) if rb_list else None
    ra = max(median(ra_list), 1.96 * sd / math.sqrt(len(after)) / ma) if ra_list else None
    direction = "regression" if ma > mb else "improvement"
    hw = _differs(pts[k - 1].hardware, pts[k].hardware, HARDWARE_KEYS)
    method = _method_diff(pts[k - 1].method, pts[k].method)
    separated = None
    if rb is not None and ra is not None:
        a, b = (ma, ma * ra), (mb, mb * rb)
        separated = separated_faster(a, b) or separated_faster(b, a)
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
    return Change(s, idx, p, mb, ma, label, direction, why)


def changes(s: Series, *, sig: float = 0.05, permutations: int = 199, min_step: float = MIN_STEP,
            window: int = 0) -> list[Change]:
    """E-divisive change points of the series' medians (timed points only; with `window`, its last
    `window` of them), each labelled."""
    from moebench.analysis.edivisive import e_divisive

    pts = [x for x in s.points if x.median_us is not None][-window if window else None:]
    if len(pts) < 4:
        return []
    cps = e_divisive([x.median_us for x in pts], sig=sig, permutations=permutations)
    cuts = [0] + [c.index for c in cps] + [len(pts)]
    return [label_change(s, pts, cuts[i], cuts[i + 1], cuts[i + 2], cps[i].p, min_step) for i in range(len(cps))]


# the change point search runs over each series' last WINDOW timed runs: its memory grows with the
# square of the window (about 100 bytes x WINDOW² per series at a time), not of the history
WINDOW = 100


@dataclass
class CheckReport:
    checked: int  # series with enough points
    short: int  # series with fewer than 4 timed points
    changes: list[Change]
    unmeasured: list[Series] = field(default_factory=list)  # checked series whose latest run timed nothing

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def gate(self) -> tuple[int, str]:
        """The exit code of `history check` and why: 1 on a real regression; 2 when it vouched for
        nothing (no series with 4 timed runs) or a series' latest run timed nothing (it failed or
        was not measured); else 0."""
        if self.regressions:
            c = self.regressions[0]
            return 1, (f"{len(self.regressions)} real regression(s), first {c.series.case_id} at run {c.index + 1} "
                       f"({(c.at.commit or '?')[:10]}), {100 * c.step:+.2f}%")
        if not self.checked:
            return 2, (f"no series has 4 timed runs ({self.short} with fewer): the check vouched for nothing; add "
                       "more runs")
        if self.unmeasured:
            s = self.unmeasured[0]
            last = s.points[-1]
            return 2, (f"{len(self.unmeasured)} series have no time in their latest run (e.g. {s.case_id}: run "
                       f"{len(s.points)}, commit {(last.commit or '?')[:10]}, {last.status}): the check cannot vouch "
                       "for the latest runs")
        return 0, "no real regression"


def restate_with(all_series: Sequence[Series], setting: str = "auto", *, allow_foreign: bool = False) -> list[str]:
    """Re-state each sweep's intervals with a device noise model, as `compare --noise` does
    (moebench.analysis.comparable.model_for: auto, none or a model file of the sweep's one device):
    each point's within-run half-width with max(its run-to-run term, the model's for the case) in
    quadrature, as the timer states it with the model in force. One line per sweep says what was used."""
    if setting == "none":
        return []
    by_sweep: dict[str, list[Series]] = {}
    for s in all_series:
        by_sweep.setdefault(s.sweep, []).append(s)
    lines = []
    for sweep, group in sorted(by_sweep.items()):
        devices = {x.hardware.get("device") for s in group for x in s.points if x.hardware.get("device")}
        if len(devices) != 1:
            lines.append(f"{sweep}: no noise model ({len(devices)} devices in its runs): stated intervals")
            continue
        model, note = model_for(setting, {"sweep": sweep, "device": {"name": devices.pop()}},
                                allow_foreign=allow_foreign)
        if model is None:
            lines.append(f"{sweep}: no noise model" + (f" ({note})" if note else "") + ": stated intervals")
            continue
        pts = [(s.case_id, x) for s in group if s.case_id in model.cases for x in s.points if x.rel_noise is not None]
        for cid, x in pts:
            x.rel_noise = restated(x.rel_noise, x.rel_noise_within, x.rerun_rel, model, cid)
        n = len(pts)
        lines.append(f"{sweep}: intervals re-stated with {model.describe()} ({n} runs of the cases it holds)"
                     + (f"; {note}" if note else ""))
    return lines


def check(all_series: Sequence[Series], *, sig: float = 0.05, permutations: int = 199, min_step: float = MIN_STEP,
          window: int = WINDOW) -> CheckReport:
    if not 0 < sig < 1:
        raise UsageError(f"--sig: expected a significance level in (0, 1), got {sig:g}")
    if not 0 <= min_step < 1:
        raise UsageError(f"--min-step: expected a percentage in [0, 100), got {100 * min_step:g}")
    if permutations < 19:
        raise UsageError(f"--permutations: expected at least 19 (p can be no smaller than 1/(1+R)), got {permutations}")
    if not 4 <= window <= 1000:
        raise UsageError(f"--window: expected a number of runs from 4 to 1000, got {window}")
    rep = CheckReport(0, 0, [])
    for s in all_series:
        if sum(x.median_us is not None for x in s.points) < 4:
            rep.short += 1
            continue
        rep.checked += 1
        if s.points[-1].median_us is None:
            rep.unmeasured.append(s)
        rep.changes += changes(s, sig=sig, permutations=permutations, min_step=min_step, window=window)
    return rep


def case_text(s: Series, keys: Sequence[str] | None = None) -> str:
    """"label[k=v,...]" over `keys` (default: every one set: the case's whole identity), the unset
    ones left out."""
    keys = keys if keys is not None else [k for k, v in s.params.items() if v is not None]
    return f"{s.label}[" + ",".join(f"{k}={s.params[k]}" for k in keys if s.params.get(k) is not None) + "]"

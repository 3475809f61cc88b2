"""A reproducibility study anyone can re-run (issue 23, item 5): N fresh-process sweeps, the noise
model they measure, and how well the stated intervals and the `compare` gate hold between them.

    python scripts/repro.py run --n 6 --sweeps count-block,act-grid --out DIR [--fresh-ceilings] [-- extra sweep args]
        N fresh-process runs of each sweep, back to back (`moebench sweep NAME --format json`, one
        process each): DIR/<sweep>-run<k>.json, and DIR/repro.json with the wall time of every run,
        its exit code, the host and the GPUs (nvidia-smi -L) the call ran on.
    python scripts/repro.py calibrate DIR|FILE... -o results/h200/noise/
        The noise model of every sweep in DIR... (noise_model): per case the
        half-width a single run must add so that any two of these runs agree within sqrt(ha² + hb²).
        A FILE (a run's results file) takes that run alone, to calibrate on some runs of a folder.
    python scripts/repro.py holdout DIR|FILE... -o FILE.md
        Leave one GPU out: per GPU, the model calibrated on the other GPUs' runs, and how many case
        pairs of its runs with the others' it covers. What the model promises a host it never saw.
    python scripts/repro.py report DIR... [--noise results/h200/noise [--restate]] -o FILE.md
        Per sweep: the runs (call, host, wall, share of the wall spent replaying, noise model in
        force, calibration or validation run), the per-case spread across all runs against the
        targets (every case within 3%, goal 1.5%), the coverage of every run pair by the intervals
        each run stated (and, with --noise, by the intervals re-stated with the model for runs made
        without it; with --restate for every run, also those made with an older model), the verdict
        of `moebench compare --fail-on-regression` between every pair (the real CLI, in a
        subprocess), and with runs from two GPUs the spread between the GPUs' means.

Each DIR is one `run` (a device call may make several; the spread between hosts groups runs by the
GPU they name). The model is measured on runs; a run it was calibrated on is in-sample (its pairs
agree nearly by construction): the report marks every run as calibration or validation by the
sha256 of its file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # timer_report.py beside this script

from moebench.core import noise as N  # noqa: E402
from moebench.core.provenance import git_commit  # noqa: E402
from moebench.core.records import Record, load_results, record_from  # noqa: E402
from moebench.core.store import atomic_write_text  # noqa: E402
from moebench.core.text import safe_stem  # noqa: E402
from moebench.errors import MoebenchError, UsageError  # noqa: E402
from timer_report import covered, spread_pct  # noqa: E402

TARGET_PCT, GOAL_PCT = 3.0, 1.5  # issue 23: every case within 3% across fresh processes (goal 1.5%)
COVER_TARGET = 0.95  # at least 95% of run pairs inside their stated intervals
RUN_RE = re.compile(r"(?P<sweep>.+)-run(?P<k>\d+)\.json$")


# ----------------------------------------------------------------------------------- run


def _gpus() -> list[str]:
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return [x.strip() for x in p.stdout.splitlines() if x.strip()] if p.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        return []


def replay_seconds(records: list[Record]) -> float:
    """The seconds a run spent replaying graphs: the sum of its records' timing.timing_wall_s."""
    return sum(float(r.timing.get("timing_wall_s") or 0) for r in records)


def run(n: int, sweeps: list[str], out: Path, extra: list[str], *, python: str = sys.executable,
        log=print, fresh_ceilings: bool = False) -> dict:
    """N fresh processes per sweep, one after the other; returns (and writes) DIR/repro.json.
    `fresh_ceilings`: delete the cached device ceilings before every run, so that each run measures
    them (in a child process since 6eaa1ea; in the timed process before, which moved some count
    cases by ~9%: results/h200/TIMER.md, "The per-process level, found")."""
    out.mkdir(parents=True, exist_ok=True)
    work = out / "_out"  # the sweeps' own output root: the device ceilings are measured once and cached there
    manifest = {"host": socket.gethostname(), "gpus": _gpus(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "extra_args": extra, "runs": []}
    for sweep in sweeps:
        for k in range(1, n + 1):
            stems = (sweep, f"{sweep}-quick")  # the file `sweep` writes, without and with --quick
            for old in [q for st in stems for q in work.glob(f"*/{st}.*")]:  # no stream of a previous run
                old.unlink()
            if fresh_ceilings:
                for cached in work.glob("*/device.json"):
                    cached.unlink()
            cmd = [python, "-m", "moebench", "sweep", sweep, "--out", str(work), "--format", "json", *extra]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            made = sorted(q for st in stems for q in work.glob(f"*/{st}.json"))
            entry = {"sweep": sweep, "run": k, "exit_code": p.returncode, "wall_s": round(wall, 2),
                     "command": " ".join(["moebench"] + cmd[3:]), "fresh_ceilings": fresh_ceilings}
            if made:
                dest = out / f"{sweep}-run{k}.json"
                shutil.move(str(made[0]), dest)
                _, recs = load_results(dest)
                entry.update(file=dest.name, replay_s=round(replay_seconds(recs), 2))
            else:
                entry["error"] = (p.stderr.strip().splitlines() or ["no results file"])[-1][:300]
            manifest["runs"].append(entry)
            log(f"{sweep} run {k}/{n}: exit {p.returncode}, {wall:.1f} s" + (f" ({entry['error']})" if "error" in entry
                                                                            else ""))
            (out / "repro.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# ----------------------------------------------------------------------------------- loading


@dataclass
class Run:
    path: Path
    call: str  # the DIR it came from (one device call)
    sweep: str
    k: int
    sha256: str
    prov: dict
    records: list[Record]
    wall_s: float | None
    host: str | None
    call_gpus: tuple[str, ...] = ()  # the GPUs its folder's repro.json lists (nvidia-smi -L)

    @property
    def gpu(self) -> str | None:
        """The GPU the run timed on, short (`GPU-884e02b4`): its provenance's (since b9bb54c), else
        the one GPU its call listed."""
        u = (self.prov.get("device") or {}).get("uuid")
        if not u and len(self.call_gpus) == 1:
            m = re.search(r"UUID: (GPU-[0-9a-f-]+)", self.call_gpus[0])
            u = m[1] if m else None
        return str(u)[:12] if u else None

    @property
    def name(self) -> str:
        return f"{self.call}/{self.path.name}"

    @property
    def by_case(self) -> dict[str, Record]:
        return {r.case_id: r for r in self.records if r.status == "ok" and r.timing.get("median_us") is not None}

    @property
    def model_path(self) -> str | None:
        nm = self.prov.get("noise_model")
        return nm.get("path") if isinstance(nm, dict) else None


def load_runs(dirs: list[Path]) -> dict[str, list[Run]]:
    """The runs of every sweep in DIRs, in (DIR, k) order. An entry may also be one run's file
    (DIR/<sweep>-run<k>.json, or any results file of a sweep), to take some runs of a folder."""
    by_sweep: dict[str, list[Run]] = {}
    folders = [d.parent if d.is_file() else d for d in dirs]
    short = [f.name or str(f) for f in folders]
    for i, d in enumerate(dirs):
        # a call is named by its folder; folders of one name (call5/fresh, call6/fresh) by parent/name
        label = short[i] if short.count(short[i]) == 1 else f"{folders[i].parent.name}/{folders[i].name}"
        files = None
        if d.is_file() and d.suffix == ".json":
            d, files = d.parent, [d]
        if not d.is_dir():
            raise UsageError(f"{d}: not a folder of runs (scripts/repro.py run --out DIR) or a run's file")
        man = {}
        if (d / "repro.json").exists():
            man = json.loads((d / "repro.json").read_text())
        walls = {e.get("file"): e.get("wall_s") for e in man.get("runs", [])}
        found = files or sorted(d.glob("*-run*.json"), key=lambda q: (q.name.rsplit("-run", 1)[0], _k(q)))
        for p in found:
            m = RUN_RE.match(p.name)
            if not m and not files:
                continue
            prov, recs = load_results(p)
            sweep = prov.get("sweep") or (m["sweep"] if m else p.stem)
            by_sweep.setdefault(sweep, []).append(
                Run(p, label, sweep, int(m["k"]) if m else 0, hashlib.sha256(p.read_bytes()).hexdigest(), prov,
                    recs, walls.get(p.name), man.get("host"), tuple(man.get("gpus") or ())))
    return by_sweep


def _k(p: Path) -> int:
    m = RUN_RE.match(p.name)
    return int(m["k"]) if m else 0


# ----------------------------------------------------------------------------------- calibrate


def pair_term(values: list[float]) -> float:
    """The relative half-width each run must state so that any two agree: (max - min) / min / sqrt(2),
    rounded up to 5 decimals (as records state it). Relative to the smaller value, not the mean, so
    that both tests hold for every pair i, j with h = median x term: |mi - mj| <= sqrt(hi² + hj²)
    (the coverage of the intervals), and |mi - mj| / base <= sqrt(2) x term (compare's noise with
    either run as BASE), so the gate cannot call a change within the measured spread SLOWER."""
    if len(values) < 2 or min(values) <= 0:
        return 0.0
    return math.ceil((max(values) - min(values)) / min(values) / math.sqrt(2) * 1e5) / 1e5


def noise_model(runs: list[tuple[str, str, dict, list]], *, floor: float | None = None) -> dict:
    """A noise model document from N >= 2 runs of one sweep on one device: `runs` is
    (name, sha256, provenance, records) per run. Per case timed in at least two runs: spread_rel =
    (max - min) / min, rerun_rel = max(floor, pair_term) = max(floor, spread_rel / sqrt(2)). `floor`:
    default the runs' timing.rerun_rel."""
    if len(runs) < 2:
        raise UsageError(f"calibrate: {len(runs)} run(s) of this sweep; at least 2 are needed")
    provs = [p for _, _, p, _ in runs]
    devices = {(p.get("device") or {}).get("name") for p in provs}
    sweeps = {p.get("sweep") for p in provs}
    if len(devices) != 1 or len(sweeps) != 1:
        raise UsageError(f"calibrate: the runs mix devices {sorted(map(str, devices))} or sweeps "
                         f"{sorted(map(str, sweeps))}; a model is per sweep and device")
    timing = provs[0].get("timing") or {}
    if floor is None:
        floor = float(timing.get("rerun_rel") or 0.005)
    values: dict[str, list[float]] = {}
    first: dict[str, Any] = {}
    for _, _, _, recs in runs:
        for r in recs:
            m = r.timing.get("median_us") if r.status == "ok" else None
            if isinstance(m, (int, float)) and m > 0:
                values.setdefault(r.case_id, []).append(float(m))
                first.setdefault(r.case_id, r)
    cases = {}
    for cid, vs in values.items():
        if len(vs) < 2:
            continue
        r = first[cid]
        cases[cid] = {"label": r.label, "params": {k: v for k, v in r.params.items() if v is not None},
                      "runs": len(vs), "spread_rel": round((max(vs) - min(vs)) / min(vs), 5),
                      "rerun_rel": max(floor, pair_term(vs))}
    if not cases:
        raise UsageError(f"calibrate: no case of {sorted(map(str, sweeps))[0]} was timed in two runs (runs without "
                         "a GPU time nothing)")
    commits = sorted({str(p.get("git_commit")) for p in provs})
    return {"device": devices.pop(), "sweep": sweeps.pop(), "commit": commits[0] if len(commits) == 1 else None,
            "commits": commits, "runs": len(runs),
            "method": {k: v for k, v in timing.items() if k != "noise"}, "floor": floor,
            "rule": "rerun_rel = max(floor, (max - min) / min / sqrt(2)) over the runs' medians",
            "calibrated_on": [{"file": n, "sha256": s} for n, s, _, _ in runs],
            "cases": dict(sorted(cases.items()))}



def _calibration(runs: list[Run]) -> dict:
    """The noise model document of these runs (calibrate)."""
    return noise_model([(str(r.path), r.sha256, r.prov, r.records) for r in runs])


def calibrate(dirs: list[Path], out: Path) -> list[Path]:
    """Write OUT/<sweep>.json, the noise model of every sweep found in DIRs (atomically). A sweep
    name read from a results file that could not name a file inside OUT (`../victim`) is refused
    before anything is written."""
    by_sweep = sorted(load_runs(dirs).items())
    for sweep, runs in by_sweep:
        if not safe_stem(sweep):
            raise UsageError(f"{runs[0].path}: provenance.sweep {sweep!r} cannot name a model file in {out} "
                             "(letters, digits, '.', '_', '-'); nothing written")
    written = []
    for sweep, runs in by_sweep:
        dest = out / f"{sweep}.json"
        atomic_write_text(dest, json.dumps(_calibration(runs), indent=1) + "\n")
        written.append(dest)
    return written


# ----------------------------------------------------------------------------------- report


def restated(rec: Record, model: N.NoiseModel | None) -> float:
    """A record's stated relative half-width re-stated with `model`: its within-run part with the
    model's term for the case (never below the run's own run-to-run term) in quadrature."""
    t = rec.timing
    rel = float(t.get("rel_noise") or 0)
    if model is None:
        return rel
    within = t.get("rel_noise_within")
    return N.restated(rel, float(within) if within is not None else None, float(t.get("rerun_rel") or 0), model,
                      rec.case_id)


def restate_timing(t: dict, case_id: str, model: N.NoiseModel) -> None:
    """A record's timing noise fields re-stated in place as the timer states them with `model` in
    force: rel_noise_within kept (or derived, within_part), rerun_rel the model's term for the case
    (never below the stated one), rel_noise their hypot, noise_model which term it is."""
    rel, rerun = float(t.get("rel_noise") or 0), float(t.get("rerun_rel") or 0)
    within = N.within_part(rel, t.get("rel_noise_within"), rerun)
    term, which = model.term(case_id, rerun)
    t.update(rel_noise=round(math.hypot(within, term), 5), rel_noise_within=round(within, 5),
             rerun_rel=round(term, 5), noise_model=which)


def with_noise(rec: Record, rel: float) -> Record:
    """A copy of `rec` stating `rel` as its half-width."""
    d = rec.to_json()
    d["timing"] = {**d["timing"], "rel_noise": rel}
    return record_from(d, "restated")


def pair_coverage(runs: list[Run], model: N.NoiseModel | None = None) -> dict:
    """Per pair of runs, how many of their common timed cases agree within sqrt(ha² + hb²) (each
    h = median x stated half-width, re-stated with `model` when given); and all pairs together."""
    pairs = []
    for a, b in combinations(runs, 2):
        ca, cb = a.by_case, b.by_case
        common = [c for c in ca if c in cb]
        ok = 0
        for c in common:
            ra, rb = ca[c], cb[c]
            if model is not None:
                ra, rb = with_noise(ra, restated(ra, model)), with_noise(rb, restated(rb, model))
            ok += covered(ra, rb)
        pairs.append({"a": a.name, "b": b.name, "covered": ok, "cases": len(common)})
    tot = sum(p["cases"] for p in pairs)
    return {"pairs": pairs, "covered": sum(p["covered"] for p in pairs), "cases": tot,
            "share": (sum(p["covered"] for p in pairs) / tot) if tot else None}


def compare_exit(a: Path, b: Path, *, python: str = sys.executable) -> tuple[int, str]:
    """`moebench compare A B --fail-on-regression` (the real CLI): exit code and its last line."""
    p = subprocess.run([python, "-m", "moebench", "compare", str(a), str(b), "--fail-on-regression"],
                       cwd=ROOT, capture_output=True, text=True)
    return p.returncode, gate_line(p.stderr + "\n" + p.stdout)


def gate_line(output: str) -> str:
    """What `compare --fail-on-regression` said of its verdict: its last line naming the gate, else
    its last line."""
    lines = [x for x in output.splitlines() if x.strip()]
    why = next((x for x in reversed(lines) if "fail-on-regression" in x), lines[-1] if lines else "")
    return why.strip()[:200]


def verdicts(runs: list[Run], model: N.NoiseModel | None = None, *, compare=compare_exit) -> list[dict]:
    """The gate between every pair (i < j: BASE run i, NEW run j), on the files as written, or
    (model) on copies whose records state the half-width re-stated with it."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for r in runs:
            if model is None:
                paths[r.name] = r.path
                continue
            doc = json.loads(r.path.read_text())
            by = r.by_case
            for d in doc["records"]:
                if d.get("case_id") in by:
                    restate_timing(d["timing"], d["case_id"], model)
            # the copy names the model it now states (beside it, with its sha256), as a run made with it does
            (Path(tmp) / "model.json").write_bytes(Path(model.path if Path(model.path).is_absolute()
                                                        else ROOT / model.path).read_bytes())
            doc["provenance"]["noise_model"] = {"setting": "model.json", "path": "model.json", "sha256": model.sha256}
            q = Path(tmp) / f"{len(paths)}-{r.path.name}"
            q.write_text(json.dumps(doc))
            paths[r.name] = q
        for a, b in combinations(runs, 2):
            code, why = compare(paths[a.name], paths[b.name])
            same = a.prov.get("git_commit") == b.prov.get("git_commit")
            out.append({"a": a.name, "b": b.name, "exit": code, "why": why, "same_commit": same,
                        "false_alarm": code == 1 and same})
    return out


def case_spreads(runs: list[Run]) -> list[dict]:
    """Per case timed in every run: its medians (in run order) and the spread (max - min) / min, %."""
    maps = [r.by_case for r in runs]
    rows = []
    for cid, rec in maps[0].items():
        if all(cid in m for m in maps):
            vals = [m[cid].timing["median_us"] for m in maps]
            rows.append({"case_id": cid, "label": rec.label, "params": rec.params, "medians": vals,
                         "spread_pct": spread_pct(vals)})
    return rows


def between_calls(runs: list[Run]) -> list[dict] | None:
    """Per case: the mean of each call's runs and the spread between those means, % (None: one call).
    A call is a GPU where every run names its GPU (two folders of one device call are one GPU, and
    the spread that matters is between hosts), else the folder the runs came from."""
    calls: dict[str, list[Run]] = {}
    by_gpu = all(r.gpu for r in runs)
    for r in runs:
        calls.setdefault(r.gpu if by_gpu else r.call, []).append(r)
    if len(calls) < 2:
        return None
    rows = []
    for row in case_spreads(runs):
        means = []
        for rs in calls.values():
            vals = [r.by_case[row["case_id"]].timing["median_us"] for r in rs]
            means.append(sum(vals) / len(vals))
        rows.append({**row, "call_means": means, "between_pct": spread_pct(means)})
    return rows


def _varying(rows: list[dict]) -> list[str]:
    keys = [k for k in rows[0]["params"]] if rows else []
    return [k for k in keys if len({str(r["params"].get(k)) for r in rows}) > 1]


def _case(row: dict, vary: list[str]) -> str:
    return f"{row['label']} " + ", ".join(f"{k}={row['params'].get(k)}" for k in vary)


def _share(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def sweep_section(sweep: str, runs: list[Run], model: N.NoiseModel | None, model_doc: dict | None, *,
                  compare=compare_exit, restate_all: bool = False) -> list[str]:
    out = [f"## {sweep}", ""]
    calib = {c.get("sha256") for c in (model_doc or {}).get("calibrated_on", [])}
    out += ["| run | call | GPU (host) | commit | wall s | replay s (share) | noise model in force | role |",
            "|---|---|---|---|---:|---:|---|---|"]
    for r in runs:
        rep = replay_seconds(r.records)
        role = ("calibration (in-sample)" if r.sha256 in calib else "validation") if model_doc else "—"
        wall = "—" if r.wall_s is None else f"{r.wall_s:.1f}"
        share = f" ({100 * rep / r.wall_s:.0f}%)" if r.wall_s else ""
        out.append(f"| {r.path.name} | {r.call} | {r.gpu or r.host or '—'} | {str(r.prov.get('git_commit'))[:9]} | "
                   f"{wall} | {rep:.1f}{share} | {_in_force(r)} | {role} |")
    out.append("")
    rows = case_spreads(runs)
    if not rows:
        return out + ["No case was timed in every run.", ""]
    sp = [x["spread_pct"] for x in rows]
    over, over_goal = sum(v > TARGET_PCT for v in sp), sum(v > GOAL_PCT for v in sp)
    out += [f"**Spread across all {len(runs)} runs** (max - min) / min per case: max {max(sp):.2f}%, "
            f"{over} of {len(rows)} cases over {TARGET_PCT:g}% (target: none) -> **{'met' if not over else 'NOT met'}**; "
            f"{over_goal} over the {GOAL_PCT:g}% goal.", ""]
    stated = pair_coverage(runs)
    out.append(f"**Interval coverage, as each run stated it** ({'; '.join(sorted({_in_force(r) for r in runs}))}): "
               f"{stated['covered']}/{stated['cases']} case pairs ({_share(stated['share'])}; target "
               f"{100 * COVER_TARGET:.0f}%).")
    restate = model is not None and (restate_all or any(r.model_path is None for r in runs))
    again = pair_coverage(runs, model) if restate else None
    if again:
        n_cal = sum(r.sha256 in calib for r in runs)
        out.append(f"**Re-stated with the model {model.describe()}** (the runs were made without it or with an "
                   f"older one; within-run half-width with the model's term in quadrature): {again['covered']}/{again['cases']} "
                   f"({_share(again['share'])}). {n_cal} of these {len(runs)} runs calibrated the model: their "
                   "pairs agree nearly by construction; only pairs with a validation run test it.")
        val = [p for p in again["pairs"] if not (_sha(runs, p["a"]) in calib and _sha(runs, p["b"]) in calib)]
        if val and n_cal:
            c, n = sum(p["covered"] for p in val), sum(p["cases"] for p in val)
            out.append(f"Pairs with at least one validation run: {c}/{n} ({_share(c / n if n else None)}).")
    out.append("")
    out += ["| pair | covered (stated) |" + (" covered (re-stated) |" if again else ""),
            "|---|---:|" + ("---:|" if again else "")]
    for i, p in enumerate(stated["pairs"]):
        out.append(f"| {p['a']} vs {p['b']} | {p['covered']}/{p['cases']} |"
                   + (f" {again['pairs'][i]['covered']}/{again['pairs'][i]['cases']} |" if again else ""))
    out.append("")
    ways = [("as written", None)] + ([("re-stated with the model", model)] if again else [])
    for label, mdl in ways:
        vs = verdicts(runs, mdl, compare=compare)
        alarms = sum(v["false_alarm"] for v in vs)
        closed = sum(v["exit"] == 2 for v in vs)
        out.append(f"**`moebench compare BASE NEW --fail-on-regression` between every pair, files {label}**: "
                   f"{sum(v['exit'] == 0 for v in vs)} of {len(vs)} exit 0; {alarms} false alarms (exit 1 between "
                   f"runs of one commit; target 0)" + (f"; {closed} exit 2 (cannot judge)" if closed else "") + ".")
        for v in vs:
            if v["exit"] != 0:
                out.append(f"- {v['a']} -> {v['b']}: exit {v['exit']}: {v['why']}"
                           + ("" if v["same_commit"] else " (different commits)"))
        out.append("")
    vary = _varying(rows)
    terms = (model_doc or {}).get("cases", {})
    out += ["| case | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | spread % | model term % |",
            "|---|" + "---:|" * (len(runs) + 2)]
    for x in sorted(rows, key=lambda x: -x["spread_pct"]):
        t = terms.get(x["case_id"], {}).get("rerun_rel")
        out.append(f"| {_case(x, vary)} | " + " | ".join(f"{v:.3f}" for v in x["medians"])
                   + f" | {x['spread_pct']:.2f} | {'—' if t is None else f'{100 * t:.2f}'} |")
    out.append("")
    bc = between_calls(runs)
    if bc:
        b = [x["between_pct"] for x in bc]
        n_over = sum(v > TARGET_PCT for v in b)
        if all(r.gpu for r in runs):
            where = (f"**Between GPUs** ({', '.join(dict.fromkeys(str(r.gpu) for r in runs))}; calls "
                     f"{', '.join(dict.fromkeys(r.call for r in runs))}): spread of the GPUs' mean per case max ")
        else:
            where = (f"**Between device calls** ({', '.join(dict.fromkeys(r.call for r in runs))}; hosts "
                     f"{', '.join(sorted({str(r.host) for r in runs}))}): spread of the calls' mean per case max ")
        out += [where +
                f"{max(b):.2f}%, {n_over} of {len(b)} cases over {TARGET_PCT:g}% -> "
                f"**{'met' if not n_over else 'NOT met'}**.", ""]
    return out


def _in_force(r: Run) -> str:
    """The run-to-run term a run stated: its model's file, or the default (its records' rerun_rel)."""
    if r.model_path:
        sha = str((r.prov.get("noise_model") or {}).get("sha256") or "")[:12]
        return f"measured: {r.model_path}" + (f" (sha256 {sha})" if sha else "")
    terms = {x.timing.get("rerun_rel") for x in r.by_case.values()} - {None}
    floor = (r.prov.get("timing") or {}).get("rerun_rel")
    if floor is None and len(terms) == 1:
        floor = terms.pop()
    return N.default_text(float(floor)) if floor is not None else "none stated"


def _sha(runs: list[Run], name: str) -> str:
    return next(r.sha256 for r in runs if r.name == name)


def report(dirs: list[Path], noise_dir: Path | None = None, *, compare=compare_exit, restate_all: bool = False,
           made_by: str | None = None) -> str:
    """The report of every sweep in DIRs. `restate_all`: re-state every run with the model of
    `noise_dir`, also runs made with an older model (to validate a re-calibrated one). `made_by`:
    the command line and commit, for the header."""
    by_sweep = load_runs(dirs)
    out = ["# Reproducibility across fresh processes (scripts/repro.py report)", ""]
    if made_by:
        out += [f"Made by {made_by}.", ""]
    out += [f"Runs: {', '.join(str(d) for d in dirs)} (each folder one `repro.py run`; the folders of one device "
            f"call share its GPU). Targets (issue 23): every case within {TARGET_PCT:g}% across runs (goal "
            f"{GOAL_PCT:g}%), at least {100 * COVER_TARGET:.0f}% of run pairs inside their stated intervals, 0 false "
            "alarms of `compare --fail-on-regression`.", ""]
    if noise_dir is not None:
        out += [f"Noise models from {noise_dir}.", ""]
    for sweep, runs in sorted(by_sweep.items()):
        model = doc = None
        p = noise_dir / f"{sweep}.json" if noise_dir is not None and safe_stem(sweep) else None
        if p is not None and p.is_file():
            model, doc = N.load(p), json.loads(p.read_text())
            names = ", ".join(Path(c["file"]).name for c in doc.get("calibrated_on", []))
            out += [f"Model for {sweep}: {model.describe()}, calibrated on {names}.", ""]
        elif noise_dir is not None:
            out += [f"No model for {sweep} in {noise_dir}: its runs are read as they stated their noise.", ""]
        out += sweep_section(sweep, runs, model, doc, compare=compare, restate_all=restate_all)
    return "\n".join(out) + "\n"


def holdout(dirs: list[Path], *, made_by: str | None = None) -> str:
    """Leave one GPU out: per sweep and per GPU (a run's GPU, else its folder), the model calibrated
    on every other GPU's runs, and how many case pairs of a held-out run with another GPU's run it
    covers once both are re-stated with it. What a model promises a GPU it has never seen."""
    out = ["# Leave one GPU out (scripts/repro.py holdout)", ""] + ([f"Made by {made_by}.", ""] if made_by else [])
    out += [f"Runs: {', '.join(str(d) for d in dirs)}. Per GPU, the model is calibrated on the runs of every other "
            "GPU (noise_model); each held-out run is paired with every run of another GPU, both "
            "re-stated with that model (within-run part, model term in quadrature). The pairs among the held-out "
            "GPU's own runs are counted apart: no model term is needed there.", ""]
    for sweep, runs in sorted(load_runs(dirs).items()):
        groups: dict[str, list[Run]] = {}
        for r in runs:
            groups.setdefault(r.gpu or r.call, []).append(r)
        out += [f"## {sweep}", "", f"{len(runs)} runs on {len(groups)} GPUs.", "",
                "| held-out GPU | runs | model: runs (GPUs) | pairs with other GPUs covered | its own pairs covered |",
                "|---|---:|---|---:|---:|"]
        tot = [0, 0]
        for g, held in groups.items():
            rest = [r for r in runs if (r.gpu or r.call) != g]
            if len(rest) < 2:
                continue
            doc = _calibration(rest)
            model = N.NoiseModel(f"(the runs of every GPU but {g})", "", doc["device"], doc["runs"], doc["commit"],
                                 doc["sweep"], {c: v["rerun_rel"] for c, v in doc["cases"].items()})
            cov = pair_coverage(held + rest, model)
            names = {r.name for r in held}
            cross = [x for x in cov["pairs"] if (x["a"] in names) != (x["b"] in names)]
            own = [x for x in cov["pairs"] if x["a"] in names and x["b"] in names]
            c, n = sum(x["covered"] for x in cross), sum(x["cases"] for x in cross)
            oc, on = sum(x["covered"] for x in own), sum(x["cases"] for x in own)
            tot[0] += c
            tot[1] += n
            gpus = len({r.gpu or r.call for r in rest})
            out.append(f"| {g} | {len(held)} | {len(rest)} ({gpus}) | {c}/{n} ({_share(c / n if n else None)}) | "
                       + (f"{oc}/{on} |" if on else "— |"))
        out += ["", f"All held-out pairs: {tot[0]}/{tot[1]} ({_share(tot[0] / tot[1] if tot[1] else None)}; "
                f"target {100 * COVER_TARGET:.0f}%).", ""]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--n", type=int, default=6)
    r.add_argument("--sweeps", default="count-block,act-grid")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--fresh-ceilings", action="store_true",
                   help="delete the cached device ceilings before every run (each run measures them)")
    c = sub.add_parser("calibrate")
    c.add_argument("dirs", nargs="+", type=Path)
    c.add_argument("-o", "--out", type=Path, required=True)
    h = sub.add_parser("holdout")
    h.add_argument("dirs", nargs="+", type=Path)
    h.add_argument("-o", "--out", type=Path, required=True)
    p = sub.add_parser("report")
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--noise", type=Path)
    p.add_argument("--restate", action="store_true", help="re-state every run with the --noise model, also runs "
                   "made with an older model")
    p.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "run":
            sweeps = [s.strip() for s in a.sweeps.split(",") if s.strip()]
            if a.n < 1 or not sweeps:
                raise UsageError("--n: expected at least 1 run" if a.n < 1 else
                                 f"--sweeps: expected a comma list of sweep names, got {a.sweeps!r}")
            m = run(a.n, sweeps, a.out, extra, fresh_ceilings=a.fresh_ceilings)
            return 0 if all(e.get("file") for e in m["runs"]) else 1
        if a.cmd == "calibrate":
            for w in calibrate(a.dirs, a.out):
                print(f"wrote {w}")
            return 0
        if a.cmd == "report" and a.restate and a.noise is None:
            raise UsageError("--restate: needs --noise DIR (the model to re-state the runs with)")
        if a.cmd == "report" and a.noise is not None and not a.noise.is_dir():
            raise UsageError(f"--noise: {a.noise} is not a folder of noise models (scripts/repro.py calibrate -o DIR)")
        made_by = f"`python3 scripts/repro.py {' '.join(argv)}` at commit {str(git_commit())[:12]}"
        atomic_write_text(a.out, holdout(a.dirs, made_by=made_by) if a.cmd == "holdout"
                          else report(a.dirs, a.noise, restate_all=a.restate, made_by=made_by))
        print(f"wrote {a.out}")
        return 0
    except MoebenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

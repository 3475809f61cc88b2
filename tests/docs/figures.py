"""The helpers a figure tag's expression may use (test-only; see test_docs.py).

A measured figure quoted in prose carries its source, `2.41 µs<!--fig cell("results/h200/count-block.json",
block_size=128, tokens=1024)-->`, and the suite evaluates the expression over these helpers and
compares it with the printed number. Paths are relative to the repository's root; a glob in `runs`
names several files. Every helper reads committed files only.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from functools import lru_cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("timing", "work", "checks", "cross", "launch", "params")


@lru_cache(maxsize=None)
def load(path: str):
    """A JSON (results, noise model, probe) or YAML file (a seed's published figures), parsed once."""
    if path.endswith((".yaml", ".yml")):
        return yaml.safe_load((ROOT / path).read_text())
    return json.loads((ROOT / path).read_text())


@lru_cache(maxsize=None)
def text(path: str) -> str:
    return (ROOT / path).read_text()


def _value(rec: dict, metric: str):
    """`metric` in a record: a dotted path (`cross.counters.l2_pct`) or a key of the record or of
    one of its sections (`median_us` is timing's, `x_floor` work's)."""
    if "." in metric:
        return field_of(rec, *metric.split("."))
    if metric in rec:
        return rec[metric]
    for s in SECTIONS:
        if metric in (rec.get(s) or {}):
            return rec[s][metric]
    raise KeyError(f"no {metric!r} in record {rec.get('case_id')}")


def _matches(rec: dict, variant, label, sel: dict) -> bool:
    if variant is not None and rec.get("variant") != variant:
        return False
    if label is not None and rec.get("label") != label:
        return False
    for k, v in sel.items():
        got = rec[k] if k in rec else (rec.get("params") or {}).get(k, (rec.get("launch") or {}).get(k))
        if got != v:
            return False
    return True


def records(file: str, variant: str | None = None, label: str | None = None, **sel) -> list[dict]:
    """The records of a results file (or an A/B file's, or an upstream-conformance file's pairs)
    whose variant, label and parameters match."""
    doc = load(file)
    recs = doc["records"] if isinstance(doc, dict) and "records" in doc else doc.get("pairs", doc)
    return [r for r in recs if _matches(r, variant, label, sel)]


def cell(file: str, metric: str = "median_us", variant: str | None = None, label: str | None = None, **sel):
    """`metric` of the one record of `file` that matches."""
    found = records(file, variant, label, **sel)
    if len(found) != 1:
        raise LookupError(f"{file}: {len(found)} records match variant={variant} label={label} {sel}")
    return _value(found[0], metric)


def field_of(doc, *path):
    """A value inside parsed JSON. A path step is a key, a list index, or a dict of key: value
    pairs selecting the one list element that holds them."""
    for step in path:
        if isinstance(step, dict):
            hits = [x for x in doc if all(x.get(k) == v for k, v in step.items())]
            if len(hits) != 1:
                raise LookupError(f"{len(hits)} elements match {step}")
            doc = hits[0]
        elif isinstance(doc, list):
            doc = doc[int(step)]
        else:
            doc = doc[step]
    return doc


def field(file: str, *path):
    """A value in any JSON file of the repository."""
    return field_of(load(file), *path)


def runs(*globs: str) -> list[str]:
    """The files the globs name, sorted, each glob's at least one."""
    out = []
    for g in globs:
        hit = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob(g))
        if not hit:
            raise LookupError(f"no file matches {g}")
        out += hit
    return out


def values(files, metric: str = "median_us", variant: str | None = None, **sel) -> list:
    """One case's `metric` in each file (the files of several runs of a sweep)."""
    return [cell(f, metric, variant, **sel) for f in _files(files)]


def _files(files) -> list[str]:
    return runs(files) if isinstance(files, str) else list(files)


def spread(files, metric: str = "median_us", variant: str | None = None, **sel) -> float:
    """(max - min) / min of one case over runs."""
    v = values(files, metric, variant, **sel)
    return (max(v) - min(v)) / min(v)


def spreads(files, metric: str = "median_us") -> dict[str, float]:
    """(max - min) / min per case id timed in every one of the files."""
    per: dict[str, list] = {}
    fs = _files(files)
    for f in fs:
        for r in records(f):
            v = (r.get("timing") or {}).get(metric)
            if r.get("status") == "ok" and v is not None:
                per.setdefault(r["case_id"], []).append(v)
    return {c: (max(v) - min(v)) / min(v) for c, v in per.items() if len(v) == len(fs)}


def max_spread(files, metric: str = "median_us") -> float:
    return max(spreads(files, metric).values())


def coverage(files) -> float:
    """The share of case pairs (two runs, one case timed in both) that agree within the intervals
    the runs state: |a - b| <= sqrt(ha² + hb²), h = median x rel_noise."""
    fs = _files(files)
    by = [{r["case_id"]: r["timing"] for r in records(f) if r.get("status") == "ok"
           and (r.get("timing") or {}).get("median_us") is not None} for f in fs]
    ok = n = 0
    for i in range(len(by)):
        for j in range(i + 1, len(by)):
            for c in by[i].keys() & by[j].keys():
                a, b = by[i][c], by[j][c]
                n += 1
                ok += abs(a["median_us"] - b["median_us"]) <= math.hypot(
                    a["median_us"] * a.get("rel_noise", 0.0), b["median_us"] * b.get("rel_noise", 0.0))
    return ok / n


def term(model: str, **params) -> float:
    """A noise model's run-to-run term (`rerun_rel`) for the case with these parameters."""
    hits = [c for c in load(model)["cases"].values() if all(c["params"].get(k) == v for k, v in params.items())]
    if len(hits) != 1:
        raise LookupError(f"{model}: {len(hits)} cases match {params}")
    return hits[0]["rerun_rel"]


def md(file: str, pattern: str, group: int = 1) -> float:
    """A number in a generated page (one without a JSON of its own, e.g. scripts/repro.py's
    reports): the regex's group, thousands separators dropped."""
    m = re.search(pattern, text(file), re.M | re.S)
    if not m:
        raise LookupError(f"{file}: no match for {pattern!r}")
    return float(m.group(group).replace(",", ""))


def vals(file: str, metric: str = "median_us", variant: str | None = None, label: str | None = None, **sel) -> list:
    """`metric` of every matching record of one file that has it."""
    out = []
    for r in records(file, variant, label, **sel):
        try:
            v = _value(r, metric)
        except (KeyError, TypeError):
            continue
        if v is not None:
            out.append(v)
    return out


def ratios(file: str, num: dict, den: dict, on: tuple[str, ...], metric: str = "median_us") -> list[float]:
    """num / den of `metric` for every pair of records that agree on the parameters `on`; `num` and
    `den` select the two sides (`{"variant": "nonpersistent"}`)."""
    out = []
    for a in records(file, **num):
        key = {k: a["params"][k] for k in on}
        b = records(file, **den, **key)
        if len(b) == 1 and _value(a, metric) is not None and _value(b[0], metric) is not None:
            out.append(_value(a, metric) / _value(b[0], metric))
    return out


def deltas(base: str, new: str, metric: str = "median_us") -> list[float]:
    """|new / base - 1| of `metric` for every case id timed in both files."""
    a = {r["case_id"]: _value(r, metric) for r in records(base) if r.get("status") == "ok"}
    b = {r["case_id"]: _value(r, metric) for r in records(new) if r.get("status") == "ok"}
    return [abs(b[c] / a[c] - 1) for c in a.keys() & b.keys() if a[c] is not None and b[c] is not None]


def regret(file: str, over: str = "tokens", metric: str = "median_us", variant: str | None = None,
           label: str | None = None, **choice) -> float:
    """The worst regret (time / per-shape best - 1) of one configuration across the shapes `over`
    takes (moebench recommend's rule); the records of `file` that match `choice` name it."""
    shapes: dict = {}
    for r in records(file):
        if r.get("status") == "ok" and (r.get("timing") or {}).get(metric) is not None:
            shapes.setdefault(r["params"][over], []).append(r)
    worst = None
    for rs in shapes.values():
        mine = [r for r in rs if _matches(r, variant, label, choice)]
        if len(mine) == 1:
            w = _value(mine[0], metric) / min(_value(r, metric) for r in rs) - 1
            worst = w if worst is None else max(worst, w)
    if worst is None:
        raise LookupError(f"{file}: no record matches {variant} {label} {choice}")
    return worst


def gpu(file: str) -> str | None:
    """The GPU a run timed on, as `GPU-82e5abc4`: its provenance's UUID, else the one GPU its
    folder's repro.json lists (scripts/repro.py run)."""
    u = ((load(file).get("provenance") or {}).get("device") or {}).get("uuid")
    man = ROOT / Path(file).parent / "repro.json"
    if not u and man.exists():
        listed = load(man.relative_to(ROOT).as_posix()).get("gpus") or []
        m = re.search(r"UUID: (GPU-[0-9a-f-]+)", listed[0]) if len(listed) == 1 else None
        u = m and m.group(1)
    return u[:12] if u else None


def made_from(page: str, sweep: str) -> list[str]:
    """The run files a generated page was made from, read from its `Made by` command line (a
    folder stands for its `SWEEP-run*.json`), those of one sweep."""
    cmd = re.search(r"Made by `([^`]+)`", text(page)).group(1).split()
    out = []
    for arg in cmd:
        if not arg.startswith("results/"):
            continue
        p = ROOT / arg
        if p.is_dir():
            out += [q.relative_to(ROOT).as_posix() for q in sorted(p.glob(f"{sweep}-run*.json"))]
        elif p.suffix == ".json" and load(arg)["provenance"].get("sweep") == sweep:
            out.append(arg)
    return out


def on_gpu(files, prefix: str) -> list[str]:
    """The files of runs timed on the GPU whose UUID starts with `prefix`."""
    return [f for f in _files(files) if (gpu(f) or "").startswith(prefix)]


def gpus(files) -> int:
    """How many GPUs the runs were timed on."""
    return len({gpu(f) for f in _files(files)})


def median(xs) -> float:
    return statistics.median(list(xs))


def count(xs) -> int:
    return len(list(xs))


NAMES = {f.__name__: f for f in (cell, field, records, runs, values, vals, ratios, deltas, spread, spreads,
                                  max_spread, md, regret, gpu, made_from, on_gpu, gpus, coverage, term, median,
                                  count)}
NAMES.update(min=min, max=max, sum=sum, len=len, abs=abs, sorted=sorted)

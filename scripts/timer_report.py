"""TIMER.md: how far moebench's numbers can be trusted on a device.

Reads N >= 2 back-to-back runs of the same sweeps (the first may carry --cross-check
dobench,nvbench,profiler) and writes, per sweep: agreement with triton's do_bench_cudagraph and
with NVIDIA's nvbench (batch and cold), graph-replay time against the profiler's pure kernel time
(their difference is the gap between graph nodes), and the spread of every case across the runs
with whether each run's stated 95% interval covers the others. Other pages (the timer study, the
wall-time profile) can be appended.

    python3 scripts/timer_report.py RUN1 RUN2 [RUN3 ...] --sweeps count-block,act-grid \\
        -o results/h200/TIMER.md [--append study.md wall.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's moebench, run from anywhere

from moebench.analysis import varying_keys  # noqa: E402
from moebench.core.records import Record, load_results  # noqa: E402
from moebench.core.stats import median  # noqa: E402

SPREAD_TARGET_PCT = 3.0  # issue 16: back-to-back runs within 3% on every case


def _pct(x: float) -> str:
    return f"{x:+.2f}%"


def spread_pct(values: Sequence[float]) -> float:
    """The largest difference between any two runs of a case, relative to the smaller: (max - min) / min."""
    return 100 * (max(values) - min(values)) / min(values)


def covered(a: Record, b: Record) -> bool:
    """Do two runs of a case agree within their stated uncertainty? |a - b| against the 95% interval of a
    difference, sqrt(ha^2 + hb^2), with h = median x rel_noise (the timer's stated half-width)."""
    ma, mb = a.timing["median_us"], b.timing["median_us"]
    ha, hb = ma * a.timing.get("rel_noise", 0.0), mb * b.timing.get("rel_noise", 0.0)
    return abs(ma - mb) <= math.hypot(ha, hb)


def timing_label(t: dict) -> str:
    """The placement method of a run's timing settings, in words."""
    g, mx = t.get("groups", 1), t.get("max_groups", 0) or t.get("groups", 1)
    groups = f"{g} group{'s' if g > 1 else ''}" + (f" (up to {mx})" if mx > g else "")
    copies = t.get("placement_copies") or 1
    strata = t.get("placement_strata") or 1
    return (f"{t.get('placements', 8)} sets" + (f" x {copies} placements" if copies > 1 else "") + f" x {groups}, "
            f"{t.get('placement_memory', 'caching')} memory" + (f", {strata} strata" if strata > 1 else "")
            + (f", rerun component {100 * t['rerun_rel']:.1f}%" if t.get("rerun_rel") else ""))


def _timed_in_all(loaded: list) -> list[list[Record]]:
    """Per case of the first run (in its order), the case's record in every run, where all timed it."""
    by_run = [{r.case_id: r for r in recs} for _, recs in loaded]
    rows = []
    for r in loaded[0][1]:
        runs = [b.get(r.case_id) for b in by_run]
        if all(x is not None and x.timing.get("median_us") is not None for x in runs):
            rows.append(runs)
    return rows


def _spread(loaded: list) -> dict:
    rows = _timed_in_all(loaded)
    spreads = {runs[0].case_id: spread_pct([x.timing["median_us"] for x in runs]) for runs in rows}
    pairs = [(runs[i], runs[j]) for runs in rows for i in range(len(runs)) for j in range(i + 1, len(runs))]
    vals = list(spreads.values())
    return {"runs": len(loaded), "cases": len(vals), "spreads": spreads,
            "max": max(vals) if vals else None, "median": median(vals) if vals else None,
            "over": sum(v > SPREAD_TARGET_PCT for v in vals), "covered": sum(covered(x, y) for x, y in pairs),
            "pairs": len(pairs), "wall_s": [p.get("sweep_wall_s") for p, _ in loaded]}


def spread_stats(paths: Sequence[Path]) -> dict:
    """The numbers behind a sweep's spread across runs: per case the spread, how many pairs of runs
    agree within their combined interval, each run's wall time."""
    return _spread([load_results(p) for p in paths])


def _dobench_delta(r: Record) -> float:
    """moebench vs do_bench_cudagraph in %, as the record has it (over the same placements)."""
    if r.cross.get("dobench_delta_pct") is not None:
        return r.cross["dobench_delta_pct"]
    d = r.cross["dobench_us"]
    return 100 * (r.timing["median_us"] - d) / d


def _stat(xs: list[float]) -> str:
    return f"median |Δ| {median([abs(x) for x in xs]):.2f}%, max |Δ| {max(abs(x) for x in xs):.2f}%"


def sweep_section(name: str, paths: Sequence[Path]) -> list[str]:
    """The section of one sweep over its runs (the first run's cross-checks, the spread of all)."""
    loaded = [load_results(p) for p in paths]
    provs = [p for p, _ in loaded]
    rows = _timed_in_all(loaded)
    lines = [f"## {name}", ""]
    if not rows:
        return lines + ["No case was timed in every run.", ""]
    a = [runs[0] for runs in rows]
    dob = [_dobench_delta(r) for r in a if r.cross.get("dobench_us")]
    nvb = [r.cross["nvbench_delta_pct"] for r in a if r.cross.get("nvbench_delta_pct") is not None]
    nvc = [r.cross["nvbench_cold_delta_pct"] for r in a if r.cross.get("nvbench_cold_delta_pct") is not None]
    gap = [r.cross["node_gap_us"] for r in a if r.cross.get("node_gap_us") is not None]
    st = _spread(loaded)
    spreads = [st["spreads"][runs[0].case_id] for runs in rows]
    cover, n_pairs = st["covered"], st["pairs"]
    noise = [100 * x.timing.get("rel_noise", 0) for runs in rows for x in runs]
    methods = sorted({timing_label(p.get("timing", {})) for p in provs})
    walls = ", ".join(str(p.get("sweep_wall_s")) for p in provs)
    lines += [
        f"- Cases timed in all {len(paths)} runs: {len(rows)}",
        (f"- moebench vs do_bench_cudagraph (run 1): {_stat(dob)}" if dob else "- do_bench_cudagraph: not run"),
        (f"- moebench vs nvbench batch (run 1): {_stat(nvb)}" + (f"; vs nvbench cold: {_stat(nvc)}" if nvc else "")
         if nvb else "- nvbench: not run"),
        (f"- graph replay − profiler kernel time (node gap, run 1): median {median(gap):.3f} µs, "
         f"range {min(gap):.3f} – {max(gap):.3f} µs" if gap else "- profiler: not run"),
        f"- spread across the {len(paths)} runs, (max − min) / min per case: median {median(spreads):.2f}%, "
        f"max {max(spreads):.2f}%; {st['over']} of {len(rows)} cases over {SPREAD_TARGET_PCT:g}%",
        f"- stated 95% half-width (rel_noise): median {median(noise):.3f}%, max {max(noise):.3f}%; "
        f"pairs of runs within their combined interval: {cover} of {n_pairs}"
        + (f" ({100 * cover / n_pairs:.0f}%)" if n_pairs else ""),
        f"- timing settings: {', '.join(methods)}; wall time per sweep (cases incl. JIT compile and "
        f"verification): {walls} s",
        "",
    ]
    head = "| case | params | " + " | ".join(f"run {i + 1} µs" for i in range(len(paths))) + " | spread | ±95% |"
    cols = 4 + len(paths)
    extra = [("dobench", any(r.cross.get("dobench_us") for r in a)), ("nvbench", bool(nvb)),
             ("profiler", bool(gap))]
    for what, present in extra:
        if present:
            head += {"dobench": " Δ do_bench |", "nvbench": " Δ nvbench batch / cold |",
                     "profiler": " kernel µs (CUPTI) | node gap µs |"}[what]
            cols += 2 if what == "profiler" else 1
    lines += [head, "|" + "---|" * cols]
    vary = [k for k in varying_keys(a) if k != "label"]
    for runs, sp in zip(rows, spreads):
        r = runs[0]
        params = ", ".join(f"{k}={r.params.get(k)}" for k in vary if r.params.get(k) is not None)
        cells = [f"`{r.case_id}` {r.label}", params] + [f"{x.timing['median_us']:.3f}" for x in runs]
        cells += [f"{sp:.2f}%" + (" ✗" if sp > SPREAD_TARGET_PCT else ""),
                  f"{100 * median([x.timing.get('rel_noise', 0) for x in runs]):.2f}%"]
        for what, present in extra:
            if not present:
                continue
            c = r.cross
            if what == "dobench":
                cells.append(_pct(_dobench_delta(r)) if c.get("dobench_us") else "—")
            elif what == "nvbench":
                b, k = c.get("nvbench_delta_pct"), c.get("nvbench_cold_delta_pct")
                cells.append(f"{_pct(b) if b is not None else '—'} / {_pct(k) if k is not None else '—'}")
            else:
                cells += [f"{c['kernel_us']:.3f}" if c.get("kernel_us") else "—",
                          f"{c['node_gap_us']:.3f}" if c.get("node_gap_us") is not None else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def build(runs: Sequence[Path], sweeps: list[str], slug: str, header: str = "",
          title: str = "# Timer trust report") -> str:
    out = [title, ""]
    if header:
        out += [header.strip(), ""]
    for name in sweeps:
        paths = [run / slug / f"{name}.json" for run in runs]
        missing = [p for p in paths if not p.exists()]
        if missing:
            out += [f"## {name}", "", f"missing: {', '.join(map(str, missing))}", ""]
        else:
            out += sweep_section(name, paths)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="results roots of the runs (RUN/<slug>/NAME.json), first "
                    "the one with cross-checks")
    ap.add_argument("--sweeps", default="count-block,act-grid")
    ap.add_argument("--slug", default="h200")
    ap.add_argument("--header", default="")
    ap.add_argument("--title", default="# Timer trust report")
    ap.add_argument("--append", type=Path, nargs="*", default=[], help="markdown pages to add at the end")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        ap.error("give at least two runs")
    text = build(a.runs, a.sweeps.split(","), a.slug, a.header, a.title)
    for extra in a.append:
        if extra.exists():
            text += "\n" + extra.read_text()
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(text if text.endswith("\n") else text + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""TIMER.md: how far moebench's numbers can be trusted on a device.

Reads two back-to-back runs of the same sweeps (the first with --cross-check dobench,profiler)
and writes, per sweep: agreement with triton's do_bench_cudagraph, graph-replay time against
the profiler's pure kernel time (their difference is the gap between graph nodes), the spread
between the two runs, and each sweep's wall time including compilation and verification.

    python -m moebench.analysis.timer_report RUN_A RUN_B --sweeps count-block,act-grid -o results/h200/TIMER.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moebench.analysis import varying_keys
from moebench.core.records import load_results
from moebench.core.stats import median


def _pct(x: float) -> str:
    return f"{x:+.2f}%"


def sweep_section(name: str, a_path: Path, b_path: Path) -> list[str]:
    pa, ra = load_results(a_path)
    pb, rb = load_results(b_path)
    by_b = {r.case_id: r for r in rb}
    lines = [f"## {name}", ""]
    rows = []
    for r in ra:
        o = by_b.get(r.case_id)
        m = r.timing.get("median_us")
        if m is None or o is None or o.timing.get("median_us") is None:
            continue
        rows.append((r, o))
    if not rows:
        return lines + ["No timed cases in both runs.", ""]
    dob = [100 * (r.timing["median_us"] - r.cross["dobench_us"]) / r.cross["dobench_us"]
           for r, _ in rows if r.cross.get("dobench_us")]
    gap = [r.cross["node_gap_us"] for r, _ in rows if r.cross.get("node_gap_us") is not None]
    rep = [100 * (o.timing["median_us"] - r.timing["median_us"]) / r.timing["median_us"] for r, o in rows]
    noise = [100 * r.timing.get("rel_noise", 0) for r, _ in rows]
    lines += [
        f"- Cases timed in both runs: {len(rows)}",
        f"- moebench vs do_bench_cudagraph: median |Δ| {median([abs(x) for x in dob]):.2f}%, "
        f"max |Δ| {max(abs(x) for x in dob):.2f}%" if dob else "- do_bench_cudagraph: not run",
        f"- graph replay − profiler kernel time (node gap): median {median(gap):.3f} µs, "
        f"range {min(gap):.3f} – {max(gap):.3f} µs" if gap else "- profiler: not run",
        f"- run A vs run B: median |Δ| {median([abs(x) for x in rep]):.2f}%, max |Δ| {max(abs(x) for x in rep):.2f}%",
        f"- achieved median uncertainty (95% half-width, IQR-based): median {median(noise):.3f}%, max {max(noise):.3f}%",
        f"- wall time per sweep (cases incl. JIT compile and verification): run A {pa.get('sweep_wall_s')} s "
        f"(with cross-checks), run B {pb.get('sweep_wall_s')} s; compile {pa.get('compile_s_total')} s in A, "
        f"{pb.get('compile_s_total')} s in B",
        "",
        "| case | params | A µs | B µs | A−B | do_bench µs | Δ vs do_bench | kernel µs (CUPTI) | node gap µs | SM MHz start/end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    vary = [k for k in varying_keys([r for r, _ in rows]) if k != "label"]
    for r, o in rows:
        a, b = r.timing["median_us"], o.timing["median_us"]
        d = r.cross.get("dobench_us")
        k = r.cross.get("kernel_us")
        params = ", ".join(f"{k2}={r.params.get(k2)}" for k2 in vary if r.params.get(k2) is not None)
        lines.append(
            f"| `{r.case_id}` {r.label} | {params} | {a:.3f} | {b:.3f} | {_pct(100 * (a - b) / b)} | "
            f"{d:.3f} | {_pct(100 * (a - d) / d)} | " if d else
            f"| `{r.case_id}` {r.label} | {params} | {a:.3f} | {b:.3f} | {_pct(100 * (a - b) / b)} | — | — | ")
        lines[-1] += (f"{k:.3f} | {r.cross.get('node_gap_us', 0):.3f} | " if k else "— | — | ")
        lines[-1] += f"{r.timing.get('sm_clock_start_mhz')}/{r.timing.get('sm_clock_end_mhz')} |"
    lines.append("")
    return lines


def build(run_a: Path, run_b: Path, sweeps: list[str], slug: str, header: str = "") -> str:
    out = ["# Timer trust report", ""]
    if header:
        out += [header.strip(), ""]
    for name in sweeps:
        a = run_a / slug / f"{name}.json"
        b = run_b / slug / f"{name}.json"
        if a.exists() and b.exists():
            out += sweep_section(name, a, b)
        else:
            out += [f"## {name}", "", f"missing: {a if not a.exists() else b}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--sweeps", default="count-block,act-grid")
    ap.add_argument("--slug", default="h200")
    ap.add_argument("--header", default="")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(build(a.run_a, a.run_b, a.sweeps.split(","), a.slug, a.header))


if __name__ == "__main__":
    main()

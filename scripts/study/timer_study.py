"""Run-to-run study on a GPU (issue 16, item 4). A measurement script, not a test.

Two back-to-back count-block runs on an H200 differed by 12% at one case (persistent, 1024 tokens,
BLOCK_SIZE 512, capacity 16384: 3.73 vs 3.33 µs) while each run claimed a half-width under 0.5%.
One run of this script says why and which timing method fixes it.

    python3 scripts/study/timer_study.py cause OUT [--processes 4]
        Part A, the cause, on that case. In this process:
        A1 placements as the session makes them (consecutive build_inputs in torch's caching
           allocator), each timed alone, with their buffers' addresses and 2 MiB pages;
        A2 placements in memory pools of their own (fresh segments), each timed alone;
        A3 one placement, graphs captured afresh (graph state, not placement);
        A4 one graph replayed in batches over a second (drift);
        A5 the fastest and the slowest placement with one buffer swapped at a time (which buffer's
           placement the time follows);
        and in --processes fresh processes each: the current method's estimate (8 consecutive sets
        in one graph) and the spread of 16 private placements (what a new process draws).
        It ends with what averaging n independent placements would leave between two runs.
    python3 scripts/study/timer_study.py strata OUT
        Part C, the address law: the counters alone moved over 16 steps of 4 KiB in each of 16
        fresh 2 MiB segments, each placement timed alone (what timing.placement_strata relies on).
    python3 scripts/study/timer_study.py methods OUT --ceilings DEVICE.json [--runs 5] [--deadline S]
        Part B, the remedy: RUNS fresh processes, one after the other, each running `sweep
        count-block` and `sweep act-grid` (the CLI's own code, in process) under every candidate
        timing method (timing settings, see METHODS); then per method and sweep the spread of every
        case across the runs and whether the stated intervals cover the reruns, and which method to
        make the default. The per-method runs land in OUT/methods/METHOD/runR/<device>/.
    python3 scripts/study/timer_study.py report OUT
        OUT/study.md again from OUT/*.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# The outlier: count-block's persistent kernel at 1024 tokens, BLOCK_SIZE 512 (capacity 16384).
CASE = {"spec": "count-block", "variant": "persistent", "tokens": 1024, "block_size": 512}
# Candidate timing methods: name -> `moebench sweep --timing` settings ("" = the spec's own).
METHODS = {
    "current": "",  # 8 consecutive placements in one graph (torch's caching allocator)
    "private-x4": "placement_memory=private,groups=4",  # 4 graphs x 8 private placements, t-interval
    # 4 graphs x 64 private placements (8 sets x 8 copies, as far as half the L2 holds them)
    "private-64-x4": "placement_memory=private,placement_copies=8,groups=4",
}
SWEEPS = ("count-block", "act-grid")
SPREAD_TARGET_PCT = 3.0
COVERAGE_TARGET = 0.90  # share of (case, pair of runs) within the combined stated interval
PER_SET_NOISE = 0.003  # each placement alone: stop at 0.3% (or 0.3 s)


# ----------------------------------------------------------------------------------- Part A


def _case():
    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.spec import load_spec

    spec = load_spec(CASE["spec"])
    case = next(c for c in expand(spec) if c.variant == CASE["variant"] and c.params["tokens"] == CASE["tokens"]
                and c.params["block_size"] == CASE["block_size"])
    dev = detect(False)
    params, _ = spec.family.resolve(case.variant, case.params, dev, {})
    return spec.family, spec.family.load(), params, dev


def _one(fn, launches=200) -> float:
    from moebench.core.stats import median, noise_below
    from moebench.core.timing import time_graph

    fns = fn if isinstance(fn, list) else [fn]
    s = time_graph(fns, launches_per_graph=launches, min_replays=10, max_seconds=0.3, stop=noise_below(PER_SET_NOISE))
    return median(s.per_launch_us)


def _units(inp) -> dict[str, list[str]]:
    """The tensor fields of an input set grouped by storage (a view and its buffer are one unit)."""
    import torch

    units: dict[int, list[str]] = {}
    for k, v in vars(inp).items():
        if isinstance(v, torch.Tensor) and v.is_cuda:
            units.setdefault(v.untyped_storage().data_ptr(), []).append(k)
    return {"+".join(ks): ks for ks in units.values()}


def _where(inp) -> dict:
    import torch

    return {k: {"ptr": v.data_ptr(), "page": v.data_ptr() >> 21} for k, v in vars(inp).items()
            if isinstance(v, torch.Tensor) and v.is_cuda}


def _private(inp):
    """A copy of an input set in a memory pool of its own: (copy, pool)."""
    import copy

    import torch

    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        return copy.deepcopy(inp), pool


def population(xs: list[float]) -> dict:
    """Spread and modes of per-placement times: the largest gap between sorted values splits them in
    two when it is wider than 3x the typical step and 1% of the mean, and each side holds at least 20%."""
    s = sorted(xs)
    m = statistics.fmean(s)
    out = {"n": len(s), "mean": m, "min": s[0], "max": s[-1], "spread_pct": 100 * (s[-1] / s[0] - 1),
           "sd_pct": 100 * statistics.stdev(s) / m if len(s) > 1 else 0.0}
    if len(s) >= 5:
        gaps = [(s[i + 1] - s[i], i) for i in range(len(s) - 1)]
        g, i = max(gaps)
        typical = statistics.median(x for x, _ in gaps) or 1e-9
        lo, hi = s[:i + 1], s[i + 1:]
        if g > max(3 * typical, 0.01 * m) and min(len(lo), len(hi)) >= 0.2 * len(s):
            out["modes"] = {"low": statistics.fmean(lo), "high": statistics.fmean(hi), "n_high": len(hi),
                            "gap_pct": 100 * (statistics.fmean(hi) / statistics.fmean(lo) - 1)}
    return out


def needed_placements(sd_pct: float, target_pct: float = SPREAD_TARGET_PCT, z: float = 3.0) -> int:
    """Independent placements a mean must average so two runs differ by less than `target_pct` at
    z standard deviations: sqrt(2) * sd / sqrt(n) * z <= target."""
    return max(1, math.ceil((z * math.sqrt(2) * sd_pct / target_pct) ** 2))


def cause(out: Path, processes: int, n_sets: int = 24) -> dict:
    import dataclasses

    import torch

    fam, impl, params, dev = _case()
    build = fam.builder(CASE["variant"])
    res: dict = {"case": {**CASE, "params": {k: params[k] for k in sorted(params)}}, "device": dev.name}

    sets = [impl.build_inputs(params, "cuda", i) for i in range(n_sets)]
    builts = [build(s, params, dev) for s in sets]
    builts[0].launch()
    torch.cuda.synchronize()
    a1 = [{"us": _one(b.launch), "where": _where(s), "output_page": b.output.data_ptr() >> 21}
          for s, b in zip(sets, builts)]
    rotated = _one([b.launch for b in builts[:8]])
    res["A1_consecutive"] = {"sets": a1, "population": population([x["us"] for x in a1]),
                             "rotated_first8_us": rotated,
                             "mean_first8_us": statistics.fmean(x["us"] for x in a1[:8])}
    pages: dict[int, list[float]] = {}
    for x in a1:
        pages.setdefault(x["output_page"], []).append(x["us"])
    means = [statistics.fmean(v) for v in pages.values()]
    within = [statistics.stdev(v) / statistics.fmean(v) * 100 for v in pages.values() if len(v) > 1]
    res["A1_consecutive"]["by_page"] = {"pages": len(pages), "sets_per_page": max(len(v) for v in pages.values()),
                                        "between_pages_sd_pct": 100 * statistics.stdev(means) / statistics.fmean(means)
                                        if len(means) > 1 else 0.0,
                                        "within_page_sd_pct": statistics.fmean(within) if within else 0.0}

    priv = [_private(sets[0]) for _ in range(n_sets)]
    pbuilt = [build(c, params, dev) for c, _ in priv]
    a2 = [{"us": _one(b.launch), "where": _where(c)} for (c, _), b in zip(priv, pbuilt)]
    res["A2_private"] = {"placements": a2, "population": population([x["us"] for x in a2])}

    res["A3_recaptured"] = population([_one(builts[0].launch) for _ in range(8)])
    drift = []
    for _ in range(10):
        drift.append(_one(builts[0].launch))
        time.sleep(0.1)
    res["A4_drift"] = population(drift)

    order = sorted(range(n_sets), key=lambda i: a2[i]["us"])
    fast, slow = priv[order[0]][0], priv[order[-1]][0]
    a5 = {"fast_us": a2[order[0]]["us"], "slow_us": a2[order[-1]]["us"], "swaps": {}}
    for name, fields in _units(fast).items():
        into_fast = dataclasses.replace(fast, **{f: getattr(slow, f) for f in fields})
        into_slow = dataclasses.replace(slow, **{f: getattr(fast, f) for f in fields})
        a5["swaps"][name] = {"fast_with_slow_us": _one(build(into_fast, params, dev).launch),
                             "slow_with_fast_us": _one(build(into_slow, params, dev).launch)}
    res["A5_which_buffer"] = a5
    del builts, pbuilt

    kids = []
    for i in range(processes):
        path = out / f"cause-child-{i}.json"
        subprocess.run([sys.executable, __file__, "cause-child", str(path)], cwd=ROOT, check=False)
        if path.exists():
            kids.append(json.loads(path.read_text()))
    res["A6_processes"] = kids
    est = [k["current_us"] for k in kids]
    if len(est) > 1:
        res["A6_processes_current"] = population(est)
    sd = res["A2_private"]["population"]["sd_pct"]
    res["needed_placements"] = {"sd_pct": sd, "for_3pct_at_3sd": needed_placements(sd),
                                "predicted_diff_sd_pct": {n: math.sqrt(2) * sd / math.sqrt(n)
                                                          for n in (8, 16, 32, 64, 128, 256)}}
    (out / "cause.json").write_text(json.dumps(res, indent=1))
    return res


def cause_child(path: Path) -> None:
    """One fresh process: the current method's estimate of the case and 16 private placements."""
    import torch

    fam, impl, params, dev = _case()
    build = fam.builder(CASE["variant"])
    sets = [impl.build_inputs(params, "cuda", i) for i in range(8)]
    builts = [build(s, params, dev) for s in sets]
    builts[0].launch()
    torch.cuda.synchronize()
    current = _one([b.launch for b in builts])
    priv = [_private(sets[0]) for _ in range(16)]
    per = [_one(build(c, params, dev).launch) for c, _ in priv]
    path.write_text(json.dumps({"current_us": current, "private": population(per),
                                "pages": sorted({b.output.data_ptr() >> 21 for b in builts})}))


def strata(out: Path, pages: int = 16, offsets: int = 16, stride: int = 4096) -> dict:
    """Part C, the address law: the case's counters (the buffer its time follows, A5) moved over
    `offsets` steps of `stride` bytes in each of `pages` fresh 2 MiB segments, everything else
    fixed; each placement timed alone. Tests the law the strata rely on: slow iff the parity of
    address bits 12 and 13 differs from the page's own bit, so every 4 consecutive 4 KiB steps
    hold 2 fast and 2 slow placements in any page."""
    import dataclasses

    import torch

    from moebench.families.count import kernels as ck

    fam, impl, params, dev = _case()
    build = fam.builder(CASE["variant"])
    base = impl.build_inputs(params, "cuda", 0)
    n = base.counts_buf.numel()
    keep, rows = [], []
    for p in range(pages):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            seg = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # <= 1 MiB: a 2 MiB segment of its own
        keep.append((pool, seg))
        at = seg.data_ptr()
        for k in range(offsets):
            off = k * stride + 0x200  # where the unpadded allocator put counts_buf (A1, A2)
            buf = seg[off:off + 4 * n].view(torch.int32)
            buf.copy_(base.counts_buf)
            inp = dataclasses.replace(base, counts_buf=buf, counts=buf[ck._GUARD:ck._GUARD + params["local_experts"]])
            b = build(inp, params, dev)
            b.launch()
            torch.cuda.synchronize()
            rows.append({"page": p, "k": k, "ptr": buf.data_ptr(), "page_offset": (at + off) & ((1 << 21) - 1),
                         "us": _one(b.launch)})
    pop = population([r["us"] for r in rows])
    cut = (pop["modes"]["low"] + pop["modes"]["high"]) / 2 if "modes" in pop else pop["mean"]
    law, quads, page_means = 0, [], []
    for p in range(pages):
        mine = [r for r in rows if r["page"] == p]
        slow = [r["us"] > cut for r in mine]
        bits = [bin((r["page_offset"] >> 12) & 3).count("1") & 1 for r in mine]
        law += all(a == b for a, b in zip(slow, bits)) or all(a != b for a, b in zip(slow, bits))
        page_means.append(statistics.fmean(r["us"] for r in mine))
        quads += [statistics.fmean(r["us"] for r in mine[i:i + 4]) for i in range(0, len(mine) - 3, 4)]
    res = {"case": CASE, "device": dev.name, "pages": pages, "offsets": offsets, "stride": stride, "rows": rows,
           "population": pop, "cut_us": cut, "pages_following_the_law": law,
           "single_offset_by_page": population([r["us"] for r in rows if r["k"] == 0]),
           "quad_means": population(quads), "page_means": population(page_means)}
    (out / "strata.json").write_text(json.dumps(res, indent=1))
    return res


# ----------------------------------------------------------------------------------- Part B


def methods(out: Path, runs: int, ceilings: Path, deadline: float | None, chosen: dict[str, str]) -> dict:
    t0 = time.time()
    (out / "methods").mkdir(parents=True, exist_ok=True)
    (out / "methods.json").write_text(json.dumps({"methods": chosen, "runs": []}))
    durations = []
    done = 0
    for r in range(1, runs + 1):
        if deadline is not None and durations and time.time() - t0 + max(durations) > deadline:
            break
        t = time.time()
        log = out / "methods" / f"run{r}.log"
        with open(log, "w") as f:
            subprocess.run([sys.executable, __file__, "methods-child", str(out), str(r), str(ceilings),
                            json.dumps(chosen)], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False)
        durations.append(time.time() - t)
        done = r
        print(f"methods run {r}: {durations[-1]:.0f} s", flush=True)
    return analyse_methods(out, chosen, done, durations)


def methods_child(out: Path, r: int, ceilings: Path, chosen: dict[str, str]) -> None:
    """One back-to-back run: every method, both sweeps, through the CLI itself, in this process (so
    the results are what `moebench sweep NAME --timing ...` writes, and the process starts once).
    The method order rotates with the run, so no method always goes first."""
    from moebench import cli
    from moebench.core.device import detect

    slug = detect(False).slug
    names = list(chosen)
    names = names[(r - 1) % len(names):] + names[:(r - 1) % len(names)]
    for name in names:
        root = out / "methods" / name / f"run{r}"
        (root / slug).mkdir(parents=True, exist_ok=True)
        if ceilings.exists():
            shutil.copy(ceilings, root / slug / "device.json")
        for sweep in SWEEPS:
            sys.argv = ["moebench", "sweep", sweep, "--out", str(root), "--format", "json"]
            sys.argv += ["--timing", chosen[name]] if chosen[name] else []
            try:
                cli.main()
            except SystemExit as e:
                print(f"{name} {sweep}: exit {e.code}", flush=True)


def analyse_methods(out: Path, chosen: dict[str, str], runs: int, durations: list[float]) -> dict:
    sys.path.insert(0, str(ROOT / "scripts"))
    from timer_report import spread_stats

    res = {"methods": chosen, "runs": runs, "run_s": durations, "results": {}}
    for name in chosen:
        for sweep in SWEEPS:
            paths = sorted((out / "methods" / name).glob(f"run*/*/{sweep}.json"))
            st = spread_stats(paths) if len(paths) >= 2 else {"cases": 0}
            if st["cases"]:  # timed cases in at least two runs
                st["paths"] = [str(p) for p in paths]
                res["results"].setdefault(name, {})[sweep] = st
    verdict = []
    for name, by_sweep in res["results"].items():
        ok = len(by_sweep) == len(SWEEPS) and all(s["max"] <= SPREAD_TARGET_PCT and s["covered"] >= COVERAGE_TARGET * s["pairs"]
                                        for s in by_sweep.values())
        wall = sum(statistics.median(w for w in s["wall_s"] if w is not None) for s in by_sweep.values())
        verdict.append((not ok, wall, name, ok))
    verdict.sort()
    res["recommended"] = next((n for _, _, n, ok in verdict if ok), None)
    (out / "methods.json").write_text(json.dumps(res, indent=1))
    return res


# ----------------------------------------------------------------------------------- report


def report(out: Path) -> str:
    lines = ["## Run-to-run: the study (scripts/study/timer_study.py)", ""]
    c = json.loads((out / "cause.json").read_text()) if (out / "cause.json").exists() else None
    if c:
        def pop(p):
            s = (f"{p['n']} timings {p['min']:.3f}–{p['max']:.3f} µs, spread {p['spread_pct']:.1f}%, "
                 f"sd {p['sd_pct']:.2f}%")
            if "modes" in p:
                m = p["modes"]
                s += (f"; two modes: {p['n'] - m['n_high']} at {m['low']:.3f} µs, {m['n_high']} at {m['high']:.3f} µs "
                      f"({m['gap_pct']:+.1f}%)")
            return s

        a1 = c["A1_consecutive"]
        pg = a1["by_page"]
        lines += [f"Case: {c['case']['variant']}, tokens {c['case']['tokens']}, BLOCK_SIZE {c['case']['block_size']}, "
                  f"capacity {c['case']['params'].get('buffer_tokens')} on {c['device']}.", "",
                  "| what varies | per-launch µs |", "|---|---|",
                  f"| A1 placement, consecutive sets (the session's way) | {pop(a1['population'])} |",
                  f"| A2 placement, each in its own memory pool | {pop(c['A2_private']['population'])} |",
                  f"| A3 nothing but a fresh graph capture | {pop(c['A3_recaptured'])} |",
                  f"| A4 nothing (one graph, 10 batches over 1 s) | {pop(c['A4_drift'])} |"]
        if c.get("A6_processes_current"):
            lines.append(f"| A6 the current method's estimate, one per fresh process | "
                         f"{pop(c['A6_processes_current'])} |")
        lines += ["",
                  f"- A1 by the 2 MiB page of the kernel's output: {pg['pages']} pages, up to {pg['sets_per_page']} sets per page; "
                  f"sd between page means {pg['between_pages_sd_pct']:.2f}%, within a page {pg['within_page_sd_pct']:.2f}%.",
                  f"- The rotation is the mean: the first 8 sets in one graph {a1['rotated_first8_us']:.3f} µs, the mean "
                  f"of their own times {a1['mean_first8_us']:.3f} µs.",
                  f"- A5, which buffer's placement the time follows (fastest {c['A5_which_buffer']['fast_us']:.3f}, "
                  f"slowest {c['A5_which_buffer']['slow_us']:.3f} µs):"]
        for name, sw in c["A5_which_buffer"]["swaps"].items():
            lines.append(f"  - {name} swapped: fast placement with the slow one's {sw['fast_with_slow_us']:.3f} µs; "
                         f"slow placement with the fast one's {sw['slow_with_fast_us']:.3f} µs")
        for i, k in enumerate(c.get("A6_processes", [])):
            lines.append(f"- A6 process {i + 1}: current method {k['current_us']:.3f} µs (outputs on "
                         f"{len(k['pages'])} pages); its 16 private placements: {pop(k['private'])}")
        n = c["needed_placements"]
        pred = ", ".join(f"{k}: {v:.2f}%" for k, v in n["predicted_diff_sd_pct"].items())
        lines += [f"- Averaging n independent placements leaves an sd of the difference of two runs of "
                  f"sqrt(2) x {n['sd_pct']:.2f}% / sqrt(n) ({pred}); within {SPREAD_TARGET_PCT:g}% at 3 sd from "
                  f"n = {n['for_3pct_at_3sd']}.", ""]
    st = json.loads((out / "strata.json").read_text()) if (out / "strata.json").exists() else None
    if st:
        def pp(p):
            s = f"{p['n']} values {p['min']:.3f}–{p['max']:.3f} µs, sd {p['sd_pct']:.2f}%"
            if "modes" in p:
                m_ = p["modes"]
                s += f"; modes {m_['low']:.3f} / {m_['high']:.3f} µs ({m_['n_high']} high)"
            return s

        lines += [f"### The address law (part C): the counters at {st['offsets']} steps of {st['stride']} B in each of "
                  f"{st['pages']} fresh 2 MiB segments", "",
                  "| what | per-launch µs |", "|---|---|",
                  f"| every placement | {pp(st['population'])} |",
                  f"| one offset, a fresh page each (what free placements draw) | {pp(st['single_offset_by_page'])} |",
                  f"| the mean of 4 consecutive 4 KiB steps (one stratum cycle) | {pp(st['quad_means'])} |",
                  f"| the mean of a page's {st['offsets']} steps | {pp(st['page_means'])} |", "",
                  f"- {st['pages_following_the_law']} of {st['pages']} pages follow the law (slow iff parity of address bits "
                  f"12 and 13, flipped by the page; cut at {st['cut_us']:.3f} µs).", ""]
    m = json.loads((out / "methods.json").read_text()) if (out / "methods.json").exists() else None
    if m and m.get("results"):
        lines += [f"### Timing methods, {m['runs']} back-to-back runs each (fresh processes)", "",
                  "| method | --timing | sweep | cases | spread median / max | cases over 3% | pairs within the "
                  "stated interval | wall s per run (median) |", "|---|---|---|---|---|---|---|---|"]
        for name, by in m["results"].items():
            for sweep, s in by.items():
                walls = [w for w in s["wall_s"] if w is not None]
                lines.append(f"| {name} | `{m['methods'][name] or '(spec)'}` | {sweep} | {s['cases']} | "
                             f"{s['median']:.2f}% / {s['max']:.2f}% | {s['over']} | {s['covered']}/{s['pairs']} "
                             f"({100 * s['covered'] / max(1, s['pairs']):.0f}%) | "
                             f"{statistics.median(walls) if walls else float('nan'):.2f} |")
        rec = m.get("recommended")
        lines += ["", (f"**Recommended default: `{rec}`** ({m['methods'][rec] or 'the spec as it is'}): the cheapest "
                       f"method with every case within {SPREAD_TARGET_PCT:g}% across the runs and at least "
                       f"{100 * COVERAGE_TARGET:.0f}% of pairs of runs within their stated interval." if rec else
                       f"**No method met both targets** (every case within {SPREAD_TARGET_PCT:g}%, "
                       f"{100 * COVERAGE_TARGET:.0f}% of pairs within the stated interval)."), ""]
    text = "\n".join(lines)
    (out / "study.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cause-child"]:
        return cause_child(Path(argv[1]))
    if argv[:1] == ["methods-child"]:
        return methods_child(Path(argv[1]), int(argv[2]), Path(argv[3]), json.loads(argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("cause", "strata", "methods", "report"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ceilings", type=Path, default=Path("/nonexistent"))
    ap.add_argument("--deadline", type=float, default=None, help="seconds: start no run that would end past it")
    ap.add_argument("--methods", default=None, help='JSON {"name": "timing settings"} instead of METHODS')
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.part == "cause":
        cause(a.out, a.processes)
    elif a.part == "strata":
        strata(a.out)
    elif a.part == "methods":
        methods(a.out, a.runs, a.ceilings, a.deadline, json.loads(a.methods) if a.methods else METHODS)
    print(report(a.out))


if __name__ == "__main__":
    main()

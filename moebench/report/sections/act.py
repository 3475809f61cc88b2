"""The act family's part of a sweep's results page (records only)."""

from moebench.analysis import TIE_NOTE, fastest
from moebench.core.text import md_table, num
from moebench.report.ties import fastest_text

# The seed's decode shape: 256 tokens x top-8 = 2048 live rows.
_DECODE_LIVE_ROWS = 2048
_SEED_CAP = 8192


def markdown_sections(records) -> str:
    """Which geometry wins at each shape, and whether the seed's claim (cap 8192 beats the legacy
    min(M, 512) grid at decode) holds on the device these records were timed on."""
    timed = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None]
    if not timed:
        return "## Which grid wins\n\nNo timings in this run (correctness only), so no verdict on the grid."
    shapes: dict[tuple, list] = {}
    for r in timed:
        shapes.setdefault((r.params["op"], r.params["rows"], r.params["live_rows"]), []).append(r)
    rows = []
    verdicts = []
    ties = False
    for (op, m, live), rs in sorted(shapes.items()):
        top = fastest(rs)
        best = top[0]
        ties |= len(top) > 1
        leg = next((r for r in rs if r.variant == "legacy"), None)
        seed = next((r for r in rs if r.variant in ("capped", "shipped") and r.launch.get("grid_cap") == _SEED_CAP),
                    None)
        won = fastest_text(top, lambda r: _name(r, ", "))
        ratio = ""
        if leg and seed:
            x = seed.timing["median_us"] / leg.timing["median_us"]
            ratio = f"{x:.2f}× ({'faster' if x < 1 else 'slower'})"
            if live == _DECODE_LIVE_ROWS:
                holds = x < 1
                verdicts.append(
                    f"- At the decode shape ({op}, M = {m}, {live} live rows) cap {_SEED_CAP} takes "
                    f"{seed.timing['median_us']:.2f} µs against {leg.timing['median_us']:.2f} µs for min(M, 512): "
                    f"the GB200 finding (cap 8192 beats 512 at decode) **{'holds' if holds else 'does not hold'}** "
                    f"on this device. " + (f"The fastest geometry there is {won} at {best.timing['median_us']:.2f} µs." if len(top)
                                               == 1 else f"The fastest geometries there are a {won} (µs)."))
        rows.append([op, m, live, won, f"{best.timing['median_us']:.2f}",
                     f"{leg.timing['median_us']:.2f}" if leg else "—",
                     f"{seed.timing['median_us']:.2f}" if seed else "—", ratio if seed else "—"])
    lines = ["## Which grid wins", "", md_table(["op", "rows M", "live rows", "best", "best µs", "legacy µs",
                                                  "cap 8192 µs", "cap 8192 vs legacy"], rows)]
    if ties:
        lines += ["", f"tie: {TIE_NOTE} best µs is the least median of them."]
    lines += [""] + (verdicts or ["- No decode-shape (2048 live rows) pair of cap 8192 and legacy in this run: "
                                  "no verdict on the seed's claim."])
    return "\n".join(lines + ["", floors_and_occupancy(timed)])


def _name(r, sep: str = " ") -> str:
    """The label, with the grid cap where the label does not say it."""
    cap = r.params.get("grid_cap")
    return r.label + (f"{sep}cap {cap}" if cap is not None and str(cap) not in r.label else "")


def floors_and_occupancy(timed) -> str:
    """Every timed row against its floors, with the launch's occupancy: the columns the seed
    argues from (bytes moved, floor, x floor, CTAs with work, % of the thread slots)."""
    out = ["## Floors and occupancy", "",
           "floor = bytes / copy ceiling (L2 when the rotation fits in L2, else DRAM); +empty = floor plus an "
           "empty launch; occupancy = CTAs x threads over SMs x max threads per SM.", ""]
    rows = []
    for r in timed:
        w = r.work
        note = " ¹" if w.get("floor_note") else ""
        rows.append([_name(r), r.params["rows"], r.params["live_rows"], f"{r.timing['median_us']:.2f}",
                     f"{w.get('bytes', 0) / 1e6:.2f}", f"{w.get('gbps', 0):,.0f}",
                     f"{num(w.get('floor_us'))} ({w.get('floor_level', '—')})", f"{num(w.get('x_floor'))}{note}",
                     num(w.get("x_floor_plus_empty")), w.get("ctas"), w.get("ctas_with_work"),
                     w.get("threads_per_cta"), w.get("occupancy_pct"), w.get("waves"), num(w.get("delta_us"), "+.2f"),
                     num(w.get("per_step_delta_us"), "+.1f")])
    out.append(md_table(["variant", "M", "live", "µs", "MB moved", "GB/s", "floor µs (level)", "× floor",
                         "× (floor+empty)", "CTAs", "with work", "threads/CTA", "occupancy %", "waves",
                         "Δ vs baseline µs", "per step µs"], rows))
    notes = sorted({r.work["floor_note"] for r in timed if r.work.get("floor_note")})
    if notes:
        out += ["", "¹ " + "; ".join(notes)]
    return "\n".join(out)

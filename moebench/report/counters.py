"""The results page's `Hardware counters` section (records with `cross.counters`, from the counters
pass): the bound verdict of every case with the numbers that decide it, the measured occupancy
curve over the spec's pivot (µs and achieved occupancy beside the arithmetic occupancy), the
columns that explain a block-size curve (active lanes, instructions, atomics), and the cases whose
L2 traffic is far from the family's work model. Reads records only; the page calls `section`."""

from __future__ import annotations

from typing import Any

from moebench.analysis import value_of as _val
from moebench.passes import counters as K
from moebench.core.cases import varying_params
from moebench.core.text import md_table, num, ordered


def _counters(r) -> dict | None:
    c = r.cross.get("counters")
    return c if isinstance(c, dict) else None


def _pct(v: Any) -> str:
    return "—" if v is None else f"{v:.0f}%"


def section(spec, records) -> str:
    """Markdown for the page, or "" when no record carries counters."""
    have = [r for r in records if r.status == "ok" and _counters(r) is not None]
    if not have:
        return ""
    measured = [r for r in have if "unavailable" not in _counters(r)]
    out = ["## Hardware counters", ""]
    if not measured:
        whys = [_counters(r)["unavailable"] for r in have]
        return "\n".join(out + [f"Unavailable: {max(set(whys), key=whys.count)}."])
    c0 = _counters(measured[0])
    out += [f"Measured by {c0.get('tool')} {c0.get('tool_version') or ''} after all timing, in a child process: each "
            "case's launch captured in a CUDA graph and replayed once (every kernel replayed per metric pass, "
            f"clocks not locked, cache control {c0.get('cache_control')}). Several kernels of one case: bytes, "
            "instructions and µs summed, throughputs and achieved occupancy weighted by kernel time, the launch "
            "geometry the longest kernel's. Bound: launch (× empty ≤ "
            f"{K.LAUNCH_X:g}), bandwidth (DRAM or L2 ≥ {K.BANDWIDTH_PCT:g}% of peak), compute (SM ≥ "
            f"{K.COMPUTE_PCT:g}%), work (≥ {K.WORK_X:g}× the instructions of the leanest launch of the same "
            f"shape), latency (no unit ≥ {K.LOW_THROUGHPUT_PCT:g}%; occupancy < {K.LOW_OCCUPANCY_PCT:g}% says too "
            "few warps), else mixed; first match wins.", ""]
    missing = sorted({m for r in measured for m in _counters(r).get("metrics_missing", [])})
    if missing:
        out += [f"Not measured on this GPU (not listed by the tool): {', '.join(missing)}.", ""]
    out += [_case_table(measured), ""]
    curve = _curve(spec, measured)
    if curve:
        out += [curve, ""]
    flagged = [r for r in measured if (r.cross.get("work_check") or {}).get("far")]
    out += ["### Work model against the measured traffic", ""]
    if flagged:
        out += [f"{len(flagged)} of {len(measured)} cases moved far from the family's `bytes` through L2 (outside "
                f"{1 / K.TRAFFIC_FAR_X:g}×–{K.TRAFFIC_FAR_X:g}×); their floors read against the model, not the "
                "traffic:", ""]
        vary = varying_params(measured)
        out += [f"- ⚑ `{r.case_id}` {r.label} {_shape_text(r, vary)}: {r.cross['work_check']['note']}"
                for r in flagged]
    else:
        checked = sum(1 for r in measured if r.cross.get("work_check"))
        out.append(f"Every case's L2 traffic is within {1 / K.TRAFFIC_FAR_X:g}×–{K.TRAFFIC_FAR_X:g}× of the "
                   f"family's model ({checked} checked).")
    unav = [r for r in have if "unavailable" in _counters(r)]
    if unav:
        out += ["", f"No counters for {len(unav)} case(s): "
                + "; ".join(f"`{r.case_id}` {r.label}: {_counters(r)['unavailable']}" for r in unav[:5])
                + (" …" if len(unav) > 5 else "")]
    return "\n".join(out)


def _shape_text(r, keys: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"{k}={_val(r, k)}" for k in keys) + ")" if keys else ""


def _case_table(recs) -> str:
    vary = varying_params(recs)
    head = (["variant", *vary, "µs", "kernel µs", "× empty", "achieved occ %", "theoretical % (limiter)",
             "arith. occ %", "waves", "DRAM %", "L2 %", "L2 hit %", "SM %", "instructions", "× leanest",
             "active lanes %", "atomics", "L2 bytes / model", "bound", "why"])
    rows = []
    for r in recs:
        c, v = _counters(r), r.cross.get("verdict") or {}
        chk = r.cross.get("work_check") or {}
        rows.append([r.label, *[str(_val(r, k)) for k in vary], num(r.timing.get("median_us")),
                     num(c.get("kernel_us")), num(r.work.get("x_empty")), num(c.get("achieved_occupancy_pct"), ".1f"),
                     f"{num(c.get('theoretical_occupancy_pct'), '.0f')} ({c.get('limiter') or '—'})",
                     num(r.work.get("occupancy_pct"), ".1f"), num(c.get("waves")), num(c.get("dram_pct"), ".1f"),
                     num(c.get("l2_pct"), ".1f"), num(c.get("l2_hit_pct"), ".0f"), num(c.get("sm_pct"), ".1f"),
                     K.scaled(c.get("instructions")), num(v.get("x_leanest_instructions")),
                     num(c.get("active_lanes_pct"), ".0f"), K.scaled(c.get("atomics")),
                     (f"{K.scaled(chk.get('l2_bytes'))} / {K.scaled(chk.get('model_bytes'))}"
                      + (" ⚑" if chk.get("far") else "")) if chk else "—",
                     f"**{v.get('bound', '—')}**", v.get("why", "")])
    return md_table(head, rows)


def _curve(spec, recs) -> str:
    """The spec's pivot (rows x cols, e.g. grid_cap x live_rows) with µs, achieved occupancy and the
    arithmetic occupancy in each cell: the occupancy curve, measured."""
    pv = getattr(spec, "pivot", None) or {}
    rows, cols = pv.get("rows"), pv.get("cols")
    if not rows or not cols or rows == "label" or cols == "label":
        return ""
    labels = ordered(r.label for r in recs)
    out = [f"### Occupancy curve: {rows} × {cols}", "",
           "Each cell: µs per launch · achieved occupancy % (measured) / arithmetic occupancy % (CTAs × threads "
           "over the GPU's thread slots) · bound.", ""]
    for lab in labels:
        mine = [r for r in recs if r.label == lab]
        xs = ordered(_val(r, rows) for r in mine)
        ys = ordered(_val(r, cols) for r in mine)
        cells: dict[tuple, list] = {}
        for r in mine:
            cells.setdefault((_val(r, rows), _val(r, cols)), []).append(r)
        if any(len(v) > 1 for v in cells.values()):  # other parameters vary too: the case table has them
            continue
        table = []
        for x in xs:
            line = [str(x)]
            for y in ys:
                r = (cells.get((x, y)) or [None])[0]
                if r is None:
                    line.append("")
                    continue
                c, v = _counters(r), r.cross.get("verdict") or {}
                line.append(f"{num(r.timing.get('median_us'))} · {_pct(c.get('achieved_occupancy_pct'))} / "
                            f"{_pct(r.work.get('occupancy_pct'))} · {v.get('bound', '—')}")
            table.append(line)
        head = [f"{rows} \\ {cols}", *map(str, ys)]
        out += ([f"{lab}:", ""] if len(labels) > 1 else []) + [md_table(head, table), ""]
    return "\n".join(out).rstrip()

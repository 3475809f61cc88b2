"""The occupancy curve, measured (`moebench plot --counters`): µs per launch against the x parameter
(act: the grid cap), one line per series value (act: live rows), and below it the achieved occupancy
Nsight Compute measured (solid) beside the arithmetic occupancy (CTAs x threads over the GPU's
thread slots; dashed, same colour). Reads the `cross.counters` of records made with `sweep
--counters`; the machinery (axes, colours, markers, presets) is moebench.analysis.plot's."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

from moebench.analysis import value_of, varying_keys
from moebench.analysis.plot import Drawn, _axes, _colours, _markers, _series_label, _yscale, preset_for
from moebench.core.records import Record
from moebench.core.store import atomic_write_bytes
from moebench.core.text import ordered
from moebench.errors import UsageError


def _achieved(r: Record) -> float | None:
    c = r.cross.get("counters")
    v = c.get("achieved_occupancy_pct") if isinstance(c, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _lines(records: list[Record], x: str, series: str, others: list[str],
           get: Callable[[Record], float | None]) -> dict[tuple, list[tuple[float, float]]]:
    out: dict[tuple, list] = {}
    for r in records:
        y = get(r) if r.status == "ok" else None
        xv = value_of(r, x)
        if y is None or not isinstance(xv, (int, float)) or isinstance(xv, bool) or xv <= 0:
            continue
        key = (value_of(r, series),) + tuple(value_of(r, k) for k in others)
        out.setdefault(key, []).append((xv, y))
    return {k: sorted(out[k]) for k in ordered(out)}


def plot_counters(records: list[Record], prov: dict, out: Path, *, x: str | None = None,
                  series: str | None = None) -> Drawn:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    p = preset_for(records, x, series)
    others = [k for k in varying_keys(records) if k not in (p.x, p.series)]
    measured = _lines(records, p.x, p.series, others, _achieved)
    if not measured:
        whys = {r.cross["counters"].get("unavailable") for r in records
                if isinstance(r.cross.get("counters"), dict) and r.cross["counters"].get("unavailable")}
        raise UsageError("--counters: no measured occupancy in these results; run `moebench sweep NAME --counters` "
                         "on a GPU with Nsight Compute" + (f" (this run: {sorted(whys)[0]})" if whys else ""))
    times = _lines(records, p.x, p.series, others, lambda r: _num(r.timing.get("median_us")))
    arith = _lines(records, p.x, p.series, others, lambda r: _num(r.work.get("occupancy_pct")))
    colours = _colours([k[0] for k in list(times) + list(measured)])
    markers = _markers([k[1:] for k in list(times) + list(measured)])
    fig = Figure(figsize=(8.6, 8.8), dpi=110)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(2, 1, squeeze=False)[:, 0]
    xs_all: set = set()
    for key, pts in times.items():
        xs, ys = zip(*pts)
        xs_all.update(xs)
        ax.plot(xs, ys, "-" + markers[key[1:]], color=colours[key[0]], lw=1.8, ms=5,
                label=_series_label(p.series, key, others))
    _axes(ax, p.x, "µs per launch (CUDA-graph replay)", xs_all)
    _yscale(ax, [y for pts in times.values() for _, y in pts])
    for key, pts in measured.items():
        xs, ys = zip(*pts)
        xs_all.update(xs)
        ax2.plot(xs, ys, "-" + markers[key[1:]], color=colours[key[0]], lw=1.8, ms=5,
                 label=_series_label(p.series, key, others) + ", achieved")
    for key, pts in arith.items():
        if key not in measured:
            continue
        xs, ys = zip(*pts)
        ax2.plot(xs, ys, "--", color=colours[key[0]], lw=1.1, label=_series_label(p.series, key, others)
                 + ", arithmetic")
    _axes(ax2, p.x, "occupancy % (solid: achieved, ncu; dashed: arithmetic)", xs_all)
    ax2.set_ylim(0, 105)
    dev = (prov.get("device") or {}).get("name") or "?"
    fam = records[0].family
    title = f"{prov.get('sweep') or fam}: {p.title}, measured occupancy on {dev}"
    fig.suptitle(title + (("\nlines also split by " + ", ".join(others)) if others else ""), fontsize=10.5)
    for a in (ax, ax2):
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    atomic_write_bytes(out, buf.getvalue())
    n = sum(len(v) for v in measured.values())
    return Drawn(out, title, ["median_us", "achieved vs arithmetic occupancy"], len(measured), n)

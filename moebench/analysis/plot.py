"""Curves from results (docs/counters.md, "The page and the plot"): a sweep's block-size or occupancy
curve, a published reference (moebench/reference) dashed beside it in the same colour, and the
measured occupancy curve (`plot --counters`). matplotlib through the Agg canvas and its object API
(no pyplot, no display), so it runs without a GPU or a screen; it returns what it drew."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from moebench.analysis import half_width, metric_of, tied_with_least, value_of, varying_keys
from moebench.analysis.pages import builtin_family
from moebench.analysis.reference import Reference
from moebench.core.family import Preset
from moebench.core.records import Record
from moebench.core.store import atomic_write_bytes
from moebench.core.text import ordered
from moebench.errors import UsageError


TIMERS = {"graph-replay": "CUDA-graph replay"}


@dataclass
class Drawn:
    path: Path
    title: str
    panels: list[str]
    series: int
    points: int
    reference_points: int = 0
    notes: list[str] = field(default_factory=list)


def preset_for(records: list[Record], x: str | None, series: str | None) -> Preset:
    """The family's plot preset (its catalogue's `plot`, else its default pivot), with --x and
    --series applied."""
    fam = records[0].family
    spec = builtin_family(fam)  # a reader never imports a plugin
    p = spec.plot if spec is not None else None
    if p is None:
        pv = getattr(spec, "default_pivot", None) or {}
        p = Preset(pv.get("rows") or "", pv.get("cols") or "", f"{fam} curve")
    p = Preset(x or p.x, series or p.series, p.title, p.floor_panel)
    names = {k for r in records for k in r.params}
    for opt, k in (("--x", p.x), ("--series", p.series)):
        if not k:
            raise UsageError(f"{opt}: family {fam!r} has no default; name a parameter ({', '.join(sorted(names))})")
        if k not in names and k != "label":
            raise UsageError(f"{opt}: no parameter {k!r} in these results; parameters: {', '.join(sorted(names))}")
    return p


def plot_results(records: list[Record], prov: dict, out: Path, *, reference: Reference | None = None,
                 x: str | None = None, series: str | None = None, metric: str = "median_us") -> Drawn:
    p = preset_for(records, x, series)
    fam = records[0].family
    if reference is not None and reference.family != fam:
        raise UsageError(f"--reference: {reference.name} is a {reference.family!r} table; these results are "
                         f"family {fam!r}")
    notes: list[str] = []
    others = [k for k in varying_keys(records) if k not in (p.x, p.series)]
    if p.series == "label":  # a parameter each variant entry fixes is already named by its label
        per_label: dict = {}
        for r in records:
            for k in others:
                per_label.setdefault((r.label, k), set()).add(repr(r.params.get(k)))
        others = [k for k in others if any(len(v) > 1 for (lab, kk), v in per_label.items() if kk == k)]
    lines = _lines(records, p, others, _metric(metric), notes)
    ref_lines = _lines(reference.records, p, [], _metric(metric)) if reference is not None else {}
    if not lines and not ref_lines:
        raise _nothing_to_plot(records, p, metric)
    if not lines:
        notes.append(f"no {metric} in the results (interpreter run?): only the reference is drawn")

    panels = [metric]
    floor_lines = {}
    if p.floor_panel:
        floor_lines = _lines(records, p, others, _metric("x_floor"))
        panels.append("x_floor")
        if lines and not floor_lines:
            notes.append("no × floor in the results (no measured ceilings, or an interpreter run): "
                         "the × floor panel shows the reference only" if reference else
                         "no × floor in the results (no measured ceilings, or an interpreter run)")

    colours = _colours([k[0] for k in lines] + [k[0] for k in ref_lines])
    markers = _markers([k[1:] for k in lines])
    fig, axes = _figure(len(panels))
    ax = axes[0]
    xs_all = _draw(ax, lines, colours, lambda key: _series_label(p.series, key, others), markers=markers)
    _ring_fastest(ax, lines, _lines(records, p, others, _half) if metric == "median_us" else {}, colours)
    floor_drawn = False
    if p.floor_panel:  # the floor each line is read against, dotted, in its colour
        for key, pts in _lines(records, p, others, _metric("floor_us")).items():
            ys = [y for _, y in pts]
            ax.axhline(sum(ys) / len(ys), color=colours.get(key[0], "0.5"), ls=":", lw=1,
                       label=None if floor_drawn else "floor (bytes / copy ceiling)")
            floor_drawn = True

    def ref_label(key) -> str:
        return f"{p.series}={key[0]}, {reference.label}"

    xs_all |= _draw(ax, ref_lines, colours, ref_label)
    _axes(ax, p.x, _ylabel(records, metric), xs_all)
    _yscale(ax, [y for pts in list(lines.values()) + list(ref_lines.values()) for _, y in pts])

    if p.floor_panel:
        ax2 = axes[1]
        ref_floor = _lines(reference.records, p, [], _metric("x_floor")) if reference else {}
        levels = _floor_levels(records, p, others)

        def floor_label(key) -> str:
            lv = "/".join(sorted(levels.get(key, ())))
            return _series_label(p.series, key, others) + (f" [{lv.upper()} floor]" if lv else "")

        _draw(ax2, floor_lines, colours, floor_label, markers=markers)
        _draw(ax2, ref_floor, colours, ref_label)
        ax2.axhline(1.0, color="0.4", lw=1, ls=":", label="1× = at the floor")
        _axes(ax2, p.x, "× floor (time / bytes-moved floor)", xs_all)
        _yscale(ax2, [y for pts in list(floor_lines.values()) + list(ref_floor.values()) for _, y in pts] + [1.0])
        if not floor_lines:
            ax2.text(0.5, 0.55, "no × floor in these results\n(no measured ceilings, or an interpreter run)",
                     transform=ax2.transAxes, ha="center", va="center", fontsize=9, color="0.35")

    dev = (prov.get("device") or {}).get("name") or "?"
    title = f"{prov.get('sweep') or fam}: {p.title} on {dev}"
    sub = []
    if others:
        sub.append("lines also split by " + ", ".join(others))
    if reference is not None:
        sub.append(f"dashed: {reference.label} ({reference.timer})")
    _save(fig, axes, title + ("\n" + "; ".join(sub) if sub else ""), out)
    return Drawn(out, title, panels, len(lines), sum(len(v) for v in lines.values()),
                 sum(len(v) for v in ref_lines.values()), notes)


def _draw(ax, lines: dict, colours: dict, label: Callable[[tuple], str], *, markers: dict | None = None,
          style: str = "--s", lw: float = 1.3) -> set:
    """Each line in its series' colour; returns the x values drawn. A measured line (`markers`): solid,
    with its marker; a reference's (or the arithmetic occupancy): `style`, its markers hollow."""
    xs_all: set = set()
    for key, pts in lines.items():
        xs, ys = zip(*pts)
        xs_all.update(xs)
        if markers is None:
            fmt, look = style, {"lw": lw, "ms": 4.5, "mfc": "none"}
        else:
            m = markers.get(key[1:], "o")
            fmt, look = "-" + m, {"lw": 1.8, "ms": 4.5 if m == "o" else 7}
        ax.plot(xs, ys, fmt, color=colours.get(key[0], "0.3"), label=label(key), **look)
    return xs_all


def _ring_fastest(ax, lines: dict, halves: dict, colours: dict) -> None:
    """On each line of 3 or more points, its least median ringed, and with it every point whose ~95%
    interval (drawn as a bar) overlaps the least one's: a tie (moebench.analysis.tied_with_least)."""
    ringed = False
    for key, pts in lines.items():
        h = dict(halves.get(key, ()))  # x -> half-width
        if h:
            xs, ys = zip(*pts)
            ax.errorbar(xs, ys, yerr=[h.get(x, 0.0) for x in xs], fmt="none", ecolor=colours[key[0]], lw=0.9,
                        capsize=2)
        if len(pts) < 3:
            continue
        tied = tied_with_least(pts, lambda xy: xy[1], lambda xy: h.get(xy[0], 0.0))
        ax.plot(*zip(*tied), "o", ms=11, mfc="none", mec=colours[key[0]], mew=1.4)
        ringed = True
    if ringed:
        ax.plot([], [], "o", ms=11, mfc="none", mec="0.3", mew=1.4,
                label="ringed: fastest" + (" and ties (bars: ~95% intervals)" if halves else ""))


def _half(r: Record) -> float | None:
    """The ~95% half-width of a record's timed median, where it states one."""
    return half_width(r) if metric_of(r) is not None and r.timing.get("rel_noise") else None


def _lines(records: list[Record], p: Preset, others: list[str], get: Callable[[Record], float | None],
           notes: list[str] | None = None) -> dict[tuple, list[tuple[float, float]]]:
    """Series key (series value, other varying values) -> [(x, y)] sorted by x, y = get(record);
    what was not drawn, and why, goes into `notes`."""
    out: dict[tuple, list] = {}
    failed = unavailable = no_x = 0
    for r in records:
        if r.status == "unavailable":  # its kernel source was not on the machine: nothing went wrong
            unavailable += 1
            continue
        if r.status != "ok":
            failed += 1
            continue
        y = get(r)
        if y is None:
            continue
        xv = value_of(r, p.x)  # falls back to the launch group: legacy's grid 512, shipped's block
        if not isinstance(xv, (int, float)) or isinstance(xv, bool) or xv <= 0:
            no_x += 1
            continue
        key = (value_of(r, p.series),) + tuple(value_of(r, k) for k in others)
        out.setdefault(key, []).append((xv, y))
    if notes is not None and failed:
        notes.append(f"{failed} failed case(s) not drawn")
    if notes is not None and unavailable:
        notes.append(f"{unavailable} unavailable case(s) (their kernel source was not there) not drawn")
    if notes is not None and no_x:
        notes.append(f"{no_x} timed case(s) without a positive {p.x} (a variant that does not read it) not drawn")
    return {k: sorted(out[k]) for k in ordered(out)}


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _nothing_to_plot(records: list[Record], p: Preset, metric: str) -> UsageError:
    """Why no point can be drawn: no timings at all, no such metric, or an x that is not a number."""
    timed = [r for r in records if r.status == "ok" and metric_of(r, metric) is not None]
    if timed:
        numeric = [k for k in varying_keys(timed) if all(_positive(value_of(r, k)) for r in timed)]
        return UsageError(f"--x: {p.x} is not a positive number in any case with a {metric}; name a parameter that "
                          f"is ({', '.join(numeric) or 'none varies'})")
    if not any(r.status == "ok" and "median_us" in r.timing for r in records):
        return UsageError(f"no {metric} to plot: these results have no timings (an interpreter run checks "
                          "correctness only); plot a GPU sweep's results, or add --reference")
    held = sorted({k for r in records if r.status == "ok" for g in (r.timing, r.work, r.cross, r.checks)
                   for k, v in g.items() if metric_of(r, k) is not None})
    return UsageError(f"--metric: no {metric} in these results; the numbers they hold: {', '.join(held)}")


def _metric(metric: str) -> Callable[[Record], float | None]:
    return lambda r: metric_of(r, metric)


def _figure(panels: int):
    """A figure of `panels` stacked panels (each keeps the full width, its legend to the right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: only when drawing
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.6, 4.4 * panels), dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(panels, 1, squeeze=False)[:, 0]


def _save(fig, axes, title: str, out: Path) -> None:
    fig.suptitle(title, fontsize=10.5)
    for a in axes:
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    atomic_write_bytes(out, buf.getvalue())


def plot_counters(records: list[Record], prov: dict, out: Path, *, x: str | None = None,
                  series: str | None = None) -> Drawn:
    """The occupancy curve, measured: µs per launch, and the achieved occupancy beside the
    arithmetic one."""
    p = preset_for(records, x, series)
    others = [k for k in varying_keys(records) if k not in (p.x, p.series)]
    measured = _lines(records, p, others, _achieved)
    if not measured:
        whys = {r.cross["counters"].get("unavailable") for r in records
                if isinstance(r.cross.get("counters"), dict) and r.cross["counters"].get("unavailable")}
        raise UsageError("--counters: no measured occupancy in these results; run `moebench sweep NAME --counters` "
                         "on a GPU with Nsight Compute" + (f" (this run: {sorted(whys)[0]})" if whys else ""))
    times = _lines(records, p, others, _metric("median_us"))
    arith = _lines(records, p, others, _metric("occupancy_pct"))
    colours = _colours([k[0] for k in list(times) + list(measured)])
    markers = _markers([k[1:] for k in list(times) + list(measured)])
    fig, (ax, ax2) = _figure(2)

    def label(key) -> str:
        return _series_label(p.series, key, others)

    xs_all = _draw(ax, times, colours, label, markers=markers)
    _axes(ax, p.x, "µs per launch (CUDA-graph replay)", xs_all)
    _yscale(ax, [y for pts in times.values() for _, y in pts])
    xs_all |= _draw(ax2, measured, colours, lambda key: label(key) + ", achieved", markers=markers)
    _draw(ax2, {k: v for k, v in arith.items() if k in measured}, colours, lambda key: label(key) + ", arithmetic",
          style="--", lw=1.1)
    _axes(ax2, p.x, "occupancy % (solid: achieved, ncu; dashed: arithmetic)", xs_all)
    ax2.set_ylim(0, 105)
    dev = (prov.get("device") or {}).get("name") or "?"
    title = f"{prov.get('sweep') or records[0].family}: {p.title}, measured occupancy on {dev}"
    _save(fig, (ax, ax2), title + (("\nlines also split by " + ", ".join(others)) if others else ""), out)
    n = sum(len(v) for v in measured.values())
    return Drawn(out, title, ["median_us", "achieved vs arithmetic occupancy"], len(measured), n)


def _achieved(r: Record) -> float | None:
    c = r.cross.get("counters")
    v = c.get("achieved_occupancy_pct") if isinstance(c, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _colours(keys: list[Any]) -> dict[Any, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {k: cmap(i % 10) for i, k in enumerate(ordered(keys))}


def _floor_levels(records: list[Record], p: Preset, others: list[str]) -> dict[tuple, set]:
    """Which ceiling each line's floor was read against (the runner's work.floor_level: an
    L2-resident working set can run below the DRAM floor, so a × floor under 1 needs this)."""
    out: dict[tuple, set] = {}
    for r in records:
        lv = r.work.get("floor_level")
        if lv:
            key = (value_of(r, p.series),) + tuple(value_of(r, k) for k in others)
            out.setdefault(key, set()).add(str(lv))
    return out


def _markers(keys: list[tuple]) -> dict[tuple, str]:
    """One marker per combination of the other varying values (e.g. per variant label)."""
    shapes = "oDs^vP"
    return {k: shapes[i % len(shapes)] for i, k in enumerate(ordered(keys))}


def _yscale(ax, ys: list[float]) -> None:
    """Linear from 0 when the values span less than 10x; log (plain tick labels) beyond, so a
    2 µs line and a 30 µs line both stay readable."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ys = [y for y in ys if y > 0]
    if ys and max(ys) / min(ys) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)


def _series_label(series: str, key: tuple, others: list[str]) -> str:
    return ", ".join([f"{series}={key[0]}"] + [f"{k}={v}" for k, v in zip(others, key[1:])])


def _axes(ax, x: str, ylabel: str, xs: set) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(xs)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{int(t)}" if float(t).is_integer() else f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(f"{x} (log2)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _ylabel(records: list[Record], metric: str) -> str:
    if metric != "median_us":
        return metric
    timers = {r.timing.get("timer") for r in records if r.timing.get("timer")}
    how = ", ".join(sorted(TIMERS.get(t, t) for t in timers)) or "median"
    return f"µs per launch ({how})"


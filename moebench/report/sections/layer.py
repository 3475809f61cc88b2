"""The layer family's parts of the pages: a sweep's step times per shape, and an `ab` run over the
scopes read as conversions (the kernel's saving alone, in one step, in many). Records only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from moebench.analysis import TIE_NOTE, fastest, half_width, params_text
from moebench.analysis.ab import Arm, ab_stats, separation_cell
from moebench.core.text import md_table, num, varying
from moebench.report.ties import full_labels

# The keys a case varies that are not the configuration under test: what tells shapes apart.
_SHAPE = ("tokens", "buffer_tokens", "local_experts", "op", "hidden", "ffn", "topk")


def markdown_sections(records) -> str:
    """A sweep's step times against its baseline, per shape, with the weight-streaming floor
    and the 48-layer projection, and the upstream arm where it ran."""
    timed = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None]
    if not timed:
        return ("## In the layer\n\nNo timings in this run (correctness only): nothing to say about what a kernel "
                "change is worth in the step.")
    keys = [k for k in varying([r.params for r in timed], list(timed[0].params))
            if k in _SHAPE + ("layers", "scope")] or ["tokens", "buffer_tokens"]
    shapes: dict[tuple, list] = {}
    for r in timed:
        shapes.setdefault(tuple(r.params.get(k) for k in keys), []).append(r)
    out = ["## In the layer", "",
           "Each row: one launch of the configuration at that shape (a layer step, `layers` steps, or a kernel "
           "alone), µs per launch. Δ is against the spec's baseline launch at the same shape; per step = Δ × "
           "moe_layers / layers per launch. Floor = the local experts' weights of every layer at the DRAM copy "
           "ceiling (they do not fit in L2).", ""]
    names = dict(zip(map(id, timed), full_labels(timed, [k for k in timed[0].params if k not in keys])))
    tie = False
    for key, rs in shapes.items():
        top = fastest(rs) if len(rs) > 1 else []
        tie |= len(top) > 1
        rows = []
        for r in rs:
            w = r.work
            mark = "" if r not in top else " **fastest**" if len(top) == 1 else " **tie**"
            rows.append([names[id(r)] + mark, f"{r.timing['median_us']:.2f}", _pm(r), num(w.get("delta_us"), "+.2f"),
                         num(w.get("per_step_delta_us"), "+.1f"), num(w.get("floor_us")), num(w.get("x_floor")),
                         _launch_text(r)])
        out += [f"### {params_text(dict(zip(keys, key)), keys) or 'all'}", "",
                md_table(["configuration", "µs", "± µs", "Δ vs baseline µs", "per step µs", "floor µs", "× floor",
                          "launch"], rows), ""]
    if tie:
        out += [f"**tie**: {TIE_NOTE} ± µs: the ~95% half-width of the median.", ""]
    return "\n".join(out)


def _pm(r) -> str:
    return f"{half_width(r):.2f}" if r.timing.get("rel_noise") is not None else "—"


def _launch_text(r) -> str:
    g = r.launch
    if r.variant != "step":
        return r.variant
    return (f"count {g.get('count_variant')} block {g.get('count_block_size')}; "
            f"act {g.get('act_variant')}, {g.get('act_num_blocks', '?')} CTAs")


@dataclass
class Conversion:
    """One shape of an `ab` over the scopes: the change's saving with the kernel alone, in one
    layer step, and in a graph of `layers` steps (each an ABStats of moebench.analysis.ab)."""

    label: str
    shape: dict
    kernel: str | None = None  # "count" | "act": the scope timed alone
    isolated: Any = None
    one: Any = None
    layers: int | None = None
    many: Any = None

    @property
    def conversion(self) -> float | None:
        """In-layer Δ / isolated Δ: 1.0 when the whole saving survives in the step."""
        return ratio(self.one.delta if self.one else None, self.isolated.delta if self.isolated else None)

    @property
    def projection(self) -> float | None:
        """The seeds' projection for the many-layer graph: layers x the isolated Δ."""
        return self.layers * self.isolated.delta if self.layers and self.isolated else None

    @property
    def many_vs_projection(self) -> float | None:
        return ratio(self.many.delta if self.many else None, self.projection)

    @property
    def many_vs_one(self) -> float | None:
        one = self.layers * self.one.delta if self.layers and self.one else None
        return ratio(self.many.delta if self.many else None, one)


def conversions(records) -> list[Conversion]:
    """The Conversions an `ab` run's records hold (records tagged with timing.ab_side and
    ab_arm), one per (label, shape), in record order."""

    arms: dict[tuple, dict] = {}
    for r in records:
        v = r.timing.get("median_us")
        if r.status != "ok" or v is None or not r.timing.get("ab_side"):
            continue
        key = (r.label, tuple(r.params.get(k) for k in _SHAPE), r.params.get("scope", "step"),
               r.params.get("layers") or 1)
        slot = arms.setdefault(key, {})
        arm = r.timing.get("ab_arm")
        if arm not in slot:
            slot[arm] = Arm(r.timing["ab_side"], [])
        slot[arm].values.append(v)
    out: dict[tuple, Conversion] = {}
    for (label, shape, scope, layers), by_arm in arms.items():
        try:
            st = ab_stats([a for _, a in sorted(by_arm.items())])
        except ValueError:  # only one side of this case completed
            continue
        c = out.setdefault((label, shape), Conversion(label, dict(zip(_SHAPE, shape))))
        if scope != "step":
            c.kernel, c.isolated = scope, st
        elif layers == 1:
            c.one = st
        elif c.layers is None or layers > c.layers:
            c.layers, c.many = layers, st
    return list(out.values())


# What the separation cells of an A/B say (moebench.analysis.ab.separation_cell), in µs per launch.
SEPARATION_LEGEND = ("Separation: \"every ON < every OFF (margin m)\": the slowest ON measurement beats the fastest OFF "
                     "one by m; \"every ON > every OFF (by m)\": the fastest OFF measurement beats the slowest ON one "
                     "by m; \"overlap (m)\": the slowest ON measurement is m slower than the fastest OFF one, so the "
                     "two sides' measurements interleave and the Δ is not separated from the noise.")


def conversion_section(records) -> str:
    """What an `ab` run over the scopes says: per shape, the kernel's isolated saving, the saving
    in a one-layer step, their ratio (the conversion), and the saving of a many-layer graph
    against that many times the isolated saving."""

    rows_in = conversions(records)
    if not rows_in:
        return ""
    keys = [k for k in _SHAPE if len({repr(c.shape.get(k)) for c in rows_in}) > 1] or ["tokens", "buffer_tokens"]
    labels = len({c.label for c in rows_in}) > 1
    rows, notes = [], []
    for c in rows_in:
        text = ", ".join(([c.label] if labels else []) + [f"{k}={c.shape.get(k)}" for k in keys]) or "all"
        st = c.isolated
        row = [text, f"{c.kernel}: {st.delta:+.3f} ({separation_cell(st)})" if st else "—"]
        row += ([f"{c.one.off_mean:.2f} → {c.one.on_mean:.2f}", f"{c.one.delta:+.3f} ({separation_cell(c.one)})"]
                if c.one else ["—", "—"])
        row.append(num(c.conversion))
        row += [num(c.projection, "+.1f"), f"{c.layers}: {c.many.delta:+.1f} ({separation_cell(c.many)})" if c.many
                else "—", num(c.many_vs_projection), num(c.many_vs_one)]
        rows.append(row)
        for what, s in (("isolated", st), ("in-layer", c.one), ("many-layer", c.many)):
            if s is not None and s.separation == "overlap":
                notes.append(f"{text}: the {what} arms overlap; a ratio with that Δ in it is not separated from "
                             "noise.")
    out = ["### What the saving is worth in the layer", "",
           "Isolated = the kernel alone on the layer's own tensors (same shapes, same data, same graph timer); "
           "in-layer = one whole layer step; conversion = in-layer Δ / isolated Δ (1.00: the whole saving "
           "survives in the step). The N-layer graph's Δ is read against N × the isolated Δ (the seeds' "
           "projection) and N × the one-layer Δ. µs per launch, mean over the A/B iterations, ON − OFF. "
           + SEPARATION_LEGEND, "",
           md_table(["case", "isolated Δ µs", "1-layer step OFF → ON µs", "in-layer Δ µs", "conversion",
                     "N × isolated Δ µs", "N-layer graph Δ µs", "vs N × isolated", "vs N × 1-layer"], rows)]
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def ratio(a: Any, b: Any) -> float | None:
    """a / b where both are numbers (not NaN) and b is not 0, else None."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and not math.isnan(a) and not math.isnan(b):
        return a / b
    return None

"""`moebench recommend`: worst-case regret of each configuration across the swept shapes, and the
robust (minimax-regret) choice; with weights, the expected regret too."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from moebench.analysis import describe, metric_of, value_of, varying_keys
from moebench.core.text import ordered
from moebench.core.records import Record
from moebench.errors import UsageError



@dataclass
class ConfigRegret:
    config: tuple  # values of the configuration keys
    times: dict[tuple, float | None]  # shape -> time (None: failed, untimed or not run)
    regrets: dict[tuple, float]  # shape -> time / best - 1 (inf where there is no time)
    worst: float
    worst_at: tuple | None
    weighted: float | None  # sum(w * regret) / sum(w) over the weighted shapes
    wins: list[tuple]  # shapes where this configuration is the best


@dataclass
class Recommendation:
    group_keys: list[str]
    group: tuple
    config_keys: list[str]
    over_keys: list[str]
    shapes: list[tuple]
    best: dict[tuple, tuple[tuple, float]]  # shape -> (config, time)
    configs: list[ConfigRegret]
    robust: ConfigRegret  # minimax regret
    weights: dict[tuple, float] | None = None
    weighted_choice: ConfigRegret | None = None
    metric: str = "median_us"

    def config_text(self, c: ConfigRegret) -> str:
        return describe(self.config_keys, c.config)

    def shape_text(self, s: tuple | None) -> str:
        return describe(self.over_keys, s) if s is not None else "—"

    def shapes_text(self, shapes: Sequence[tuple]) -> str:
        """"tokens=256, 1024" for one --over key; "a=1, b=2; a=3, b=4" for several."""
        if len(self.over_keys) == 1:
            return f"{self.over_keys[0]}=" + ", ".join(str(s[0]) for s in shapes)
        return "; ".join(self.shape_text(s) for s in shapes)


def recommend_keys(records: list[Record], family=None, over: Sequence[str] | None = None,
                   by: Sequence[str] | None = None) -> tuple[list[str], list[str], list[str]]:
    """(over, config, group) keys. `over`: the shapes to take the worst case across (default: the
    family's pivot columns). `config`: what is being chosen (default: label and the varying
    launch parameters, or every other varying key when the family is unknown). `group`: the other
    varying shape parameters; each of their combinations gets its own recommendation."""
    vary = varying_keys(records)
    launch = set(getattr(family, "launch_params", ()) or ())
    if over:
        over = list(over)
    else:
        col = (getattr(family, "default_pivot", None) or {}).get("cols")
        over = [col] if col in vary else [k for k in vary if k != "label" and k not in launch][:1]
    if not over:
        raise UsageError("--over: nothing varies across shapes in these results; name the shape parameter "
                         f"to take the worst case over (varying: {', '.join(vary) or 'none'})")
    names = {k for r in records for k in r.params} | {"label", "variant"}
    for k in list(over) + list(by or ()):
        if k not in names:
            raise UsageError(f"no parameter {k!r} in these results; parameters: {', '.join(sorted(names))}")
    if by:
        config = list(by)
    elif family is not None:
        config = [k for k in vary if k not in over and (k == "label" or k in launch)]
    else:
        config = [k for k in vary if k not in over]
    if not config:
        raise UsageError("nothing to choose between: no launch parameter or variant varies apart from "
                         f"{', '.join(over)} (varying: {', '.join(vary)}); pass --by")
    group = [k for k in vary if k not in over and k not in config]
    return over, config, group


def parse_weights(text: str | None, over: list[str], shape_values: Iterable[tuple]) -> dict[tuple, float] | None:
    """"256=0.7,16384=0.3" -> {(256,): 0.7, (16384,): 0.3}, checked against the swept values."""
    if not text:
        return None
    if len(over) != 1:
        raise UsageError(f"--weights: needs a single --over parameter, got {', '.join(over)}")
    known = {str(s[0]): s for s in shape_values}
    out: dict[tuple, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        k, sep, v = part.partition("=")
        if not sep:
            raise UsageError(f"--weights: expected VALUE=WEIGHT, got {part!r}")
        if k.strip() not in known:
            raise UsageError(f"--weights: {over[0]}={k.strip()} was not swept; swept: {', '.join(known)}")
        try:
            w = float(v)
        except ValueError:
            raise UsageError(f"--weights: weight of {k.strip()} must be a number, got {v!r}") from None
        if not math.isfinite(w) or w < 0:
            raise UsageError(f"--weights: weight of {k.strip()} must be >= 0, got {v}")
        out[known[k.strip()]] = w
    if not out or sum(out.values()) <= 0:
        raise UsageError("--weights: at least one weight must be positive")
    return out


def regret_table(records: list[Record], over: list[str], config_keys: list[str], group_keys: list[str], *,
                 metric: str = "median_us", weights_text: str | None = None) -> list[Recommendation]:
    """Regret of each configuration at each shape: time / the shape's best time - 1. The robust
    choice minimises the worst-case regret across shapes (ties: the lower weighted, then mean,
    regret); with weights, the weighted choice minimises the weighted mean regret instead. A
    configuration with no time at some shape (failed, untimed) has infinite regret there."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(tuple(value_of(r, k) for k in group_keys), []).append(r)
    out = []
    all_shapes = ordered(tuple(value_of(r, k) for k in over) for r in records)
    weights = parse_weights(weights_text, over, all_shapes)
    for gkey in ordered(groups):
        recs = groups[gkey]
        table: dict[tuple, dict[tuple, float | None]] = {}
        for r in recs:
            cfg = tuple(value_of(r, k) for k in config_keys)
            shape = tuple(value_of(r, k) for k in over)
            t = metric_of(r, metric)
            row = table.setdefault(cfg, {})
            if t is not None or shape not in row:
                row[shape] = t
        shapes = [s for s in ordered(s for row in table.values() for s in row)
                  if any(row.get(s) is not None for row in table.values())]
        if not shapes:
            continue
        best: dict[tuple, tuple[tuple, float]] = {}
        for s in shapes:
            cands = [(t, cfg) for cfg, row in table.items() if (t := row.get(s)) is not None]
            t, cfg = min(cands, key=lambda x: x[0])
            best[s] = (cfg, t)
        configs = []
        for cfg in ordered(table):
            row = table[cfg]
            times = {s: row.get(s) for s in shapes}
            regrets = {s: (t / best[s][1] - 1.0 if t is not None and best[s][1] > 0 else math.inf)
                       for s, t in times.items()}
            worst_at = max(shapes, key=lambda s: regrets[s])
            weighted = None
            if weights:
                ws = [(w, regrets[s]) for s, w in weights.items() if s in regrets and w > 0]
                tot = sum(w for w, _ in ws)
                weighted = sum(w * r for w, r in ws) / tot if tot else None
            wins = [s for s in shapes if best[s][0] == cfg]
            configs.append(ConfigRegret(cfg, times, regrets, regrets[worst_at], worst_at, weighted, wins))

        def key(c: ConfigRegret):
            mean_r = sum(c.regrets.values()) / len(c.regrets)
            return (c.worst, c.weighted if c.weighted is not None else 0.0, mean_r)

        robust = min(configs, key=key)
        wchoice = None
        if weights and any(c.weighted is not None for c in configs):
            wchoice = min((c for c in configs if c.weighted is not None), key=lambda c: (c.weighted, c.worst))
        out.append(Recommendation(group_keys, gkey, config_keys, over, shapes, best, configs, robust,
                                  weights, wchoice, metric))
    if not out:
        raise UsageError(f"no {metric} in these results: recommend needs timed results (a GPU sweep; an "
                         "interpreter run checks correctness only)")
    return out


def explain(rec: Recommendation) -> list[str]:
    """The argument in sentences, seed-000 style: the robust point, where it loses and by how
    much, and what the per-shape winners cost elsewhere."""
    r = rec.robust
    lines = []
    if not math.isfinite(r.worst):
        return [f"No configuration has a time at every shape; nothing can be recommended across "
                f"{', '.join(rec.over_keys)}."]
    at = r.worst_at
    lines.append(f"Robust choice (minimax regret): {rec.config_text(r)} — never more than "
                 f"{100 * r.worst:.1f}% off the per-shape best (worst at {rec.shape_text(at)}: "
                 f"{_t(r.times[at])} vs {_t(rec.best[at][1])} µs).")
    if not r.wins:
        lines.append("It is the fastest at no swept shape: the right point on the curve, not the minimum.")
    else:
        lines.append(f"It is also the fastest at {rec.shapes_text(r.wins)}.")
    for c in rec.configs:
        if c is r or not c.wins:
            continue
        tail = (f"but {100 * c.worst:.1f}% off the best at {rec.shape_text(c.worst_at)}"
                if math.isfinite(c.worst) else f"but has no time at {rec.shape_text(c.worst_at)}")
        lines.append(f"{rec.config_text(c)} is the fastest at {rec.shapes_text(c.wins)}, {tail}.")
    if rec.weights is not None and rec.weighted_choice is not None:
        w = ", ".join(f"{rec.shape_text(s)}: {v:g}" for s, v in rec.weights.items())
        wc = rec.weighted_choice
        lines.append(f"Weighted ({w}): {rec.config_text(wc)} has the least expected regret, "
                     f"{100 * wc.weighted:.1f}%" + (" — the same choice." if wc is r else
                                                    f"; the robust choice's is {100 * r.weighted:.1f}%."))
    return lines


def _t(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}".rstrip("0").rstrip(".") if v < 100 else f"{v:,.1f}"

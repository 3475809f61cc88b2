"""`moebench recommend`: worst-case regret of each configuration across the swept shapes, and the
robust (minimax-regret) choice; with weights, the expected regret too."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from moebench.analysis import TIE_NOTE, describe, fastest, metric_of, separated_faster, value_of, varying_keys
from moebench.analysis.comparable import file_noise
from moebench.core.cases import Case, case_id
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
    wins: list[tuple]  # shapes where this configuration is the fastest and no other's interval overlaps its
    ties: list[tuple] = field(default_factory=list)  # shapes where it is among the tied fastest (fastest's rule)


@dataclass
class Recommendation:
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
    tied: dict[tuple, list[tuple]] = field(default_factory=dict)  # shape -> the configs tied for the fastest

    def config_text(self, c: ConfigRegret) -> str:
        """The configuration's values, leaving out the parameters its variant does not take."""
        keys = [k for k, v in zip(self.config_keys, c.config) if v is not None]
        return describe(keys, [v for v in c.config if v is not None])

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
        if known[k.strip()] in out:
            raise UsageError(f"--weights: {over[0]}={k.strip()} is given twice; give each shape one weight")
        try:
            w = float(v)
        except ValueError:
            raise UsageError(f"--weights: weight of {k.strip()} must be a number, got {v!r}") from None
        if not math.isfinite(w) or w < 0:
            raise UsageError(f"--weights: weight of {k.strip()} must be a finite number >= 0, got {v}")
        out[known[k.strip()]] = w
    top = max(out.values(), default=0.0)
    if top <= 0:
        raise UsageError("--weights: at least one weight must be positive")
    return {s: w / top for s, w in out.items()}  # relative to the largest: any sum of them is finite


def regret_table(records: list[Record], over: list[str], config_keys: list[str], group_keys: list[str], *,
                 metric: str = "median_us", weights_text: str | None = None) -> list[Recommendation]:
    """Regret of each configuration at each shape: time / the shape's best time - 1. The robust
    choice minimises the worst-case regret across shapes (ties: the lower weighted, then mean,
    regret); with weights, the weighted choice minimises the weighted mean regret instead. A
    configuration with no time at some shape (failed, untimed) has infinite regret there. Where the
    fastest's ~95% interval overlaps others' (moebench.analysis.fastest, median_us only), the shape
    is a tie: none of them is its winner."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(tuple(value_of(r, k) for k in group_keys), []).append(r)
    out = []
    all_shapes = ordered(tuple(value_of(r, k) for k in over) for r in records)
    weights = parse_weights(weights_text, over, all_shapes)
    for gkey in ordered(groups):
        recs = groups[gkey]
        table: dict[tuple, dict[tuple, float | None]] = {}
        rec_at: dict[tuple, dict[tuple, Record]] = {}  # shape -> config -> the record of its time
        for r in recs:
            cfg = tuple(value_of(r, k) for k in config_keys)
            shape = tuple(value_of(r, k) for k in over)
            t = metric_of(r, metric)
            row = table.setdefault(cfg, {})
            if t is not None or shape not in row:
                row[shape] = t
                rec_at.setdefault(shape, {})[cfg] = r
        shapes = [s for s in ordered(s for row in table.values() for s in row)
                  if any(row.get(s) is not None for row in table.values())]
        if not shapes:
            continue
        best: dict[tuple, tuple[tuple, float]] = {}
        tied: dict[tuple, list[tuple]] = {}
        for s in shapes:
            cands = [(t, cfg) for cfg, row in table.items() if (t := row.get(s)) is not None]
            t, cfg = min(cands, key=lambda x: x[0])
            best[s] = (cfg, t)
            top = {id(r) for r in fastest(list(rec_at[s].values()))} if metric == "median_us" else set()
            if len(top) > 1:
                tied[s] = [c for c, r in rec_at[s].items() if id(r) in top]
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
            wins = [s for s in shapes if best[s][0] == cfg and s not in tied]
            ties = [s for s in shapes if cfg in tied.get(s, ())]
            configs.append(ConfigRegret(cfg, times, regrets, regrets[worst_at], worst_at, weighted, wins, ties))

        def key(c: ConfigRegret):
            mean_r = sum(c.regrets.values()) / len(c.regrets)
            return (c.worst, c.weighted if c.weighted is not None else 0.0, mean_r)

        robust = min(configs, key=key)
        wchoice = None
        if weights and any(c.weighted is not None for c in configs):
            wchoice = min((c for c in configs if c.weighted is not None), key=lambda c: (c.weighted, c.worst))
        out.append(Recommendation(gkey, config_keys, over, shapes, best, configs, robust,
                                  weights, wchoice, metric, tied))
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
    if r.wins or r.ties:
        lines.append("It is also " + _fastest_at(rec, r) + ".")
    else:
        lines.append("It is the fastest at no swept shape: the right point on the curve, not the minimum.")
    for c in rec.configs:
        if c is r or not (c.wins or any(rec.best[s][0] == c.config for s in c.ties)):
            continue  # named where it wins, or has the least time inside a tie
        tail = (f"but {100 * c.worst:.1f}% off the best at {rec.shape_text(c.worst_at)}"
                if math.isfinite(c.worst) else f"but has no time at {rec.shape_text(c.worst_at)}")
        lines.append(f"{rec.config_text(c)} is {_fastest_at(rec, c)}, {tail}.")
    if rec.tied:
        lines.append(f"Tie at {rec.shapes_text(list(rec.tied))}: {TIE_NOTE}")
    if rec.weights is not None and rec.weighted_choice is not None:
        total = sum(rec.weights.values())  # each weight as its share of the mix, as --emit says it
        w = ", ".join(f"{rec.shape_text(s)}: {v / total:.3g}" for s, v in rec.weights.items())
        wc = rec.weighted_choice
        lines.append(f"Weighted ({w}): {rec.config_text(wc)} has the least expected regret, "
                     f"{100 * wc.weighted:.1f}%" + (" — the same choice." if wc is r else
                                                    f"; the robust choice's is {100 * r.weighted:.1f}%."))
    return lines


def _fastest_at(rec: Recommendation, c: ConfigRegret) -> str:
    """"the fastest at tokens=256 and tied for the fastest at tokens=4096"."""
    parts = [f"the fastest at {rec.shapes_text(c.wins)}"] if c.wins else []
    if c.ties:
        parts.append(f"tied for the fastest at {rec.shapes_text(c.ties)}")
    return " and ".join(parts)


def _t(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}".rstrip("0").rstrip(".") if v < 100 else f"{v:,.1f}"


# ============================================================================ deploying the choice
# `recommend --emit env|json`: the launch values a runtime reads (Megatron's kill switches), for a
# workload mix, written only where the choice beats the shipped default with separated intervals.
# `--check` re-runs the variants that read the switch, with and without the emitted environment.


@dataclass(frozen=True)
class Switch:
    """A launch parameter a runtime reads from an environment variable, with its shipped default,
    and the family's variants that read it (from their declarations: env={param: (VAR, default)})."""

    param: str
    var: str
    default: Any
    readers: tuple[str, ...]


def switches(family) -> dict[str, Switch]:
    out: dict[str, Switch] = {}
    for v in getattr(family, "variants", {}).values():
        for param, (var, default) in v.env.items():
            have = out.get(param)
            out[param] = Switch(param, var, default, (have.readers if have else ()) + (v.name,))
    return out


@dataclass
class Arm:
    """One configuration's times over the mix: per shape (µs, rel), and the weighted mean with its
    half-width (the weighted sum of the shapes' half-widths: intervals add, a bound, not a guess)."""

    value: Any
    us: dict[tuple, float]
    rel: dict[tuple, float | None]
    case_ids: dict[tuple, str]

    def mix(self, weights: dict[tuple, float]) -> tuple[float, float]:
        tot = sum(weights.values())
        m = sum(w * self.us[s] for s, w in weights.items()) / tot
        h = sum(w * self.us[s] * (self.rel[s] or 0.0) for s, w in weights.items()) / tot
        return m, h


@dataclass
class Decision:
    switch: Switch
    variant: str  # the measured variant the evidence comes from
    over_keys: list[str]
    weights: dict[tuple, float]  # normalised
    choice: Arm | None
    default: Arm | None
    emit: bool
    reason: str

    @property
    def value(self) -> Any:
        return self.choice.value if self.emit and self.choice is not None else self.switch.default

    def mix(self) -> dict[str, Any] | None:
        if self.choice is None or self.default is None:
            return None
        (mc, hc), (md, hd) = self.choice.mix(self.weights), self.default.mix(self.weights)
        return {"choice_us": mc, "choice_interval": [mc - hc, mc + hc], "default_us": md,
                "default_interval": [md - hd, md + hd], "delta": mc / md - 1.0}

    def cases(self) -> list[dict[str, Any]]:
        rows = []
        for s, w in self.weights.items():
            row: dict[str, Any] = {"shape": dict(zip(self.over_keys, s)), "weight": w}
            for name, arm in (("choice", self.choice), ("default", self.default)):
                if arm is not None and s in arm.us:
                    u, r = arm.us[s], arm.rel[s]
                    row |= {f"{name}_case_id": arm.case_ids[s], f"{name}_us": u,
                            f"{name}_interval": [u * (1 - (r or 0)), u * (1 + (r or 0))] if r is not None else None}
            if "choice_us" in row and "default_us" in row:
                row["delta"] = row["choice_us"] / row["default_us"] - 1.0
            rows.append(row)
        return rows


def _measured_variant(records: list[Record], family, sw: Switch, variant: str | None) -> str:
    """The variant whose records stand for the switch: `variant` if given, else the only one timed
    that takes the parameter from the spec, preferring the upstream (runtime's own) kernel."""
    timed = ordered(r.variant for r in records if metric_of(r) is not None)  # a variant, not a spec entry's label
    takes = [v for v in timed if v in family.variants and sw.param in family.variants[v].params]
    if variant is not None:
        if variant not in takes:
            raise UsageError(f"--variant: {variant!r} has no timed record with {sw.param} from the spec here; "
                             f"candidates: {', '.join(takes) or 'none'}")
        return variant
    upstream = [v for v in takes if family.variants[v].source == "upstream"]
    if len(upstream) == 1:
        return upstream[0]
    if len(takes) == 1:
        return takes[0]
    raise UsageError(f"--emit: several variants take {sw.param} from the spec ({', '.join(takes) or 'none timed'}); "
                     "name the one whose times stand for the runtime's kernel with --variant")


def _checked(records: list[Record], family, sw: Switch, noise) -> dict[str, float | None]:
    """Per case id, the half-width a record's time is weighed with: the wider of its stated
    rel_noise and its judged one (`noise`: moebench.analysis.comparable.file_noise, which has
    checked every stated noise); UsageError (exit 2) for a record whose value of the switch is not
    one of the family's legal values: nothing from a results file reaches the emitted file unchecked."""
    param = family.params.get(sw.param)
    out = {}
    for r in records:
        v = value_of(r, sw.param)
        why = param.check(v) if param is not None else f"is not a parameter of family {family.name!r}"
        if why:
            raise UsageError(f"case {r.case_id} ({r.label}): {sw.param} {why}; a switch takes only the family's legal "
                             f"values ({param.allowed() if param is not None else 'none'})")
        if metric_of(r) is None:
            continue
        # the wider of the stated and the judged half-width: a narrower one would emit on a smaller gain
        judged = noise.by_case.get(r.case_id)
        rel = r.timing.get("rel_noise")
        out[r.case_id] = max(rel, judged.rel) if judged is not None and rel is not None else rel
    return out


def decide(records: list[Record], family, *, over: Sequence[str] | None = None, weights_text: str | None = None,
           variant: str | None = None, metric: str = "median_us", noise=None) -> list[Decision]:
    """For each kill switch of the family that these results sweep: the configuration with the
    least weighted mean time over the mix (default mix: every swept shape, equal weights), against
    the shipped default. Emitted only when the choice's mix interval lies wholly below the
    default's; otherwise the default, with the reason. `noise`: the file's judged half-widths
    (moebench.analysis.comparable.file_noise; default: those of `records` without a noise model);
    every value and half-width is checked (_checked)."""
    if family is None:
        raise UsageError("--emit: these results' family is not known here, so its kill switches are not either")
    noise = noise if noise is not None else file_noise({}, records, None)
    sws = [sw for sw in switches(family).values() if sw.param in varying_keys(records)]
    if not sws:
        names = ", ".join(f"{s.var} ({s.param})" for s in switches(family).values()) or "none"
        raise UsageError(f"--emit: no kill switch of family {family.name!r} is swept in these results "
                         f"(its switches: {names})")
    out = []
    for sw in sws:
        lab = _measured_variant(records, family, sw, variant)
        recs = [r for r in records if r.variant == lab]
        rels = _checked(recs, family, sw, noise)
        ov, _, group = recommend_keys(recs, family, over, [sw.param])
        # a key set with the switch (each spec entry's label, "upstream b128") is not another dimension
        group = [k for k in group if len({(value_of(r, sw.param), value_of(r, k)) for r in recs})
                 > len({value_of(r, sw.param) for r in recs})]
        if group:
            raise UsageError(f"--emit: {', '.join(group)} also vary; one environment holds one {sw.var} per device, "
                             f"so take the mix over them too: --over {','.join(ov + group)}")
        arms: dict[Any, Arm] = {}
        for r in recs:
            t = metric_of(r, metric)
            if t is None:
                continue
            a = arms.setdefault(value_of(r, sw.param), Arm(value_of(r, sw.param), {}, {}, {}))
            s = tuple(value_of(r, k) for k in ov)
            a.us[s], a.rel[s], a.case_ids[s] = t, rels.get(r.case_id), r.case_id
        shapes = ordered(s for a in arms.values() for s in a.us)
        w = parse_weights(weights_text, ov, shapes) if weights_text else {s: 1.0 for s in shapes}
        w = {s: v / math.fsum(w.values()) for s, v in w.items() if v > 0}
        default = arms.get(sw.default)
        # the fastest over the mix; where that is the default, the next best, as the evidence for keeping it
        full = sorted((a for a in arms.values() if all(s in a.us for s in w)), key=lambda a: a.mix(w)[0])
        others = [a for a in full if a.value != sw.default]
        choice = others[0] if others else (full[0] if full else None)
        out.append(_judge(sw, lab, ov, w, choice, default))
    return out


def interval_text(m: float, h: float) -> str:
    """"2.41 µs [2.39, 2.43]": a mix's mean and its interval, m ± h."""
    return f"{m:.4g} µs [{m - h:.4g}, {m + h:.4g}]"


def _judge(sw: Switch, lab: str, ov: list[str], w: dict, choice: Arm | None, default: Arm | None) -> Decision:
    d = Decision(sw, lab, ov, w, choice, default, False, "")
    if default is None or not all(s in default.us for s in w):
        d.reason = f"the shipped default {sw.param}={sw.default} has no time at every shape of the mix here"
    elif choice is None:
        d.reason = "no configuration has a time at every shape of the mix"
    elif choice.value == sw.default:
        d.reason = f"the shipped default {sw.param}={sw.default} is the only configuration timed at every shape"
    elif choice.mix(w)[0] >= default.mix(w)[0]:
        d.reason = f"the shipped default {sw.param}={sw.default} is the fastest over the mix; the next best, " \
                   f"{choice.value}, is {100 * (choice.mix(w)[0] / default.mix(w)[0] - 1):.1f}% slower"
    elif any(default.rel[s] is None or choice.rel[s] is None for s in w):
        d.reason = "a time without a stated interval (rel_noise): the gain cannot be weighed against noise"
    else:
        c, f = choice.mix(w), default.mix(w)
        iv = f"{interval_text(*c)} vs {interval_text(*f)}"
        if separated_faster(c, f):
            d.emit = True
            d.reason = f"{sw.param}={choice.value} beats the default {sw.default} over the mix by " \
                       f"{100 * (1 - c[0] / f[0]):.1f}%, intervals separated: {iv}"
        else:
            d.reason = f"{sw.param}={choice.value} is {100 * (1 - c[0] / f[0]):.1f}% faster over the mix but the " \
                       f"intervals overlap ({iv}): within noise, the default stays"
    return d


def emit_document(decisions: list[Decision], prov: dict, source: str, check: list[dict] | None = None) -> dict:
    dev = prov.get("device") or {}
    doc = {"device": dev.get("name"), "device_slug": dev.get("slug"), "driver": dev.get("driver"),
           "cuda": dev.get("cuda"), "torch": dev.get("torch"), "triton": dev.get("triton"),
           "commit": prov.get("git_commit"), "results": source, "sweep": prov.get("sweep"),
           "spec_sha256": prov.get("spec_sha256"), "timestamp": prov.get("timestamp"),
           "rule": "a value is written only where its weighted mean time over the mix, +- the weighted half-widths "
                   "(rel_noise: each median's ~95% interval), lies wholly below the shipped default's; else the "
                   "default, with the reason",
           "environment": {d.switch.var: str(d.value) for d in decisions},
           "switches": [{"variable": d.switch.var, "param": d.switch.param, "value": d.value,
                         "default": d.switch.default, "choice": d.choice.value if d.choice else None,
                         "emitted": d.emit, "reason": d.reason, "measured_variant": d.variant,
                         "read_by_variants": list(d.switch.readers),
                         "mix": {"over": d.over_keys, "weights": [[list(s), w] for s, w in d.weights.items()],
                                 **(d.mix() or {})},
                         "cases": d.cases()} for d in decisions]}
    if check is not None:
        doc["check"] = check
    return doc


# what a .env line may hold: a comment carries no control character (a newline would start a line
# the shell runs), a value only the characters of a legal launch value
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_VALUE = re.compile(r"[A-Za-z0-9_.+-]*\Z")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def env_text(doc: dict) -> str:
    """The document as a shell environment file: VAR=value lines (a value only where it is plain:
    decide() let only the family's legal values through), the rest as comments with every control
    character replaced by '?', so that sourcing the file runs nothing a results file wrote."""
    lines = [f"moebench recommend --emit env: launch values for {doc['device']} (driver {doc['driver']}, CUDA "
             f"{doc['cuda']}, torch {doc['torch']}, triton {doc['triton']})",
             f"from {doc['results']} (sweep {doc['sweep']}, commit {doc['commit']}, {doc['timestamp']}, spec "
             f"sha256 {str(doc['spec_sha256'])[:16]})", f"rule: {doc['rule']}"]
    values = []
    for s in doc["switches"]:
        m = s["mix"]
        lines += ["", f"{s['variable']} ({s['param']} of {', '.join(s['read_by_variants'])}; measured on "
                      f"{s['measured_variant']}): {'EMITTED' if s['emitted'] else 'default kept'}: {s['reason']}",
                  "mix over " + ", ".join(m["over"]) + ": "
                  + ", ".join(f"{'/'.join(map(str, k))}: {w:.3g}" for k, w in m["weights"])]
        for c in s["cases"]:
            shape = ", ".join(f"{k}={v}" for k, v in c["shape"].items())
            lines.append(f"  {shape} (w {c['weight']:.3g}): {s['choice']} {_iv(c, 'choice')} vs default "
                         f"{s['default']} {_iv(c, 'default')}" + (f", Δ {100 * c['delta']:+.2f}%" if "delta" in c else ""))
        value = str(s["value"])
        if isinstance(s["value"], bool) or not _VARIABLE.match(s["variable"]) or not _VALUE.match(value):
            raise UsageError(f"--emit env: {s['variable']!r}={value!r} is not a plain VAR=value; nothing written")
        lines.append(None)
        values.append(f"{s['variable']}={value}")
    for c in doc.get("check") or []:
        lines += ["", f"check {c['variable']}: {c['verdict']}: {c['text']}"]
    it = iter(values)
    text = [next(it) if line is None else "#" + (" " + _CONTROL.sub("?", line) if line else "") for line in lines]
    return "\n".join(text) + "\n"


def _iv(c: dict, name: str) -> str:
    u, iv = c.get(f"{name}_us"), c.get(f"{name}_interval")
    if u is None:
        return "—"
    return f"{u:.4g} µs" + (f" [{iv[0]:.4g}, {iv[1]:.4g}]" if iv else "")


# ---------------------------------------------------------------------------- --check


def check_cases(d: Decision, family, records: list[Record]) -> list:
    """The cases `--check` runs for one emitted switch: each variant that reads the switch, at each
    shape of the mix (the evidence records' other parameters), its launch value left to the switch."""
    by_id = {r.case_id: r for r in records}
    out = []
    for reader in d.switch.readers:
        v = family.variants[reader]
        for s in d.weights:
            rec = by_id[d.choice.case_ids[s]]
            missing = [p for p in family.params if p not in rec.params]
            if missing:
                raise UsageError(f"--check: record {rec.case_id} lacks parameter(s) {', '.join(missing)} of family "
                                 f"{family.name!r}: its case cannot be rebuilt")
            params = dict(rec.params)
            for p in family.launch_params:
                if p not in v.params:
                    params[p] = None
            out.append(Case(family.name, reader, reader, params, case_id(family.name, reader, params)))
    return out


def judge_check(d: Decision, cases: list, base: list[Record], emitted: list[Record]) -> list[dict]:
    """Per reading variant: the mix with and without the emitted environment, and whether the
    predicted gain held (the emitted mix interval wholly below the default's). Records not ok (an
    upstream kernel `unavailable` here, an error) or timed without an interval make the verdict
    "cannot check"."""
    out = []
    for reader in d.switch.readers:
        arms, bad, used = [], [], []  # used: the emitted arm's launch values, and where they came from
        for arm_i, recs in enumerate((base, emitted)):
            a = Arm(None, {}, {}, {})
            for c, r in zip(cases, recs):
                if c.variant != reader:
                    continue
                s = tuple(c.params.get(k) for k in d.over_keys)
                t, rel = metric_of(r), r.timing.get("rel_noise")
                if t is None or rel is None:  # as in decide: a time without an interval cannot confirm a gain
                    bad.append(f"{r.status}: {r.error or 'no time'}" if t is None else
                               f"case {r.case_id}: a time without a stated interval (rel_noise)")
                    continue
                a.us[s], a.rel[s], a.case_ids[s] = t, rel, r.case_id
                if arm_i:
                    used.append((r.launch.get(d.switch.param), r.launch_from.get(d.switch.param)))
            arms.append(a)
        row = {"variable": d.switch.var, "value": d.value, "variant": reader}
        if bad or any(s not in a.us for a in arms for s in d.weights):
            row |= {"verdict": "cannot check here", "text": f"{reader}: {bad[0] if bad else 'a shape without a time'}"}
            out.append(row)
            continue
        not_read = [f"{v} ({src})" for v, src in used if v != d.value]
        if not_read:
            row |= {"verdict": "did not hold", "text": f"{reader} ran with {d.switch.param} {not_read[0]} under "
                                                       f"{d.switch.var}={d.value}: the variable was not read"}
            out.append(row)
            continue
        (mb, hb), (me, he) = arms[0].mix(d.weights), arms[1].mix(d.weights)
        held = separated_faster((me, he), (mb, hb))
        pred = d.mix()["delta"]
        row |= {"verdict": "held" if held else "did not hold", "default_us": mb, "default_interval": [mb - hb, mb + hb],
                "emitted_us": me, "emitted_interval": [me - he, me + he], "delta": me / mb - 1.0, "predicted_delta": pred,
                "launch_values": sorted({f"{v} ({src})" for v, src in used}, key=str),
                "text": f"{reader} over the mix {interval_text(me, he)} with {d.switch.var}={d.value} "
                        f"vs {interval_text(mb, hb)} without: Δ {100 * (me / mb - 1):+.2f}% "
                        f"(predicted {100 * pred:+.2f}%), intervals {'separated' if held else 'overlap or slower'}"}
        out.append(row)
    return out

"""A/B of two configurations, as the seed PRs argue them: arms OFF/ON/OFF/ON, per-arm means, arm
separation, pooled sd, the effect in noise units and the per-step projection; the pairing of a
spec's cases into OFF/ON pairs, the arm schedule and the PR-ready markdown block.

The schedule (`run_arms`) takes the measurement as a callable (`moebench ab` hands it the
run driver of each arm), so nothing here imports a kernel or torch.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from moebench.analysis import metric_of
from moebench.core.family import REQUIRED, get_family, read_switch, switch_variables
from moebench.core.stats import mean, stdev, t975
from moebench.core.text import md_table
from moebench.errors import UsageError

OFF, ON = "OFF", "ON"


@dataclass
class Arm:
    side: str  # OFF | ON
    values: list[float]  # one per iteration, in order

    @property
    def mean(self) -> float:
        return mean(self.values)


@dataclass
class ABStats:
    """What an interleaved A/B says, in the terms the seed PRs argue with (lower is better).

    - `sd_off`, `sd_on`: the sample sd of all iterations of a side, arms pooled together, so
      arm-to-arm drift counts as noise.
    - separation: whether the worst ON iteration beats the best OFF one ("every ON iteration
      beats every OFF iteration"), the reverse, or neither; `margin` is the gap between them
      (negative when the arms overlap).
    - `effect`: |Δ of means| over the larger of the two sds, in noise units.
    """

    arms: list[Arm]
    off_mean: float
    on_mean: float
    delta: float  # on_mean - off_mean
    rel: float  # delta / off_mean
    sd_off: float
    sd_on: float
    worst_on: float  # max(ON)
    best_off: float  # min(OFF)
    separation: str  # "better" | "worse" | "overlap"
    margin: float  # >0: the gap by which the sides separate; <=0: the overlap
    effect: float  # |delta| / max(sd_off, sd_on); inf when both sides have no spread

    @property
    def noise(self) -> float:
        return max(self.sd_off, self.sd_on)

    @property
    def n_off(self) -> int:
        return sum(len(a.values) for a in self.arms if a.side == OFF)

    @property
    def n_on(self) -> int:
        return sum(len(a.values) for a in self.arms if a.side == ON)


def ab_stats(arms: Sequence[Arm]) -> ABStats:
    off = [a for a in arms if a.side == OFF]
    on = [a for a in arms if a.side == ON]
    if not off or not on or any(not a.values for a in arms):
        raise ValueError("an A/B needs at least one OFF and one ON arm, each with values")
    xo = [v for a in off for v in a.values]
    xn = [v for a in on for v in a.values]
    worst_on, best_off = max(xn), min(xo)
    if worst_on < best_off:
        separation, margin = "better", best_off - worst_on
    elif min(xn) > max(xo):
        separation, margin = "worse", min(xn) - max(xo)
    else:
        separation, margin = "overlap", best_off - worst_on
    mo, mn = mean(xo), mean(xn)
    sd_o, sd_n = stdev(xo), stdev(xn)
    noise = max(sd_o, sd_n)
    delta = mn - mo
    effect = abs(delta) / noise if noise > 0 else (math.inf if delta else 0.0)
    return ABStats(arms=list(arms), off_mean=mo, on_mean=mn, delta=delta,
                   rel=delta / mo if mo else math.nan, sd_off=sd_o, sd_on=sd_n,
                   worst_on=worst_on, best_off=best_off, separation=separation, margin=margin, effect=effect)


def min_detectable(sd_off: float, sd_on: float, n_off: int, n_on: int, power: float = 0.8) -> float:
    """The smallest difference of means a two-sided test at alpha = 0.05 finds with probability
    `power`: the formula of docs/pr.md's "Rules worth knowing", the two sides' sds pooled."""
    df = n_off + n_on - 2
    if n_off < 2 or n_on < 2:
        return math.inf
    sd = math.sqrt(((n_off - 1) * sd_off ** 2 + (n_on - 1) * sd_on ** 2) / df)
    return (t975(df) + NormalDist().inv_cdf(power)) * sd * math.sqrt(1 / n_off + 1 / n_on)


# The arm separation in the seed PRs' words, per ABStats.separation
SEPARATION = {"better": "every ON iteration beats every OFF iteration",
              "worse": "every OFF iteration beats every ON iteration", "overlap": "the arms overlap"}


def separation_text(st: ABStats) -> str:
    """One sentence in the seed PRs' words, e.g. "max(ON) = 2.113 < min(OFF) = 8.041 µs — every ON
    iteration beats every OFF iteration, with a 5.928 µs margin"."""
    w, b = us(st.worst_on), us(st.best_off)
    if st.separation == "better":
        return f"max(ON) = {w} < min(OFF) = {b} µs — {SEPARATION['better']}, with a {us(st.margin)} µs margin"
    if st.separation == "worse":
        return f"{SEPARATION['worse']} (ON is slower in all {st.n_on}), by a {us(st.margin)} µs margin"
    return f"{SEPARATION['overlap']}: max(ON) = {w} ≥ min(OFF) = {b} µs, so ON does not beat OFF in every iteration"


def times_noise(effect: float) -> str:
    """An effect in noise units, "12×" or "3.4×" (an infinite one: "inf×")."""
    return f"{effect:.{0 if effect >= 10 else 1}f}×"


def noise_text(st: ABStats) -> str:
    what = "win" if st.delta < 0 else "difference"
    if st.noise == 0:
        return "Both sides have no spread (sd 0 µs): the effect in noise units is undefined."
    return (f"Pooled sd is {us(st.sd_off)} (OFF) and {us(st.sd_on)} (ON) µs, so the {what} "
            f"is ~{times_noise(st.effect)} the run-to-run noise of this configuration.")


@dataclass
class Projection:
    layers: int
    before: float  # off per launch x launches per step
    after: float
    delta: float  # after - before
    per_launch: int = 1  # MoE layers one launch covers (a whole multi-layer step: all of them)


def per_step(off_us: float, on_us: float, layers: int | None, per_launch: int = 1) -> Projection | None:
    """Per-step cost of a launch that covers `per_launch` MoE layers (a kernel: one): µs per
    launch x layers / per_launch. None when the layer count is unknown (the spec names no model,
    or its model has no moe_layers)."""
    if not layers:
        return None
    n = layers / max(1, per_launch)
    return Projection(layers, off_us * n, on_us * n, (on_us - off_us) * n, per_launch)


def projection_text(p: Projection | None) -> str:
    if p is None:
        return "Per-step projection: none (the spec's model config gives no moe_layers)."
    if p.per_launch >= p.layers:
        return (f"Measured per step: {p.before:.1f} → {p.after:.1f} µs/step ({p.delta:+.1f} µs); one launch is "
                f"the whole {p.per_launch}-layer step, so nothing is projected.")
    each = "one launch each" if p.per_launch == 1 else f"one launch per {p.per_launch} layers"
    return (f"Projected per step: {p.before:.1f} → {p.after:.1f} µs/step ({p.delta:+.1f} µs) over "
            f"{p.layers} MoE layers, {each}.")


@dataclass(frozen=True)
class Setting:
    """One KEY=VAL of `ab --off/--on`: a spec parameter, `variant`, or an environment variable
    (env:NAME, or a kill switch the family's variants declare, given bare)."""

    key: str
    value: Any
    env: bool = False

    def text(self) -> str:
        return f"{'env:' if self.env else ''}{self.key}={self.value}"


def parse_setting(text: str, family, option: str, more: str = "") -> Setting:
    """Parse and check one KEY=VAL against the family's parameters (values as YAML scalars), its
    variants (`variant=NAME`) and its kill switches (`MCORE_COUNT_TOKENS_BLOCK=1024`). `more`:
    what else the command accepts, for the message naming an unknown key."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"{option}: expected KEY=VAL or env:NAME=VAL, got {text!r}")
    switch = {var: (family.params[p], default) for v in family.variants.values() for p, (var, default) in v.env.items()}
    switches = sorted(switch)
    if key.startswith("env:") or key in switches:
        name = key.removeprefix("env:")
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise UsageError(f"{option}: {key!r} is not an environment variable name")
        if name in switch:  # a kill switch's value is checked here, as a run would read it
            param, default = switch[name]
            try:
                read_switch(param, name, default, {name: raw})
            except UsageError as e:
                raise UsageError(f"{option}: {e}") from None
        return Setting(name, raw, env=True)
    if key == "variant":
        if raw not in family.variants:
            raise UsageError(f"{option}: variant: expected one of {', '.join(family.variants)} (family "
                             f"{family.name!r}), got {raw!r}")
        return Setting(key, raw)
    if key not in family.params:
        raise UsageError(f"{option}: unknown parameter {key!r} of family {family.name!r}; expected one of "
                         f"{', '.join(family.params)}, variant=NAME, "
                         + (f"a kill switch ({', '.join(switches)}), " if switches else "")
                         + f"{more}or env:NAME=VAL for an environment variable")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    p = family.params[key]
    if p.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    problem = p.check(value)
    if problem:
        raise UsageError(f"{option}: {key}: {problem}")
    return Setting(key, value)


def settings_text(settings: Sequence[Setting | str]) -> str:
    """One side's settings as a page says them; a results file holds them as their texts."""
    return ", ".join(s if isinstance(s, str) else s.text() for s in settings) or "the spec as written"


# ----------------------------------------------------------------------------- pairs and the schedule


@dataclass
class ABPair:
    """One case of the spec, as its OFF and its ON configuration."""

    text: str  # e.g. "tokens=256"
    off: Any  # moebench.core.cases.Case
    on: Any
    arms: list[Arm] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stats: ABStats | None = None


def ab_pairs(spec, cases: list, off: Sequence[Setting], on: Sequence[Setting]) -> tuple[list[ABPair], list[str]]:
    """Apply each side's settings to every case: `variant=NAME` replaces the case's variant (and its
    label, where that was the variant's name), keeping its launch parameters where the new variant
    takes them (the family default where the case had none); the parameters set then. Cases whose
    two sides come out the same collapse into one pair. A case that would launch alike on both sides
    is left out: one whose variant would not read a parameter a side sets, one that already has a
    side's values, one that reads no kill switch the sides set apart (an env: variable no variant
    declares may be read by anything, so it keeps its case). Returns the pairs and notes on what was
    left out."""
    from moebench.core.cases import case_id

    fam = spec.family
    keys = [s.key for s in list(off) + list(on) if not s.env and s.key != "variant"]
    has_env = any(s.env for s in list(off) + list(on))
    offenv, onenv = ({s.key: s.value for s in side if s.env} for side in (off, on))
    apart = sorted(k for k in offenv.keys() | onenv.keys() if offenv.get(k) != onenv.get(k))
    judged = switch_variables()
    notes: list[str] = []
    skipped: dict[str, list[str]] = {}

    def variant_of(case, settings) -> str:
        return next((s.value for s in settings if s.key == "variant" and not s.env), case.variant)

    def apply(case, settings):
        params, variant, label = dict(case.params), variant_of(case, settings), case.label
        used = fam.variants[variant].params
        if variant != case.variant:
            label = variant if label == case.variant else label
            for k in fam.launch_params:
                default = fam.params[k].default if fam.params[k].default is not REQUIRED else None
                params[k] = (default if params[k] is None else params[k]) if k in used else None
        for s in settings:
            if not s.env and s.key != "variant" and (fam.params[s.key].role != "launch" or s.key in used):
                params[s.key] = s.value
        return replace(case, variant=variant, label=label, params=params, id=case_id(case.family, label, params))

    def reads(case) -> set[str]:  # the kill switches its variant reads, and those of the variants it delegates to
        v = fam.variants[case.variant]
        found = _switches(v)
        for k in v.params:
            if fam.params[k].variant_of and case.params.get(k) in get_family(fam.params[k].variant_of).variants:
                found |= _switches(get_family(fam.params[k].variant_of).variants[case.params[k]])
        return found

    seen: dict[tuple, ABPair] = {}
    for c in cases:
        ignored = sorted({s.key for side in (off, on) for s in side if not s.env and s.key in keys
                          and fam.params[s.key].role == "launch"
                          and s.key not in fam.variants[variant_of(c, side)].params})
        if ignored and not has_env:  # the variant would run the same launch on both sides
            skipped.setdefault(c.label, ignored)
            continue
        p = ABPair("", apply(c, off), apply(c, on))
        seen.setdefault((p.off.id, p.on.id), p)
    for label, ignored in skipped.items():
        notes.append(f"variant {label!r} does not read {', '.join(ignored)}: its cases are left out")
    pairs = list(seen.values())
    if not pairs:
        raise UsageError(f"no case of {spec.name} reads {', '.join(keys)}; variants: "
                         + ", ".join(f"{v.name} ({', '.join(v.params) or 'none'})" for v in fam.variants.values()))
    unread = [k for k in apart if k in judged and not any(k in reads(p.off) | reads(p.on) for p in pairs)]
    if unread:  # a kill switch the sides set apart that no case reads: the page would claim what did not run
        readers = [f"variant={v.name}" for v in fam.variants.values() if _switches(v) & set(unread)]
        readers += [f"{k}={w.name}" for k, prm in fam.params.items() if prm.variant_of
                    for w in get_family(prm.variant_of).variants.values() if _switches(w) & set(unread)]
        raise UsageError(f"no case of {spec.name} reads ${', $'.join(unread)}; "
                         + (f"set a variant that does on both sides: {', '.join(readers)}" if readers else
                            f"no variant of family {fam.name!r} reads it"))
    alike: dict[str, list[ABPair]] = {}  # one launch on both sides, by label: timing it compares nothing
    for p in pairs:
        if p.off.id == p.on.id and not any(k not in judged or k in reads(p.off) for k in apart):
            alike.setdefault(p.off.label, []).append(p)
    dropped = {id(p) for ps in alike.values() for p in ps}
    pairs = [p for p in pairs if id(p) not in dropped]
    if not pairs:
        raise UsageError(f"--off and --on give the same configuration ({settings_text(off)}); nothing to compare")
    shown = list(dict.fromkeys((["variant"] if any(s.key == "variant" for s in list(off) + list(on)) else []) + keys))
    for label, ps in alike.items():
        why = (f"they do not read ${', $'.join(apart)}" if apart else ", ".join(dict.fromkeys(
            f"{k}={q.off.variant if k == 'variant' else q.off.params.get(k)}" for q in ps for k in shown)))
        notes.append(f"{len(ps)} case(s) of {label!r} launch alike on both sides ({why}): left out")
    groups = {(p.off.label, p.on.label) for p in pairs}
    for p in pairs:  # the label, and what varies among the pairs of that label; a value the sides set apart as OFF→ON
        same = [q for q in pairs if (q.off.label, q.on.label) == (p.off.label, p.on.label)]
        vary = [k for k in p.off.params
                if len({(repr(q.off.params.get(k)), repr(q.on.params.get(k))) for q in same}) > 1]
        bits = [_arrow(p.off.label, p.on.label)] if len(groups) > 1 else []
        bits += [f"{k}={_arrow(p.off.params.get(k), p.on.params.get(k))}" for k in vary]
        p.text = ", ".join(bits) or p.off.label
    unknown = [k for k in apart if k not in judged]
    if unknown and any(p.off.id == p.on.id for p in pairs):
        notes.append(f"OFF and ON differ in ${', $'.join(unknown)}, which no variant declares as a kill switch: a case "
                     "that does not read it times the same launch on both sides")
    return pairs, notes


def _switches(variant) -> set[str]:
    return {var for var, _ in variant.env.values()}


def _arrow(a, b) -> str:
    """One value, or the OFF and ON values where the sides differ ("1024→128"); None (the side's
    variant does not take the parameter) is left out."""
    return f"{b if a is None else a}" if a == b or None in (a, b) else f"{a}→{b}"


def arm_environ(settings: Sequence[Setting], base: Mapping[str, str]) -> dict[str, str]:
    """The environment one arm runs under: `base` with the arm's env:NAME=VAL settings on top. A
    new mapping, handed to that arm's run driver; `base` (os.environ) is left as it was."""
    env = dict(base)
    for s in settings:
        if s.env:
            env[s.key] = str(s.value)
    return env


def check_ab(off: Sequence[Setting], on: Sequence[Setting], *, arms: int, iters: int) -> None:
    """The A/B options, checked before anything runs (UsageError naming the option)."""
    if not off and not on:
        raise UsageError("give the two configurations: --off KEY=VAL --on KEY=VAL (or env:NAME=VAL)")
    for name, side in (("--off", off), ("--on", on)):
        ks = [("env:" if s.env else "") + s.key for s in side]
        dup = {k for k in ks if ks.count(k) > 1}
        if dup:
            raise UsageError(f"{name}: {', '.join(sorted(dup))} given more than once")
    if arms < 2 or arms % 2:
        raise UsageError(f"--arms: expected an even number >= 2 (OFF/ON pairs), got {arms}")
    if iters < 2:
        raise UsageError(f"--iters: expected >= 2 measurements per arm (an sd needs two), got {iters}")


def arm_order(arms: int) -> str:
    return "/".join(OFF if a % 2 == 0 else ON for a in range(arms))


def timer_text(family, timing: Mapping[str, Any]) -> str:
    """How each A/B measurement is taken, for the page; `timing`: the timer's settings as a results
    file's provenance holds them."""
    n, groups = timing["launches_per_graph"], timing["groups"]
    per_graph = (f"{n} launches per graph" if family.graph_launches is None else
                 f"up to {n} launches per graph, fewer where one launch is a whole layer step (each record says "
                 "how many)")
    method = "" if groups <= 1 else f"; the mean of {groups} graph medians, each graph over its own placements"
    return f"Per-launch median of CUDA-graph replay ({per_graph}, L2 {timing['l2']}{method}), one such number per " \
           "measurement."


def ab_document(off: Sequence[Setting], on: Sequence[Setting], *, arms: int, iters: int, layers: int | None,
                pairs: list[ABPair]) -> dict:
    """The `ab` block of an A/B run's provenance: the settings, the schedule, and per case its arms'
    values and statistics."""
    def case(p: ABPair) -> dict:
        st = p.stats
        return {"case": p.text, "off_case_id": p.off.id, "on_case_id": p.on.id,
                "arms": [{"side": a.side, "values": a.values} for a in p.arms], "errors": p.errors,
                **({"off_mean": st.off_mean, "on_mean": st.on_mean, "delta_us": st.delta, "sd_off": st.sd_off,
                    "sd_on": st.sd_on, "separation": st.separation, "margin_us": st.margin, "effect": st.effect}
                   if st else {})}

    return {"off": [s.text() for s in off], "on": [s.text() for s in on], "arms": arms, "iters": iters,
            "moe_layers": layers, "cases": [case(p) for p in pairs]}


def document_pairs(cases: Sequence[Mapping[str, Any]]) -> list[ABPair]:
    """ab_document's cases read back (from a results file): each pair's arms, errors and statistics,
    recomputed from the arms' values as `run_arms` computed them; the pairs' cases are not in it."""
    pairs = []
    for c in cases:
        arms = [Arm(a["side"], list(a["values"])) for a in c["arms"]]
        pairs.append(ABPair(c["case"], None, None, arms, list(c["errors"]), None if c["errors"] else ab_stats(arms)))
    return pairs


def run_arms(pairs: list[ABPair], off: Sequence[Setting], on: Sequence[Setting], *, arms: int, iters: int,
             make_runner: Callable[[Mapping[str, str]], object],
             on_step: Callable[[int, str, int, ABPair], None] | None = None,
             environ: Mapping[str, str] | None = None) -> list:
    """Arms alternate OFF/ON/OFF/ON in this process. Each arm gets a fresh runner (a run driver)
    made with that arm's environment (`environ`, default empty, plus the arm's env: settings), so
    inputs and graphs are rebuilt and the kill switches read anew; os.environ is never written.
    Each iteration of an arm is one timed measurement of every case, cases interleaved. Returns
    every record, tagged with its arm."""
    records = []
    for a in range(arms):
        side = OFF if a % 2 == 0 else ON
        settings = off if side == OFF else on
        values: dict[int, list[float]] = {id(p): [] for p in pairs}
        runner = make_runner(arm_environ(settings, environ or {}))
        for i in range(iters):
            for p in pairs:
                if on_step:
                    on_step(a, side, i, p)
                rec = runner.run_case(p.off if side == OFF else p.on)
                rec.timing.update({"ab_arm": a + 1, "ab_side": side, "ab_iter": i + 1})
                records.append(rec)
                t = metric_of(rec)
                if t is None:
                    why = rec.error.splitlines()[0] if rec.error else "no median_us"
                    p.errors.append(f"arm {a + 1} {side} iteration {i + 1}: {rec.status}: {why}")
                else:
                    values[id(p)].append(t)
        for p in pairs:
            p.arms.append(Arm(side, values[id(p)]))
    for p in pairs:
        if not p.errors:
            p.stats = ab_stats(p.arms)
    return records


# ----------------------------------------------------------------------------- the markdown block


def us(v: float) -> str:
    return f"{v:.3f}"


def effect_text(st: ABStats) -> str:
    if math.isinf(st.effect):
        return "∞ (no spread)"
    return times_noise(st.effect)


def separation_cell(st: ABStats) -> str:
    if st.separation == "better":
        return f"every ON < every OFF (margin {us(st.margin)})"
    if st.separation == "worse":
        return f"every ON > every OFF (by {us(st.margin)})"
    return f"overlap ({us(-st.margin)})"


def ab_markdown(*, spec_name: str, device: str, off: Sequence[Setting | str], on: Sequence[Setting | str], arms: int,
                iters: int, pairs: list[ABPair], layers: int | None, timer_text: str,
                per_launch: Callable[[ABPair], int] = lambda p: 1) -> str:
    """The block for a PR description: summary table, the argument per case, then each case's
    arms and iterations (folded), like the seed PRs' A/B tables. `per_launch(pair)`: the MoE
    layers one launch of the pair covers (launch_layers)."""
    rows = []
    for p in pairs:
        st = p.stats
        if st is None:
            rows.append([p.text, "✗", "✗", "", "", p.errors[0], "", "", ""])
            continue
        pr = per_step(st.off_mean, st.on_mean, layers, per_launch(p))
        rows.append([p.text, us(st.off_mean), us(st.on_mean), f"{st.delta:+.3f}", f"{100 * st.rel:+.1f}%",
                     separation_cell(st), f"{us(st.sd_off)} / {us(st.sd_on)}", effect_text(st),
                     f"{pr.delta:+.1f} µs" if pr else "none"])
    out = [f"### A/B on {device}: {settings_text(on)} (ON) against {settings_text(off)} (OFF)", "",
           f"Sweep `{spec_name}`. {timer_text} {arms} arms {arm_order(arms)} in one process, each rebuilding its "
           f"inputs and graphs; {iters} timed measurements per arm per case. Lower is better.", "",
           md_table(["case", "OFF µs", "ON µs", "Δ µs", "Δ %", "arm separation", "sd OFF / ON µs", "effect",
                     f"per step ({layers} layers)" if layers else "per step"], rows), ""]
    for p in pairs:
        if p.stats is None:
            continue
        st = p.stats
        out += [f"**{p.text}.** Arm separation: {separation_text(st)}. {noise_text(st)} "
                f"{projection_text(per_step(st.off_mean, st.on_mean, layers, per_launch(p)))}", ""]
    out += ["<details><summary>Arms and iterations (µs per launch)</summary>", ""]
    rows = [[p.text, a + 1, arm.side] + [us(v) for v in arm.values] + [""] * (iters - len(arm.values))
            + [us(arm.mean) if arm.values else "—"] for p in pairs for a, arm in enumerate(p.arms)]
    out += [md_table(["case", "arm", "config"] + [f"i{i + 1}" for i in range(iters)] + ["mean"], rows), "",
            "</details>"]
    return "\n".join(out) + "\n"

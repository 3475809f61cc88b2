"""`moebench pr`: the performance section of a kernel PR from two versions of a kernel, in one command
(docs/pr.md). A composition: every case runs through the run driver (moebench.core.driver.Driver),
each arm with its own environment and kernel source (moebench.sources.arms); moebench.report.pr
writes the page."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

import typer

from moebench.analysis import results_json_layout
from moebench.analysis.ab import OFF, ON, Setting, ab_pairs, arm_environ, arm_order, parse_setting, timer_text
from moebench.analysis.recommend import parse_weights
from moebench.cli.analysis import ARMS, ARMS_OPT, ITERS_OPT, ab_outputs, ab_setup, timed_arms
from moebench.cli.common import (DEFAULT_OUT, MEGATRON_OPT, PLUGIN_OPT, STATE, Bar, comma_list, exit_code, out,
                                 print_failures, print_markdown, select_backend, use_sources)
from moebench.cli.run import SPEC_ARG
from moebench.core import device as devices
from moebench.core.baseline import launch_layers
from moebench.core.cases import expand
from moebench.core.driver import Driver, Finished, Summary
from moebench.core.pipeline import Options
from moebench.core.provenance import provenance, variant_code
from moebench.core.spec import PACKAGE_ROOT, load_spec
from moebench.core.store import OutputLock, atomic_write_text, result_stem
from moebench.errors import Interrupted, SpecError, UsageError
from moebench.passes import counters
from moebench.report.pr import SECTIONS, TIMED, build
from moebench.sources import arms, upstream

app = typer.Typer()

LAYER_SPECS = {"count": "layer-count", "act": "layer-act"}  # the layer names a family's parameters FAMILY_PARAM
PER_ARM = ("plugin", "megatron_lm")  # an arm's own kernel source
PLACEMENT_GROUPS = 16  # the per-placement range: this many timer groups of one placement each


@app.command(short_help="The performance section of a kernel PR: two versions, every section, one page.")
def pr(
    spec: str = SPEC_ARG,
    off: Optional[list[str]] = typer.Option(None, "--off", rich_help_panel=ARMS, help="KEY=VAL of the control arm "
                                            "(repeatable): a spec parameter, variant=NAME, a kill switch (NAME=VAL, "
                                            "env:NAME=VAL), or its kernel source: plugin=FILE.py, megatron_lm=PATH."),
    on: Optional[list[str]] = typer.Option(None, "--on", rich_help_panel=ARMS, help="KEY=VAL of the candidate arm."),
    decision: Optional[list[str]] = typer.Option(None, "--decision", rich_help_panel=ARMS, help="K=V[,K=V]: a "
                                                 "shape for the arm separation, counters and placement range "
                                                 "(repeatable; default: the largest --weights weight, else the "
                                                 "spec's first)."),
    weights: Optional[str] = typer.Option(None, "--weights", rich_help_panel=ARMS, help="The workload mix the kill "
                                          "switch is judged over, e.g. 256=0.7,16384=0.3."),
    n_arms: int = ARMS_OPT,
    iters: int = ITERS_OPT,
    quick: bool = typer.Option(False, "--quick", help="Use the spec's quick shapes (and the layer's)."),
    sections: Optional[str] = typer.Option(None, "--sections", help="Comma list of the sections to measure and "
                                           "write: " + ", ".join(SECTIONS) + " (default: all)."),
    out_dir: Path = typer.Option(DEFAULT_OUT, "--out", help="Results root; writes OUT/<device>/NAME-pr.md, .json."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the page (GitHub markdown, pasted as is)."),
    force: bool = typer.Option(False, "--force", help="Replace NAME-pr.md and .json if they exist."),
    plugin: Optional[list[Path]] = PLUGIN_OPT,
    megatron_lm: Optional[Path] = MEGATRON_OPT,
):
    """The performance section of a kernel PR: summary, what changed (and which code ran in each arm),
    the gain per shape, arm separation and power, counters, the layer step, the bit-exact verdict, the
    kill switch, scope and risks, protocol. On a CPU (the Triton interpreter) it writes the sections
    that need no timings. Exit 1 when a case failed."""
    use_sources(plugin, megatron_lm, interpret=False)
    want = parse_sections(sections)
    sp, offs, ons, pairs = ab_setup(spec, off, on, arms=n_arms, iters=iters, quick=quick, settings=arm_settings)
    focus = decision_pairs(sp, pairs, decision, weights)
    timed, device = not devices.want_interpreter(False), select_backend(False)
    run = Run(sp, device, offs, ons, timed=timed, quick=quick, n_arms=n_arms, iters=iters,
              sources=source_options(plugin, megatron_lm))
    dest, stem = ab_outputs(sp, pairs, offs, ons, device, out_dir=out_dir, kind="pr", quick=quick, force=force)
    with OutputLock(dest, stem):
        doc = run.document(spec, pairs, focus, want, weights, off or [], on or [])
        nums, md = build(doc, run.records, want)
        prov = {**doc["provenance"], "pr": {k: v for k, v in doc.items() if k != "provenance"}}
        atomic_write_text(dest / f"{stem}.json", results_json_layout(prov, run.records, numbers=nums))
        atomic_write_text(dest / f"{stem}.md", md)
    if markdown or "summary" in want:
        print_markdown(md if markdown else md.split("### Summary\n\n", 1)[1].split("\n", 1)[0])
    out.print(f"Wrote {dest / stem}.md, {dest / stem}.json", highlight=False)
    print_failures(run.records)
    raise typer.Exit(exit_code(run.records))


def incomplete(where: str) -> str:
    return f"INCOMPLETE: interrupted in {where}; no page written (a pr page is written only whole): rerun the command"


def source_options(plugin, megatron_lm) -> str:
    """--plugin and --megatron-lm as this run was given them, for the standalone commands: without
    them a plugin's variant is unknown there."""
    opts = [("--plugin", p) for p in plugin or ()] + ([("--megatron-lm", megatron_lm)] if megatron_lm else [])
    return "".join(f" {o} {shlex.quote(str(v))}" for o, v in opts)


def parse_sections(text: str | None) -> list[str]:
    want = comma_list(text) if text else list(SECTIONS)
    bad = [s for s in want if s not in SECTIONS]
    if bad or not want:
        raise UsageError(f"--sections: unknown {', '.join(map(repr, bad)) or 'empty list'}; expected a comma list "
                         f"of {', '.join(SECTIONS)}")
    return want


def arm_settings(sp, texts, side: str) -> list[Setting]:
    """One arm's KEY=VALs. plugin=FILE.py and megatron_lm=PATH load the arm's kernel source first
    (its variants named NAME@side); variant=NAME then means the arm's own NAME@side where its
    source has one, and without variant= the arm runs the one variant its source registered."""
    opt, fam, sfx = f"--{side.lower()}", sp.family, arms.suffix(side)
    rest, made = [], []
    for t in texts or ():
        key, _, val = (x.strip() for x in t.partition("="))
        if key == "plugin":
            before = set(fam.variants)
            arms.load_plugin(Path(val).expanduser(), side)
            made += [v for v in fam.variants if v not in before]
            if not made:
                raise UsageError(f"{opt} plugin={val}: the file registers no variant of family {fam.name!r}")
        elif key == "megatron_lm":
            if not Path(val).expanduser().is_dir():
                raise UsageError(f"{opt} megatron_lm={val}: not a directory; give a Megatron-LM checkout (the folder "
                                 "that holds megatron/core)")
            made += arms.clone_upstream(fam, Path(val).expanduser().resolve(), side)
        else:
            rest.append(f"variant={val}{sfx}" if key == "variant" and f"{val}{sfx}" in made else t)
    settings = [parse_setting(t, fam, opt, "plugin=FILE.py, megatron_lm=PATH, ") for t in rest]
    if made and not any(s.key == "variant" for s in settings):
        if len(made) > 1:
            raise UsageError(f"{opt}: its kernel source registers {', '.join(made)}: name one with variant=NAME")
        settings.append(Setting("variant", made[0]))
    return settings


def decision_pairs(sp, pairs: list, decision, weights: str | None) -> list:
    """The pairs at the decision shapes: each --decision K=V[,K=V] (which must match a case), else
    the shape of the largest --weights weight (the axis `recommend` takes the mix over), else the
    first pair."""
    fam = sp.family
    vary = [k for k in fam.shape_params if len({repr(p.off.params.get(k)) for p in pairs}) > 1]
    over = fam.default_pivot.get("cols") if fam.default_pivot.get("cols") in vary else next(iter(vary), None)
    picked = []
    for text in decision or ():
        kv = [part.partition("=") for part in text.split(",")]
        if any(not sep or k.strip() not in fam.params for k, sep, _ in kv):
            raise UsageError(f"--decision: expected K=V[,K=V] with K a parameter of family {fam.name!r}, got {text!r}")
        hits = [p for p in pairs if all(str(p.off.params.get(k.strip())) == v.strip() for k, _, v in kv)]
        if not hits:
            raise UsageError(f"--decision {text}: no case of {sp.name} has it; its cases: "
                             + "; ".join(p.text for p in pairs))
        picked += [p for p in hits if p not in picked]
    if picked or not (weights and over):
        return picked or pairs[:1]
    w = parse_weights(weights, [over], [(p.off.params.get(over),) for p in pairs])
    return [p for p in pairs if (p.off.params.get(over),) == max(w, key=w.get)]


class Run:
    """The runs of one `pr` and the document they make; every record lands in `records`, tagged
    timing.pr_run (which run) and timing.pr_side (OFF or ON)."""

    def __init__(self, spec, device, offs, ons, *, timed: bool, quick: bool, n_arms: int, iters: int,
                 sources: str = ""):
        self.spec, self.device, self.offs, self.ons, self.sources = spec, device, offs, ons, sources
        self.timed, self.quick, self.n_arms, self.iters = timed, quick, n_arms, iters
        self.records: list = []
        self.compiled: dict = {OFF: {}, ON: {}}  # per arm, the kernels first compiled in its runs

    def options(self, timing=None, *, time_it: bool = True, cross=()) -> Options:
        return Options(timing=timing or self.spec.timing, time_it=time_it and self.timed, cross=tuple(cross),
                       traceback=STATE["verbose"])

    def tag(self, records: list, run: str, side: str | None = None) -> None:
        for r in records:
            r.timing.update({"pr_run": run, "pr_side": side or r.timing["ab_side"]})
        self.records += records

    def drive(self, side: str, pairs: list, run: str, *, spec=None, options=None) -> None:
        """One arm's cases of `pairs` through a run driver with the arm's environment."""
        spec, cases = spec or self.spec, [p.off if side == OFF else p.on for p in pairs]
        variants = list(dict.fromkeys(c.variant for c in cases))

        def mods():  # those of the arm's variants whose kernels have loaded so far
            return [m for v in variants for m in arms.modules(spec.family, v)]

        before, summary = arms.compiled(mods()), None
        env = arm_environ(self.offs if side == OFF else self.ons, os.environ)
        with Bar(f"{self.spec.name} pr: {run} {side}", len(cases)) as bar:
            for ev in Driver(spec, self.device, options or self.options(), environ=env).run(cases):
                if isinstance(ev, Finished):
                    bar.advance()
                elif isinstance(ev, Summary):
                    summary = ev
        if not summary.complete:  # the driver kept what finished; a page from part of the runs would read as whole
            raise Interrupted(summary.interrupted, incomplete(f"the {run} run ({side})"))
        for k, hashes in arms.compiled(mods()).items():
            mine = self.compiled[side].setdefault(k, [])
            mine += [h for h in hashes if h not in before.get(k, ()) and h not in mine]
        self.tag(summary.records, run, side)

    def ab(self, spec, pairs: list, offs, ons, run: str) -> dict:
        """`ab`'s interleaved arms over `pairs` (timed_arms)."""
        try:
            records, doc = timed_arms(spec, self.device, pairs, offs, ons, arms=self.n_arms, iters=self.iters,
                                      title=f"{self.spec.name} pr: {run} arms")
        except KeyboardInterrupt as e:  # (SIGTERM's carries its number)
            raise Interrupted(getattr(e, "signum", signal.SIGINT), incomplete(f"the {run} arms")) from None
        self.tag(records, run)
        return {"spec": spec.name, **doc}

    def correctness(self) -> dict:
        """The verify matrix (or, without one, the spec's cases), both arms, untimed. The OFF launch
        is the baseline (of a copy of the spec), so each ON record's baseline_equal is torch.equal(ON,
        OFF); where the arms' environments differ, the spec's own baseline stays."""
        sp, fam = self.spec, self.spec.family
        try:
            cases, matrix = expand(sp, quick=self.quick, verify=True), "verify"
        except SpecError:
            cases, matrix = expand(sp, quick=self.quick), "sweep"
        try:
            vpairs, _ = ab_pairs(sp, cases, self.offs, self.ons)
        except UsageError as e:
            return {"skipped": str(e)}
        env_differs = {s.text() for s in self.offs if s.env} != {s.text() for s in self.ons if s.env}
        groups: dict[str, tuple] = {}
        for p in vpairs:
            base = {"variant": p.off.variant, **{k: p.off.params[k] for k in fam.variants[p.off.variant].params}}
            groups.setdefault(repr(sorted(base.items())), (base, []))[1].append(p)
        for base, ps in groups.values():
            for side in (OFF, ON):
                self.drive(side, ps, "correctness", spec=sp if env_differs else replace(sp, baseline=base),
                           options=self.options(time_it=False))
        return {"pairs": len(vpairs), "against": "spec" if env_differs else "off", "matrix": matrix}

    def layer(self) -> dict:
        """`ab` on the family's layer spec, the settings mapped to the layer's parameters (count's
        block_size -> count_block_size, variant -> count_variant)."""
        fam = self.spec.family.name
        if fam not in LAYER_SPECS:
            return {"skipped": f"family {fam!r} has no layer spec (only {', '.join(LAYER_SPECS)} have one)"}
        lspec = load_spec(str(PACKAGE_ROOT / "sweeps" / f"{LAYER_SPECS[fam]}.yaml"))
        try:
            loff, lon = ([x if x.env else parse_setting(f"{fam}_{x.key}={x.value}", lspec.family, "layer")
                          for x in side] for side in (self.offs, self.ons))
            lpairs, _ = ab_pairs(lspec, expand(lspec, quick=self.quick), loff, lon)
        except UsageError as e:
            return {"skipped": f"the arms do not map into {lspec.name}: {e}"}
        return self.ab(lspec, lpairs, loff, lon, "layer")

    def document(self, spec_arg: str, pairs: list, focus: list, want, weights, off_raw, on_raw) -> dict:
        """Run what the `want` sections need, then the page's document."""
        need, parts, t = set(want), {}, self.spec.timing
        if need & {"summary", "changed", "correctness"}:
            parts["correctness"] = self.correctness()
        if self.timed and need & {"gain", "killswitch", "scope", "summary"}:
            for side in (OFF, ON):
                self.drive(side, pairs, "gain")
        if self.timed and need & {"separation", "summary"}:
            parts["separation"] = self.ab(self.spec, focus, self.offs, self.ons, "separation")
        if self.timed and need & {"scope", "counters", "changed"}:  # the spec's own timer where it has no groups
            timing = t if t.groups <= 1 else replace(t, placements=1, placement_copies=1, groups=PLACEMENT_GROUPS,
                                                     max_groups=PLACEMENT_GROUPS)
            for side in (OFF, ON):
                self.drive(side, focus, "scope", options=self.options(timing, cross=("counters",) if "counters" in need
                                                                       else ()))
        if self.timed and "layer" in need:
            parts["layer"] = self.layer()
        skipped = {s: "needs a GPU's timings; this run used the Triton interpreter on the CPU" for s in TIMED & need
                   if not self.timed}
        if not self.timed:
            skipped["counters"] = counters.why_unavailable(self.device, counters.Ncu())
        skipped |= {s: parts[s]["skipped"] for s in ("correctness", "layer") if "skipped" in parts.get(s, {})}
        sp, fam = self.spec, self.spec.family
        variants = {s: list(dict.fromkeys((p.off if s == OFF else p.on).variant for p in pairs)) for s in (OFF, ON)}
        used = any(fam.variants[v].source == "upstream" for vs in variants.values() for v in vs)
        return {
            "spec": sp.name, "family": fam.name, "device": self.device.name, "weights": weights,
            "off": [s.text() for s in self.offs] + [t for t in off_raw if t.split("=")[0].strip() in PER_ARM],
            "on": [s.text() for s in self.ons] + [t for t in on_raw if t.split("=")[0].strip() in PER_ARM],
            "order": arm_order(self.n_arms), "timer": timer_text(sp.family, asdict(sp.timing)), "moe_layers": sp.model.get("moe_layers"),
            "pairs": [[p.text, p.off.id, p.on.id] for p in pairs],
            "decision": [[p.text, p.off.id, p.on.id] for p in focus],
            "per_launch": {p.off.id: launch_layers(fam, p.off.params) for p in pairs},
            "code": {s: {v: variant_code(fam, v) for v in variants[s]} for s in (OFF, ON)},
            "compiled": {s: self.compiled[s] if self.device.backend == "cuda" else "interpreter: nothing compiled"
                         for s in (OFF, ON)},
            "sections": parts, "skipped": skipped, "commands": commands(spec_arg, self, want, off_raw, on_raw, parts),
            "provenance": provenance(sp, self.device, quick=self.quick, verify=False, ceilings={},
                                     extra={"timed": self.timed, "upstream": upstream.provenance() if used else None}),
        }


def commands(spec_arg: str, run: Run, want, off_raw, on_raw, parts) -> dict[str, str]:
    """The standalone commands that reproduce each section, with the run's --plugin and
    --megatron-lm; a per-arm kernel source exists in `pr` only. The kill switch reads the file the
    gain command writes."""
    q, reps, src = " --quick" if run.quick else "", f" --arms {run.n_arms} --iters {run.iters}", run.sources
    arms_opt = " ".join([f"--off {t}" for t in off_raw] + [f"--on {t}" for t in on_raw])
    lay, per_arm = parts.get("layer") or {}, any(t.split("=")[0].strip() in PER_ARM for t in off_raw + on_raw)
    gain = result_stem(run.spec.name, quick=run.quick, verify=False)
    cmd = {"gain": f"moebench sweep {spec_arg}{q}{src}", "correctness": f"moebench verify {spec_arg}{q}{src}",
           "separation": "moebench pr only (the arms load their own kernel sources)" if per_arm else
           f"moebench ab {spec_arg}{q} {arms_opt}{reps}{src}",
           "counters": f"moebench sweep {spec_arg}{q} --counters{src}",
           "killswitch": f"moebench recommend OUT/{run.device.slug}/{gain}.json --emit env",
           "layer": f"moebench ab {lay.get('spec')}{q} " + " ".join(
               [f"--off {t}" for t in lay.get("off", [])] + [f"--on {t}" for t in lay.get("on", [])]) + reps + src,
           "protocol": " ".join(["moebench"] + sys.argv[1:])}
    return {k: v for k, v in cmd.items() if k in want and (k != "layer" or "spec" in lay)}

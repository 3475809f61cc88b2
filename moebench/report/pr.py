"""`moebench pr`'s page: the performance section of a kernel PR, from the document and the records
the command wrote (NAME-pr.json). Data only: `build` computes each section's figures from the records
with moebench's own rules (compare's classify, ab's statistics and power, recommend's decide, the
layer's conversion table) and renders them. Records carry timing.pr_run (the run that made them)
and timing.pr_side (OFF or ON). Also `ab_page`, the page of an `ab` run."""

from __future__ import annotations

from moebench.analysis import value_of
from moebench.analysis.ab import (OFF, ON, SEPARATION, ab_markdown, document_pairs, min_detectable, per_step,
                                  times_noise, timer_text)
from moebench.analysis.compare import classify
from moebench.analysis.pages import page_spec
from moebench.analysis.recommend import decide, switches
from moebench.core.baseline import launch_layers
from moebench.core.family import get_family
from moebench.core.text import md_table, num
from moebench.errors import UsageError
from moebench.report.sections import ab_section

SECTIONS = ("summary", "changed", "gain", "separation", "counters", "layer", "correctness", "killswitch", "scope",
            "protocol")
TITLES = {"summary": "Summary", "changed": "What changed", "gain": "Measured gain", "separation": "Arm separation",
          "counters": "Where the time went", "layer": "In a layer step", "correctness": "Correctness",
          "killswitch": "Kill switch", "scope": "Scope and risks", "protocol": "Protocol"}
TIMED = frozenset({"gain", "separation", "counters", "layer", "killswitch", "scope"})  # need a GPU's timings
FOLD = 12  # a table longer than this goes inside <details>
NEEDS = {"summary": ("separation", "correctness"), "scope": ("gain",)}  # the figures a section reads
COUNTERS = {"achieved occupancy %": "achieved_occupancy_pct", "theoretical occupancy %": "theoretical_occupancy_pct",
            "limiter": "limiter", "waves": "waves", "instructions": "instructions",
            "registers / thread": "registers_per_thread", "DRAM % of peak": "dram_pct", "L2 % of peak": "l2_pct"}


def _runs(records, run: str, side: str | None = None) -> list:
    return [r for r in records if r.timing.get("pr_run") == run and side in (None, r.timing.get("pr_side"))]


def _one(records, run: str, side: str, case_id: str):
    return next((r for r in _runs(records, run, side) if r.case_id == case_id), None)


def build(doc: dict, records: list, want) -> tuple[dict, str]:
    """Every section's figures (for the JSON) and the page (GitHub markdown, pasted as is) of the
    `want` sections. A section the run could not measure says why."""
    nums, text = {}, {}
    for s in SECTIONS[1:] + SECTIONS[:1]:  # the summary reads the others' figures
        if s not in want and not any(s in NEEDS.get(w, ()) for w in want):
            continue
        if doc["skipped"].get(s):
            nums[s], text[s] = None, f"*Not measured: {doc['skipped'][s]}*"
        else:
            nums[s], text[s] = _SECTION[s](doc, records, nums)
    head = [f"## Performance: {', '.join(doc['on'])} (ON) against {', '.join(doc['off'])} (OFF)", "",
            f"`moebench pr {doc['spec']}` on {doc['device']}. ON is the candidate, OFF the control; µs per launch, "
            "lower is better.", ""]
    failed = [r for r in records if r.status not in ("ok", "unavailable")]
    if failed:
        r = failed[0]
        head += [f"**{len(failed)} case(s) failed**, e.g. {r.timing['pr_run']} {r.timing['pr_side']} `{r.case_id}` "
                 f"{r.label}: {r.status}: {(r.error.splitlines() or [''])[0]}", ""]
    body = [x for s in SECTIONS if s in want for x in (f"### {TITLES[s]}", "", text[s].rstrip(), "")]
    return nums, "\n".join(head + body).rstrip() + "\n"


def _summary(doc, records, nums):
    c, bits = nums["correctness"] or {}, []
    for r in nums["separation"] or ():
        if "delta" in r:
            sep = SEPARATION.get(r["separation"], SEPARATION["overlap"])
            step = f"; {r['per_step_delta_us']:+.1f} µs per step" if r["per_step_delta_us"] is not None else ""
            bits.append(f"at {r['case']}, {r['off_mean']:.3f} → {r['on_mean']:.3f} µs ({100 * r['rel']:+.1f}%), "
                        f"{sep} (Δ ≈ {times_noise(r['effect'])} the noise){step}")
    exact = (f"ON bit-exact with OFF in {c['equal']}/{c['n']} cases" if c.get("against") == "off" else
             f"{c['equal']}/{c['n']} ON cases pass" if c else "no correctness run")
    timed = "; ".join(bits) or "timings need a GPU (this run used the Triton interpreter: correctness only)"
    return None, f"**{timed}; {exact}.**"


def _changed(doc, records, nums):
    rows = []
    for side in (OFF, ON):
        ids = {ids[1 if side == ON else 0] for _, *ids in doc["decision"]}
        mine = [x for x in records if x.timing.get("pr_side") == side and x.timing.get("pr_run") != "layer"]
        r = next((x for x in mine if x.case_id in ids), mine[0] if mine else None)
        if r is None:
            continue
        launch = ", ".join(f"{k}={v}" + (f" ({r.launch_from[k]})" if k in r.launch_from else "")
                           for k, v in r.launch.items())
        code = "; ".join(f"{v}: " + ", ".join(f"{k} {str(x)[:12] if k in ('sha256', 'commit') else x}"
                                              for k, x in {**c.get("files", {}), **c}.items() if x and k != "files")
                         for v, c in doc["code"][side].items())
        got = doc["compiled"][side]
        compiled = got if isinstance(got, str) else "; ".join(
            f"{k.rsplit('.', 1)[-1]} {', '.join(h[:12] for h in v)}" for k, v in got.items()) or "none new"
        rows.append([side, ", ".join(doc[side.lower()]), r.label, launch,
                     num((r.cross.get("counters") or {}).get("registers_per_thread"), "d"), code, compiled])
    return None, ("The launch of each arm at the decision shape (the records' `launch`; where a value came from in "
                  "brackets) and which code ran: its source and sha256, and the keys of the kernels first compiled "
                  "in the arm.\n\n" + md_table(["arm", "settings", "variant", "launch", "registers", "code",
                                                "compiled"], rows))


def _gain(doc, records, nums):
    """Per pair OFF / ON with their intervals: FASTER or SLOWER where the difference is beyond both
    intervals combined (compare's classify at threshold 0), else a tie."""
    rows = []
    for text, oid, nid in doc["pairs"]:
        a, b = _one(records, "gain", OFF, oid), _one(records, "gain", ON, nid)
        if a is None or b is None:
            continue
        row = {"case": text, "off_us": a.timing.get("median_us"), "on_us": b.timing.get("median_us"),
               "off_rel": a.timing.get("rel_noise"), "on_rel": b.timing.get("rel_noise")}
        if a.status != "ok" or b.status != "ok" or row["off_us"] is None or row["on_us"] is None:
            row["verdict"] = "; ".join(f"{s} {r.status}: {(r.error.splitlines() or [''])[0]}" for s, r in
                                       ((OFF, a), (ON, b)) if r.status != "ok") or "no time"
        else:
            v, d, n = classify(row["off_us"], row["on_us"], row["off_rel"], row["on_rel"], 0.0)
            row |= {"delta": d, "noise": n, "verdict": v if v in ("FASTER", "SLOWER") else "tie"}
        rows.append(row)
    table = md_table(["case", "OFF µs", "ON µs", "Δ %", "verdict"], [
        [r["case"], _iv(r["off_us"], r["off_rel"]), _iv(r["on_us"], r["on_rel"]),
         f"{100 * r['delta']:+.1f}%" if "delta" in r else "—", r["verdict"]] for r in rows])
    if len(rows) > FOLD:
        table = f"<details><summary>Per shape ({len(rows)} cases)</summary>\n\n{table}\n\n</details>"
    lost = "; ".join(r["case"] for r in rows if r["verdict"] not in ("FASTER", "tie")) or "no case"
    tied = "; ".join(r["case"] for r in rows if r["verdict"] == "tie") or "none"
    return rows, (f"One timed run per arm over the spec's cases. {doc['timer']} FASTER / SLOWER: the difference is "
                  f"beyond the two ~95% intervals combined; tie: inside them.\n\n{table}\n\nON loses (or fails) at: "
                  f"{lost}. Ties: {tied}.")


def _iv(us: float | None, rel: float | None) -> str:
    return "—" if us is None else f"{us:.3f} ± {us * rel:.3f}" if rel is not None else f"{us:.3f}"


def _separation(doc, records, nums):
    sep, rows = doc["sections"].get("separation"), []
    if sep is None:
        return rows, ""
    pairs = document_pairs(sep["cases"])
    per_launch = {c["case"]: doc["per_launch"].get(c["off_case_id"], 1) for c in sep["cases"]}
    for p in pairs:
        st, row = p.stats, {"case": p.text, "errors": p.errors}
        if st is not None:
            pr = per_step(st.off_mean, st.on_mean, doc["moe_layers"], per_launch[p.text])
            row |= {k: v for k, v in vars(st).items() if k != "arms"} | {
                "per_step_delta_us": pr.delta if pr else None,
                "min_detectable_us": min_detectable(st.sd_off, st.sd_on, st.n_off, st.n_on)}
        rows.append(row)
    md = ab_markdown(spec_name=doc["spec"], device=doc["device"], off=[], on=[], arms=sep["arms"], iters=sep["iters"],
                     pairs=pairs, layers=doc["moe_layers"], timer_text=doc["timer"],
                     per_launch=lambda p: per_launch[p.text])  # its title line is left out
    power = [f"- {r['case']}: {r['min_detectable_us']:.3f} µs ({100 * r['min_detectable_us'] / r['off_mean']:.2f}% "
             "of OFF)" for r in rows if "delta" in r]
    return rows, (md.split("\n", 2)[2] + "\nThe smallest difference this run could have detected (two-sided α = "
                  "0.05, power 0.8, from the pooled sd and the measurements per side):\n\n" + "\n".join(power))


def _counters(doc, records, nums):
    rows, out = [], []
    for text, oid, nid in doc["decision"]:
        a, b = _one(records, "scope", OFF, oid), _one(records, "scope", ON, nid)
        if a is None or b is None:
            continue
        ca, cb = a.cross.get("counters") or {}, b.cross.get("counters") or {}
        bound = [(r.cross.get("verdict") or {}).get("bound") for r in (a, b)]
        rows.append({"case": text, OFF: ca, ON: cb, "bound": bound})
        why = ca.get("unavailable") or cb.get("unavailable") or ("no counters" if not (ca and cb) else None)
        if why:
            out.append(f"{text}: no counters: {why}.")
            continue
        rows[-1]["sentence"] = counters_sentence(ca, cb, a.work, b.work)
        table = [[name, *("—" if c.get(k) is None else c[k] for c in (ca, cb))] for name, k in COUNTERS.items()]
        table.append(["bound", *bound])
        out += [f"**{text}** (Nsight Compute, one graph replay per arm):", "",
                md_table(["counter", "OFF", "ON"], table), "", rows[-1]["sentence"], ""]
    return rows, "\n".join(out) or "No counters at the decision shapes (their cases did not run)."


def counters_sentence(off: dict, on: dict, work_off: dict, work_on: dict) -> str:
    """One sentence that follows from the two arms' counters: the first rule of docs/pr.md's "Rules
    worth knowing" that applies."""
    i0, i1 = off.get("instructions"), on.get("instructions")
    o0, o1 = off.get("achieved_occupancy_pct"), on.get("achieved_occupancy_pct")
    if i0 and i1 and not 0.8 <= i1 / i0 <= 1.25:
        return f"ON executes {i1 / i0:.2f}× the instructions of OFF ({i1:,} against {i0:,}): the work per launch " \
               "changed."
    if o0 is not None and o1 is not None and abs(o1 - o0) > 5:
        return (f"At about the same instructions, ON's achieved occupancy is {o1:.0f}% against {o0:.0f}% (limiter: "
                f"{on.get('limiter')} against {off.get('limiter')}): the warps resident to hide latency changed.")
    for unit in ("dram_pct", "l2_pct"):
        a, b = off.get(unit), on.get(unit)
        if a is not None and b is not None and abs(b - a) > 10:
            return (f"At the same instructions and occupancy, {unit[:-4].upper()} throughput is {b:.0f}% of peak in ON "
                    f"against {a:.0f}%: the traffic changed.")
    n0, n1 = work_off.get("ctas_with_work"), work_on.get("ctas_with_work")
    same = f"Same instructions ({num(i0, ',')} against {num(i1, ',')}) and occupancy ({num(o0, '.0f')}% against " \
           f"{num(o1, '.0f')}%)"
    if n0 is not None and n1 is not None and n0 != n1:
        return f"{same}: latency, spread over {n1} CTAs with work in ON against {n0} in OFF."
    return f"{same}, same traffic and CTAs with work: the counters do not tell the arms apart."


def _layer(doc, records, nums):
    lay = doc["sections"]["layer"]
    md = ab_section(get_family("layer"), _runs(records, "layer"))
    return None, (f"`moebench ab {lay['spec']}` with the settings mapped into the layer ({', '.join(lay['on'])} "
                  f"against {', '.join(lay['off'])}), {lay['arms']} arms × {lay['iters']} measurements.\n\n"
                  + (md.split("\n", 2)[2] if md else "No pair of the layer's scopes completed on both sides."))


def _correctness(doc, records, nums):
    cor, on = doc["sections"].get("correctness"), _runs(records, "correctness", ON)
    if not on or cor is None:
        return {}, "No case of the verify matrix ran."

    def ref(rs):
        ok = [r for r in rs if r.status == "ok"]
        return {"n": len(rs), "exact": sum(r.checks.get("ref_check") == "exact" for r in ok),
                "within_bound": sum(r.checks.get("ref_check") != "exact" for r in ok), "failed": len(rs) - len(ok)}

    def work(r) -> dict:  # the family's non-vacuity counts (counts_sum, rows_written, ...)
        return {k: v for k, v in r.checks.items() if type(v) is int and k not in ("baseline_equal", "inputs_intact")}

    top = max(on, key=lambda r: next(iter(work(r).values()), 0))
    c = {"equal": sum(r.status == "ok" and r.checks.get("baseline_equal") is True for r in on), "n": len(on),
         "against": cor["against"], "ref": {OFF: ref(_runs(records, "correctness", OFF)), ON: ref(on)},
         "did_work": sum(next(iter(work(r).values()), 0) > 0 for r in on), "example": work(top),
         "example_case": top.case_id}
    how = ("each ON record's `baseline_equal` is torch.equal(ON, OFF) at the same inputs (the OFF launch is the "
           "baseline of this run)" if c["against"] == "off" else
           "the arms differ in an environment variable, so each arm was checked against the torch reference and "
           "the spec's baseline launch; ON = OFF follows where both equal the reference exactly")
    refs = []
    for side, x in c["ref"].items():
        refs.append(f"{side}: {x['exact']}/{x['n']} exact" + (f", {x['within_bound']} within the stated bound"
                                                              if x["within_bound"] else "")
                    + (f", {x['failed']} failed" if x["failed"] else ""))
    matrix = "verify matrix" if cor["matrix"] == "verify" else "cases (it has no verify matrix)"
    return c, (f"**{c['equal']}/{c['n']} {'bit-exact (ON against OFF)' if c['against'] == 'off' else 'pass'}** over "
               f"the spec's {matrix}, {cor['pairs']} cases per arm, untimed: {how}.\n\n- Torch reference: "
               f"{'; '.join(refs)}.\n"
               f"- Non-vacuous: {c['did_work']}/{c['n']} ON cases did work by their own checks (the others are empty "
               f"shapes); the largest: {', '.join(f'{k}={v}' for k, v in c['example'].items())} (case "
               f"{c['example_case']}).")


def _killswitch(doc, records, nums):
    """The family's kill switches whose parameter the two arms launch with different values (the
    OFF arm's value restores its behaviour), and the value to ship: recommend's rule on both arms'
    timed records, a value only where it beats the shipped default over the mix beyond noise."""
    fam, gain = get_family(doc["family"]), _runs(records, "gain")
    ids = {ids[i] for _, *ids in doc["decision"] for i in (0, 1)}
    a, b = (next((r for r in _runs(records, "gain", s) if r.case_id in ids), None) for s in (OFF, ON))
    sws = [sw for sw in switches(fam).values() if a and b and value_of(a, sw.param) != value_of(b, sw.param)]
    if not sws:
        return {}, (f"The arms launch every kill switch's parameter alike (family {fam.name!r}: "
                    f"{', '.join(f'{sw.var} ({sw.param})' for sw in switches(fam).values()) or 'none'}).")
    k = {"variable": sws[0].var, "param": sws[0].param, "default": sws[0].default, "restore": value_of(a, sws[0].param)}
    try:
        d = next(d for d in decide(gain, fam, weights_text=doc.get("weights")) if d.switch.var == k["variable"])
        k |= {"ship": d.value, "emitted": d.emit, "reason": d.reason, "variant": d.variant}
        how = (f"ship `{d.switch.var}={d.value}`" if d.emit else f"keep the default (`{d.switch.var}={d.value}`)") \
            + f" — {d.reason} (measured on {d.variant})"
    except (UsageError, StopIteration) as e:  # recommend's message, without the option it names there
        k["reason"] = how = "not judged here: " + str(e).removeprefix("--emit: ")
    mix = f"the mix {doc['weights']}" if doc.get("weights") else "every shape weighted equally"
    return k, (f"`{k['variable']}={k['restore']}` restores the OFF arm's behaviour ({k['param']} "
               f"{k['restore']}; ON launches {value_of(b, k['param'])}). The value to ship for {mix}, by "
               f"recommend's rule (only where it beats the shipped default beyond noise): {how}.")


def _scope(doc, records, nums):
    rows = []
    for text, oid, nid in doc["decision"]:
        for side, cid in ((OFF, oid), (ON, nid)):
            r = _one(records, "scope", side, cid)
            g = (r.timing.get("group_medians_us") or []) if r is not None and r.status == "ok" else []
            if len(g) > 1 and r.timing.get("rel_noise") is not None:
                m, h = r.timing["median_us"], r.timing["median_us"] * r.timing["rel_noise"]
                rows.append({"case": text, "side": side, "mean_us": m, "half_us": h, "min_us": min(g),
                             "max_us": max(g), "placements": len(g), "wider": (max(g) - min(g)) / 2 > h})
    tied = "; ".join(f"{r['case']} ({r['verdict']})" for r in nums["gain"] or () if r["verdict"] != "FASTER")
    out = [f"- Measured on {doc['device']} only, at the spec's shapes ({len(doc['pairs'])} cases); other GPUs and "
           "shapes outside the spec were not measured.", f"- Tied or lost: {tied or 'none'}."]
    if not rows:
        return rows, "\n".join(out + ["- Per-placement range: not measured (the spec times a single placement group)."])
    return rows, "\n".join(out + [
        "- One deployment sees one buffer placement: each decision case timed with one placement per timer group; "
        "where the range is wider than the interval, that is the spread a deployment may see.", "",
        md_table(["case", "arm", "mean µs", "per-placement min–max µs", "placements", "wider than the interval"],
                 [[r["case"], r["side"], f"{r['mean_us']:.3f} ± {r['half_us']:.3f}",
                   f"{r['min_us']:.3f}–{r['max_us']:.3f}", r["placements"], "yes" if r["wider"] else "no"]
                  for r in rows])])


def _protocol(doc, records, nums):
    p = doc["provenance"]
    d = p.get("device") or {}
    megatron = ", ".join(f"{k} {v}" for k, v in (p.get("upstream") or {}).items()) or "not used"
    lines = [f"- Device: {d.get('name')} (UUID {d.get('uuid') or '—'}), driver {d.get('driver') or '—'}, CUDA "
             f"{d.get('cuda') or '—'}, torch {d.get('torch')}, triton {d.get('triton')}.",
             f"- moebench {p.get('moebench')} at commit {p.get('git_commit')}; megatron: {megatron}.",
             f"- Timer: {doc['timer']}", f"- Arm order: {doc['order']}, in one process; per-arm settings: OFF "
             f"{', '.join(doc['off'])}; ON {', '.join(doc['on'])}.", f"- This page: `{p.get('command')}`.", "",
             "Each section alone (the standalone commands run the spec's own cases; a per-arm kernel source exists "
             "only in `pr`):", ""]
    return None, "\n".join(lines + [f"- {TITLES[s]}: `{c}`" for s, c in doc["commands"].items()])


_SECTION = {"summary": _summary, "changed": _changed, "gain": _gain, "separation": _separation, "counters": _counters,
            "layer": _layer, "correctness": _correctness, "killswitch": _killswitch, "scope": _scope,
            "protocol": _protocol}


def ab_page(prov: dict, records: list) -> str:
    """An `ab` run's page from its results file alone (provenance.ab and the records): the PR-ready
    A/B block (moebench.analysis.ab.ab_markdown) and the family's own reading of both arms (the
    layer's conversion table)."""
    spec, doc = page_spec(prov, records), prov["ab"]
    params = {r.case_id: r.params for r in records}
    per_launch = {c["case"]: launch_layers(spec.family, params.get(c["off_case_id"], {})) for c in doc["cases"]}
    md = ab_markdown(spec_name=spec.name, device=prov["device"]["name"], off=doc["off"], on=doc["on"], arms=doc["arms"],
                     iters=doc["iters"], pairs=document_pairs(doc["cases"]), layers=doc["moe_layers"],
                     timer_text=timer_text(spec.family, prov["timing"]), per_launch=lambda p: per_launch[p.text])
    extra = ab_section(spec.family, records)  # the family's own reading of both arms (layer: the conversion)
    if extra:
        md += "\n" + extra.rstrip() + "\n"
    return md

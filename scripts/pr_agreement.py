"""Does a `moebench pr` page agree with the standalone commands of the same device call? (issue 34)

    python3 scripts/pr_agreement.py PR.json STANDALONE_DIR OUT_STEM

STANDALONE_DIR holds, from the same call: NAME.json (`sweep`), NAME-ab.json (`ab`), NAME-verify.json
(`verify`), counters/NAME.json (`sweep --counters`) and LAYER-ab.json (`ab` of the layer spec),
each as `moebench pr`'s protocol section names them. Writes OUT_STEM.json (every pair of numbers and
its verdict) and OUT_STEM.md (generated from it). The rules, one per section:

- measured gain: each arm's median per case against the standalone sweep's record of the same
  launch; they agree when |a - b| <= hypot of the two stated 95% half-widths (rel_noise x median);
- arm separation and the layer: each side's mean over its arms against the standalone ab's, per
  case; they agree when |a - b| <= 2 x hypot(sd_a, sd_b) / sqrt(n) x sqrt(n) = 2 x hypot(sd_a, sd_b)
  (the two runs' pooled sds, arms included: a difference of means under two standard deviations of
  one measurement);
- correctness: the pr's ON-against-OFF count against the standalone verify records of the ON launch
  (exact against torch and equal to the baseline launch);
- counters: the deterministic counters (instructions, registers, theoretical occupancy) equal, and
  the kernel time within 5% (one profiled replay each).
A results file is data: nothing it names is run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def load(p: Path) -> dict:
    return json.loads(p.read_text())


def params_of(case_text: str) -> dict:
    out = {}
    for part in case_text.split(", "):
        k, _, v = part.partition("=")
        out[k.strip()] = int(v) if v.lstrip("-").isdigit() else v
    return out


def match(records: list, **sel) -> dict | None:
    hits = [r for r in records if all(r["params"].get(k) == v for k, v in sel.items())]
    return hits[0] if len(hits) == 1 else None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    pr_path, sa, stem = Path(argv[0]), Path(argv[1]), Path(argv[2])
    pr = load(pr_path)
    doc = pr["provenance"]["pr"]
    name = pr["provenance"]["sweep"]
    arms = {s: dict(kv.split("=", 1) for kv in doc[s.lower()]) for s in ("OFF", "ON")}
    key = {s: {k: int(v) for k, v in a.items() if v.isdigit()} for s, a in arms.items()}
    rows = []

    sweep = load(sa / f"{name}.json")["records"]
    for g in pr["numbers"]["gain"]:
        for side in ("OFF", "ON"):
            r = match(sweep, **params_of(g["case"]), **key[side])
            mine, rel = g[f"{side.lower()}_us"], g[f"{side.lower()}_rel"]
            theirs, trel = r["timing"]["median_us"], r["timing"]["rel_noise"]
            tol = math.hypot(mine * rel, theirs * trel)
            rows.append(["measured gain", f"{g['case']} {side}", mine, theirs, tol, abs(mine - theirs) <= tol])

    def ab_rows(section: str, ab_file: Path, cases: list[dict]):
        standalone = {c["case"]: c for c in load(ab_file)["provenance"]["ab"]["cases"]}
        for c in cases:
            s = standalone.get(c["case"])
            if s is None:
                continue
            for side in ("off", "on"):
                tol = 2 * math.hypot(c[f"sd_{side}"], s[f"sd_{side}"])
                rows.append([section, f"{c['case']} {side.upper()}", c[f"{side}_mean"], s[f"{side}_mean"], tol,
                             abs(c[f"{side}_mean"] - s[f"{side}_mean"]) <= tol])

    ab_rows("arm separation", sa / f"{name}-ab.json", pr["numbers"]["separation"])
    layer_file = next(iter(sorted(sa.glob("layer-*-ab.json"))), None)
    if layer_file is not None:
        by_case: dict[str, dict[str, list[float]]] = {}
        for r in pr["records"]:
            if r["timing"].get("pr_run") == "layer" and r["timing"].get("median_us") is not None:
                text = ", ".join(f"{k}={r['params'][k]}" for k in ("layers", "scope"))
                by_case.setdefault(text, {}).setdefault(r["timing"]["pr_side"].lower(), []).append(
                    r["timing"]["median_us"])
        cases = []
        for text, sides in by_case.items():
            c = {"case": text}
            for side, xs in sides.items():
                m = sum(xs) / len(xs)
                c[f"{side}_mean"] = m
                c[f"sd_{side}"] = math.sqrt(sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1))
            cases.append(c)
        ab_rows("in a layer step", layer_file, cases)

    verify = load(sa / f"{name}-verify.json")["records"]
    on = [r for r in verify if all(r["params"].get(k) == v for k, v in key["ON"].items())]
    ok = sum(r["checks"].get("ref_check") == "exact" and r["checks"].get("baseline_equal") is True for r in on)
    corr = pr["numbers"]["correctness"]
    rows.append(["correctness", "ON cases exact and equal to the baseline", f"{corr['equal']}/{corr['n']}",
                 f"{ok}/{len(on)}", "equal counts", corr["equal"] == ok and corr["n"] == len(on)])

    counters = load(sa / "counters" / f"{name}.json")["records"]
    for c in pr["numbers"]["counters"] or []:
        for side in ("OFF", "ON"):
            r = match(counters, **params_of(c["case"]), **key[side])
            mine, theirs = c[side], r["cross"]["counters"]
            for k in ("instructions", "registers_per_thread", "theoretical_occupancy_pct"):
                rows.append(["counters", f"{c['case']} {side} {k}", mine.get(k), theirs.get(k), "equal",
                             mine.get(k) == theirs.get(k)])
            a, b = mine.get("kernel_us"), theirs.get("kernel_us")
            rows.append(["counters", f"{c['case']} {side} kernel_us", a, b, "5%",
                         a is not None and b is not None and abs(a - b) <= 0.05 * b])

    out = {"pr": str(pr_path), "standalone": str(sa), "device": pr["provenance"]["device"]["name"],
           "gpu_uuid": pr["provenance"]["device"].get("uuid"), "commit": pr["provenance"].get("git_commit"),
           "rows": [dict(zip(("section", "what", "pr", "standalone", "tolerance", "agree"), r)) for r in rows]}
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    md = [f"# `{pr['provenance']['command']}` against its standalone commands", "",
          f"Made by `scripts/pr_agreement.py` from `{stem.with_suffix('.json').name}` ({out['device']}, "
          f"{out['gpu_uuid']}, moebench {out['commit']}): the page's numbers beside those of the standalone "
          "`sweep`, `ab`, `verify`, `sweep --counters` and layer `ab` of the same device call; the script's "
          "docstring states each section's rule.", "",
          f"**{sum(r[5] for r in rows)}/{len(rows)} agree.**", "",
          "| section | what | pr | standalone | tolerance | agree |", "|---|---|---|---|---|---|"]
    md += [f"| {r[0]} | {r[1]} | {cell(r[2])} | {cell(r[3])} | {cell(r[4])} | {'yes' if r[5] else 'NO'} |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r[5] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

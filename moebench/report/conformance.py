"""Seed kernels beside their upstream twins (docs/method.md, "Beside Megatron's kernels"; the page
says how a pair is made): an `upstream` record and one of the seed variants it names as twins, from
one run, at the same shape and every numeric launch value equal; within the family's
`twin_tolerance` their ratio says they are one mechanism. Pure Python over records: no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from moebench.analysis.pages import builtin_family
from moebench.core.records import Record
from moebench.core.stats import median
from moebench.core.text import md_table, num, printable, varying


@dataclass
class Twin:
    family: str
    shape: dict[str, Any]
    launch: dict[str, Any]
    ours: Record
    theirs: Record
    tolerance: float | None

    @property
    def exact(self) -> bool:
        return all(r.status == "ok" and r.checks.get("baseline_equal") for r in (self.ours, self.theirs))

    @property
    def ratio(self) -> float | None:
        a, b = self.ours.timing.get("median_us"), self.theirs.timing.get("median_us")
        if self.ours.status == self.theirs.status == "ok" and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 and math.isfinite(a):
            return a / b
        return None

    @property
    def within(self) -> bool | None:
        r = self.ratio
        return None if r is None or self.tolerance is None else abs(r - 1) <= self.tolerance


def _launch_key(rec: Record) -> tuple:
    return tuple(sorted((k, v) for k, v in rec.launch.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)))


def twins(records: Sequence[Record]) -> list[Twin]:
    """Every (seed variant, its upstream twin) pair of records with equal shape and launch, in record
    order: a pair whose case failed is a pair that is not bit-exact; only a kernel that was not there
    (`unavailable`) makes none. Families are the built-in ones: a reader never imports a plugin."""
    cat: dict = {}
    ours: dict[tuple, list[Record]] = {}
    theirs = []
    for r in records:
        fam = cat[r.family] if r.family in cat else cat.setdefault(r.family, builtin_family(r.family))
        v = fam.variants.get(r.variant) if fam is not None else None
        if v is None or r.status == "unavailable":
            continue
        key = (r.family, tuple((k, r.params.get(k)) for k in fam.shape_params), _launch_key(r))
        if v.twins:
            theirs.append((key, r, v.twins))
        else:
            ours.setdefault(key, []).append(r)
    out = []
    for key, t, names in theirs:
        for o in ours.get(key, ()):
            if o.variant in names:
                out.append(Twin(t.family, dict(key[1]), dict(key[2]), o, t, cat[t.family].twin_tolerance))
    return out


def _launch_text(p: Twin) -> str:
    keys = ("block_size", "grid", "num_blocks", "num_warps")
    return ", ".join(f"{k} {p.launch[k]}" for k in keys if k in p.launch)


def section(records: Sequence[Record]) -> str:
    """The results page's "Beside the upstream kernel" section, or "" without twin pairs."""
    pairs = twins(records)
    if not pairs:
        return ""
    return "\n".join(["## Beside the upstream kernel", "", summary(pairs), "", table(pairs)])


def summary(pairs: list[Twin]) -> str:
    timed = [p for p in pairs if p.ratio is not None]
    exact = sum(p.exact for p in pairs)
    line = (f"{len(pairs)} twin pairs (moebench's kernel and Megatron's, same shape and launch, same run); "
            f"{exact}/{len(pairs)} bit-exact.")
    if timed:
        tol = {p.tolerance for p in timed}
        ratios = [p.ratio for p in timed]
        off = [p for p in timed if p.within is False]
        line += (f" Ours ÷ upstream: median {median(ratios):.3f}, range {min(ratios):.3f} to "
                 f"{max(ratios):.3f}; ")
        line += (f"every pair within ±{100 * max(tol):.0f}%." if not off else
                 f"{len(off)} of {len(timed)} outside ±{100 * max(tol):.0f}% (marked below).")
    else:
        line += " No timings in this run (correctness only)."
    return line


def table(pairs: list[Twin]) -> str:
    vary = varying([p.shape for p in pairs])
    rows = []
    for p in pairs:
        mark = {True: "yes", False: "**no**", None: "—"}[p.within]
        rows.append([*(p.shape.get(k) for k in vary), _launch_text(p), p.ours.label, p.theirs.label,
                     num(p.ours.timing.get("median_us")), num(p.theirs.timing.get("median_us")),
                     num(p.ratio, ".3f"), "yes" if p.exact else "**no**", mark])
    tol = next((p.tolerance for p in pairs if p.tolerance is not None), None)
    head = [*vary, "launch", "ours", "upstream", "ours µs", "upstream µs", "ours ÷ upstream", "bit-exact",
            f"within ±{100 * tol:.0f}%" if tol else "within"]
    return md_table(head, rows)


def rows(pairs: list[Twin]) -> list[dict]:
    """Long format, one row per pair (for the csv and json of `moebench conformance`)."""
    out = []
    for p in pairs:
        out.append({"family": p.family, **{f"shape_{k}": v for k, v in p.shape.items()},
                    **{f"launch_{k}": v for k, v in p.launch.items()}, "ours": p.ours.label,
                    "ours_case_id": p.ours.case_id, "upstream": p.theirs.label, "upstream_case_id": p.theirs.case_id,
                    "ours_us": p.ours.timing.get("median_us"), "upstream_us": p.theirs.timing.get("median_us"),
                    "ours_rel_noise": p.ours.timing.get("rel_noise"),
                    "upstream_rel_noise": p.theirs.timing.get("rel_noise"), "ratio": p.ratio, "bit_exact": p.exact,
                    "tolerance": p.tolerance, "within": p.within})
    return out


def page(pairs: list[Twin], sources: list[tuple[str, dict]]) -> str:
    """The conformance page over several results files: where each came from, then each
    family's summary and pairs."""
    out = ["# Seed kernels beside their upstream twins", "",
           "Each pair is moebench's seed-baseline kernel and Megatron's own, imported at run time, timed in the same "
           "run by the same timer over the same buffer rotation, at the same shape and launch. Bit-exact: both "
           "launches are torch.equal to the sweep's baseline launch.", ""]
    for path, prov in sources:
        dev = (prov.get("device") or {}).get("name")
        up = prov.get("upstream") or {}
        src = ", ".join(f"{k} {v}" for k, v in up.items() if v) or "none recorded"
        out.append(f"- `{path}`: sweep {prov.get('sweep')} on {dev}, commit {prov.get('git_commit')}, "
                   f"`{prov.get('command')}`; upstream: {src}")
    for fam in dict.fromkeys(p.family for p in pairs):
        fp = [p for p in pairs if p.family == fam]
        out += ["", f"## {fam}", "", summary(fp), "", table(fp)]
    return printable("\n".join(out), lines=True) + "\n"

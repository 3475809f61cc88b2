"""``moebench merge``: shard results (from --shard or a Slurm array) back into one results file.
Torch-free: it reads the files alone, never a spec file they name (loading one runs its plugins) nor a
kernel."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from moebench.analysis import by_case
from moebench.analysis.comparable import differences
from moebench.analysis.pages import page_spec
from moebench.core.baseline import add_deltas
from moebench.core.records import Record, load_results
from moebench.errors import UsageError


@dataclass
class Merged:
    """Shard results put back together."""

    provenance: dict
    records: list  # list[Record], in the spec's case order when the spec could be read
    files: list[Path]
    duplicates: int = 0  # identical records met more than once, kept once
    shard_count: int | None = None  # N of the I/N the files carry, when they agree on it
    missing_shards: list[int] = field(default_factory=list)
    missing_cases: int | None = None  # None: the spec was not available to count them
    incomplete_files: list[Path] = field(default_factory=list)
    spec: Any = None  # the PageSpec read from the files (moebench.analysis.pages.page_spec)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.incomplete_files and not self.missing_shards and not self.missing_cases


# (what, how to read it from a provenance, how to show it): shards must agree on all of them, and on
# the device, the timer settings and the kill switches (moebench.analysis.comparable.differences: a
# shard with MCORE_COUNT_TOKENS_BLOCK=64 beside one with 1024 is two different runs)
_MUST_AGREE = (
    ("spec sha256", lambda p: p.get("spec_sha256"), lambda v: str(v)[:12]),
    ("matrix", lambda p: f"{p.get('matrix', 'sweep')}{' (quick)' if p.get('quick') else ''}", str),
    ("cross checks", lambda p: sorted(p.get("cross_checks") or []), repr),
    ("baseline launch", lambda p: (p.get("settings") or {}).get("baseline"), repr),
)


def merge_results(paths: Sequence[Path]) -> Merged:
    """Read shard result files and merge them, refusing inputs that are not shards of one run."""
    files: list[Path] = []
    seen_paths: set[Path] = set()
    for p in map(Path, paths):
        if p.resolve() in seen_paths:
            continue
        seen_paths.add(p.resolve())
        if p.suffix == ".jsonl":
            raise UsageError(f"{p}: a partial stream of a run still going (or killed); pass the shard's .json "
                             "(rerun the shard with --resume to write it)")
        files.append(p)
    if not files:
        raise UsageError("merge: no results files given")
    loaded = []
    for p in files:
        prov, recs = load_results(p)
        if not prov.get("spec_sha256"):
            raise UsageError(f"{p}: no provenance.spec_sha256; not a moebench results file")
        by_case(recs, str(p), "merge")  # a shard's results: an ab or pr file is not one
        loaded.append((p, prov, recs))

    p0, prov0, _ = loaded[0]
    for p, prov, _ in loaded[1:]:
        diff = differences(prov0, prov)
        switches = [d for d in diff.number if d.startswith("$")]
        timing = [d for d in diff.number + diff.noise_only if d not in switches]
        for what, found in (("device differs", diff.device), ("timing settings differ", timing),
                            ("kill-switch settings differ", switches)):
            if found:
                raise UsageError(f"cannot merge: {what}: {p0} -> {p}: {'; '.join(found)}; merge only shards of one "
                                 "sweep on one device class")
        for what, get, show in _MUST_AGREE:
            a, b = get(prov0), get(prov)
            if a != b:
                raise UsageError(f"cannot merge: {what} differs: {p0} has {show(a)}, {p} has {show(b)}; "
                                 "merge only shards of one sweep on one device class")

    records: dict[str, Record] = {}
    where: dict[str, Path] = {}
    m = Merged(provenance={}, records=[], files=files)
    for p, prov, recs in loaded:
        for r in recs:
            if r.case_id in records:
                if records[r.case_id].to_json() == r.to_json():
                    m.duplicates += 1
                    continue
                raise UsageError(f"cannot merge: case {r.case_id} ({r.label}) is in {where[r.case_id]} and in {p} "
                                 "with different results; drop one of the files")
            records[r.case_id] = r
            where[r.case_id] = p
        if prov.get("complete") is not True:
            m.incomplete_files.append(p)

    # shard coverage, from the shard numbers the files carry
    shards = [tuple(prov["shard"]) for _, prov, _ in loaded if prov.get("shard")]
    counts = {n for _, n in shards}
    if len(shards) == len(loaded) and len(counts) == 1:
        n = m.shard_count = counts.pop()
        m.missing_shards = sorted(set(range(n)) - {i for i, _ in shards})
    elif shards and len(counts) > 1:
        m.notes.append(f"the files come from splits into {', '.join(map(str, sorted(counts)))} shards; "
                       "coverage is checked by case id only")

    # the whole matrix, from the files themselves (provenance.cases): a reader never opens the spec
    # file a results file names (loading a spec runs its plugins)
    m.spec = page_spec(prov0, [r for _, _, recs in loaded for r in recs])
    cmap = _case_map(loaded)
    order: dict[str, int] = {}
    if cmap is not None:
        order = {cid: i for i, cid in enumerate(cmap)}
        m.missing_cases = sum(1 for cid in order if cid not in records)
    else:
        m.notes.append("the files do not list the spec's cases (provenance.cases): "
                       "kept the files' record order, coverage checked by shard numbers only; no recomputed "
                       "baseline deltas")
    # a stable sort: records the matrix does not order keep the files' order
    m.records = sorted(records.values(), key=lambda r: order.get(r.case_id, len(order)))
    if cmap is not None:
        # a shape's baseline may have run in another shard
        add_deltas(m.records, cmap, m.spec.model.get("moe_layers"), m.spec.family)

    commits = sorted({str(prov.get("git_commit")) for _, prov, _ in loaded})
    if len(commits) > 1:
        m.notes.append(f"the shards ran at different commits: {', '.join(commits)}")
    m.provenance = _merged_provenance(loaded, commits)
    m.provenance["n_cases"] = len(order) if order else None  # the whole spec's, not the first shard's
    return m


def _case_map(loaded: list) -> dict | None:
    """provenance.cases of the shards (case id -> baseline case id, the whole matrix in order), when
    every file carries it and they agree; else None."""
    maps = [prov.get("cases") for _, prov, _ in loaded]
    if any(not isinstance(c, dict) for c in maps) or any(c != maps[0] for c in maps[1:]):
        return None
    return maps[0]


def _merged_provenance(loaded: list, commits: list[str]) -> dict:
    prov0 = loaded[0][1]
    base = {k: v for k, v in prov0.items() if k not in ("complete", "n_records")}

    def num(prov: dict, key: str) -> float:
        v = prov.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    base.update({
        "command": " ".join(["moebench"] + sys.argv[1:]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "shard": None,
        "merged_from": [{
            "file": str(p), "shard": prov.get("shard"), "complete": prov.get("complete"),
            "n_records": len(recs), "timestamp": prov.get("timestamp"), "command": prov.get("command"),
            "git_commit": prov.get("git_commit"), "sweep_wall_s": prov.get("sweep_wall_s"),
            "compile_s_total": prov.get("compile_s_total"),
        } for p, prov, recs in loaded],
        # the shards ran side by side: the sweep took as long as the slowest; compiling added up
        "sweep_wall_s": max(num(prov, "sweep_wall_s") for _, prov, _ in loaded),
        "compile_s_total": round(sum(num(prov, "compile_s_total") for _, prov, _ in loaded), 3),
        "jit_specializations": sum(int(num(prov, "jit_specializations")) for _, prov, _ in loaded),
    })
    if len(commits) > 1:
        base["git_commits"] = commits
    return base


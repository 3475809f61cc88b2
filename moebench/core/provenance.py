"""What a run records about itself: its provenance (the spec, the device, the commit, the
command; `run_extra` adds what the run sets before its first case and `summary_fields` what the
run driver's Summary reports after its last, so the CLI builds none of it by hand), the settings
its numbers depend on (`run_settings`), and the resume key of each case (`record_key`) that
`--resume` matches records by.

Every record carries ``resume_key``, the hash of its case (every parameter, the model values and
seed among them) and the run's settings (`record_key`, `run_settings`; docs/method.md, 'Results
files'). The spec's bytes are not part of it, so a comment or a new axis value keeps every finished
record.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from moebench import __version__
from moebench.core.baseline import baseline_ids
from moebench.core.cases import expand
from moebench.core.spec import PACKAGE_ROOT
from moebench.sources import arms, plugins, upstream

# Where the tree has no .git of its own (copied to a GPU machine), the commit it was copied from
COMMIT_ENV = "MOEBENCH_COMMIT"


def git_commit() -> str | None:
    """moebench's own commit: $MOEBENCH_COMMIT when set, else HEAD (with -dirty for uncommitted
    changes) of the git repository whose top folder holds this package (a copy of the tree without
    its .git inside another repository would otherwise name that repository's commit); else None
    (provenance then says "unknown")."""
    if os.environ.get(COMMIT_ENV, "").strip():
        return os.environ[COMMIT_ENV].strip()
    head = upstream.git_head(PACKAGE_ROOT)
    if head is None:
        return None
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty.stdout.strip() else "")


def portable_path(path: Path | str) -> str:
    """A spec path as provenance keeps it: relative to the moebench checkout when inside it
    (``sweeps/count-block.yaml``), else relative to the working folder when below it, else
    absolute. A results file then never carries the clone's own location."""
    p = Path(path)
    try:
        full = p.resolve()
    except (OSError, RuntimeError):
        return str(p)
    for base in (PACKAGE_ROOT, Path.cwd().resolve()):
        try:
            return str(full.relative_to(base))
        except ValueError:
            continue
    return str(full)


def provenance(spec, device, *, quick: bool, verify: bool, ceilings: dict, extra: dict | None = None) -> dict:
    return {
        "sweep": spec.name,
        "spec_path": portable_path(spec.path),
        "spec_sha256": spec.sha256,
        "model": spec.model_name,
        "seed": spec.seed,
        "quick": quick,
        "matrix": "verify" if verify else "sweep",
        "command": " ".join(["moebench"] + sys.argv[1:]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "moebench": __version__,
        "git_commit": git_commit() or "unknown",
        "device": device.to_dict(),
        "ceilings": ceilings,
        "timing": asdict(spec.timing),
        # what a page needs of the spec, so that render and merge read the results file alone
        "page": {"family": spec.family.name, "description": spec.description, "pivot": dict(spec.pivot),
                 "baseline": spec.baseline, "moe_layers": (spec.model or {}).get("moe_layers"),
                 "host_only": bool(spec.family.host_only)},
        "cases": case_map(spec, quick=quick, verify=verify),
        **(extra or {}),
    }


def run_extra(spec, cases: Sequence, *, cross: Sequence[str], timed: bool, shard: tuple[int, int] | None,
              settings: dict, noise_model: dict | None = None) -> dict:
    """The provenance a run adds before it starts: the cross-checks asked for (the Summary later
    says which ran), whether it is timed, its cases and shard, the settings its records are
    resumed under, the noise model of a timed run (moebench.core.noise: the chosen model's
    provenance), and where upstream and plugin kernels came from when the run uses them."""
    extra = {"cross_checks": list(cross), "timed": timed, "n_cases": len(cases),
             "shard": list(shard) if shard else None, "settings": settings}
    if timed and noise_model is not None:
        extra["noise_model"] = noise_model
    if any(spec.family.variants[c.variant].source == "upstream" for c in cases):
        extra["upstream"] = upstream.provenance()
    if plugins.loaded():
        extra["plugins"] = plugins.loaded()
    return extra


def summary_fields(summary) -> dict:
    """What the run driver's Summary adds to the provenance once the run ends."""
    return {
        "sweep_wall_s": summary.wall_s,  # cases incl. compile + verify
        "compile_s_total": summary.compile_s,
        "jit_specializations": summary.jit_specializations,
        "wall_phases_s": summary.phases,  # where the cases' time went (scripts/wall_profile.py)
        "complete": summary.complete,
        "cross_checks": summary.passes,  # what ran, and only that
    }


def case_map(spec, *, quick: bool, verify: bool) -> dict[str, str | None] | None:
    """The whole matrix of a run (every shard's cases), in order: case id -> id of the case that is
    the baseline launch at its shape (baseline_ids; None where there is none). Kept in
    provenance.cases so that `merge` counts missing cases, orders records and reads each against
    its baseline without the spec."""
    try:
        cases = expand(spec, quick=quick, verify=verify, force=True)
        return baseline_ids(spec, [(c.id, c.variant, c.params) for c in cases])
    except Exception:  # noqa: BLE001 - provenance stands without it; merge then says it cannot count
        return None


def run_settings(spec, device, *, timed: bool, cross: Iterable[str], environ: Mapping[str, str]) -> dict:
    """Everything besides the case itself that a record's numbers depend on. Changing any of it
    between runs makes `--resume` run the case again: the device (name, backend, SMs, L2),
    whether the run was timed, the timer settings (with --l2), the cross-checks, every kill-switch
    variable the family's variants read (as set, or None), the baseline launch every case is
    checked against, and the content hash of each plugin file that defines a variant or the family
    (`code`; record_key takes only the case's own)."""
    switches = sorted({var for v in spec.family.variants.values() for var, _ in v.env.values()})
    out = {
        "device": {"name": device.name, "backend": device.backend, "sm_count": device.sm_count,
                   "l2_bytes": device.l2_bytes},
        "timed": bool(timed),
        "timing": asdict(spec.timing),
        "cross_checks": sorted(cross),
        "switches": {var: (environ.get(var) or "").strip() or None for var in switches},
        "baseline": spec.baseline,
    }
    code = {"family": _source_sha(spec.family.origin),
            "variants": {n: h for n, v in spec.family.variants.items() if (h := _source_sha(v.source))}}
    if code["family"] or code["variants"]:
        out["code"] = code
    return out


def _source_sha(source: str) -> str | None:
    """sha256 of the plugin code behind a variant's or family's source ('plugin FILE', or 'plugin
    MODULE (entry point NAME)'): the file, and every module loaded now (sys.modules) from a file
    under that file's folder, moebench's own package aside, so that editing a module a plugin
    imports re-runs its cases too (installed libraries, the standard library and the other plugin
    files loaded aside: those are not this plugin's code). None for built-in and upstream code."""
    if not isinstance(source, str) or not source.startswith("plugin "):
        return None
    what = source[len("plugin "):]
    path: str | None = what
    if " (entry point " in what:
        try:
            found = importlib.util.find_spec(what.split(" (entry point ")[0].split(":")[0])
            path = found.origin if found is not None else None
        except (ImportError, ValueError):
            path = None
    if not path:
        return None
    main = Path(path).resolve()
    folder = main.parent
    not_theirs = [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    files = {main}
    others = {Path(p["path"]) for p in plugins.loaded()} - {main}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if isinstance(f, str) and f.endswith(".py"):
            p = Path(f).resolve()
            if (p.is_relative_to(folder) and p not in others and not any(p.is_relative_to(x) for x in not_theirs)
                    and not {"site-packages", "dist-packages"} & set(p.parts)):
                files.add(p)
    h = hashlib.sha256()
    try:
        for p in sorted(files):
            h.update(f"{p.relative_to(folder)}\0".encode() + p.read_bytes())
    except OSError:
        return None
    return h.hexdigest()


def variant_code(family, name: str) -> dict:
    """Which code a variant's launch ran, for a page to prove it (`moebench pr`): a plugin's file and
    what it imports from its folder (as `_source_sha`), a checkout clone's kernel files and commit,
    the process's upstream kernel files, else moebench's own module at its commit."""
    v = family.variants[name]
    if v.source.startswith("plugin "):
        return {"source": v.source, "sha256": _source_sha(v.source)}
    files = {portable_path(m.__file__): hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest()
             for m in arms.modules(family, name) if isinstance(getattr(m, "__file__", None), str)}
    root = arms.checkout(name)
    if root is not None:
        return {"source": f"checkout {root}", "commit": upstream.git_head(root), "files": files}
    if v.source == "upstream":
        return {"source": "upstream", **upstream.provenance(), "files": files}
    return {"source": v.source, "commit": git_commit() or "unknown", "files": files}


def record_key(case, settings: dict) -> str:
    """The resume key of a case run under `settings`: 16 hex digits of a sha256 over the case
    (family, variant, label, every parameter), the settings, and the content hash of the plugin
    file behind the case's variant and family (editing a plugin re-runs its cases, and only
    those), in canonical JSON."""
    code = settings.get("code") or {}
    mine = {"family": code.get("family"), "variant": (code.get("variants") or {}).get(case.variant)}
    doc = {"case": [case.family, case.variant, case.label, case.params],
           "settings": {k: v for k, v in settings.items() if k != "code"}}
    if any(mine.values()):
        doc["code"] = mine
    blob = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def settings_diff(old: dict | None, new: dict) -> str:
    """What changed between two run_settings, as `key: old -> new` phrases."""
    if not isinstance(old, dict):
        return "no settings recorded"

    def flat(d: Any, pre: str = "") -> dict[str, Any]:
        if isinstance(d, dict) and d:
            out: dict[str, Any] = {}
            for k, v in d.items():
                out.update(flat(v, f"{pre}.{k}" if pre else str(k)))
            return out
        return {pre: d}

    a, b = flat(old), flat(new)
    bits = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            name = f"${k.split('.', 1)[1]}" if k.startswith("switches.") else k
            show = [("unset" if v is None and k.startswith("switches.") else repr(v)) for v in (a.get(k), b.get(k))]
            bits.append(f"{name}: {show[0]} -> {show[1]}")
    return "; ".join(bits) or "the same settings"


"""The device noise model: the between-process term of a case's stated interval, measured over
fresh-process runs (docs/method.md, 'The run-to-run term: the noise model'). A model is a small
JSON file per sweep and device that scripts/repro.py calibrate writes (results/h200/noise/*.json);
it is data: only its numbers are read, and a malformed one is a one-line error (exit 2). The timer
adds max(timing.rerun_rel, the case's rerun_rel) when a model is in force (`NoiseModel.term`). No
torch import.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moebench.core.text import PACKAGE_ROOT as _REPO_ROOT
from moebench.core.text import read_bounded, safe_stem
from moebench.errors import SpecError, UsageError

# a model is a few KB per hundred cases; anything this big is the wrong file
MAX_MODEL_BYTES = 4 * 2**20


def default_text(floor: float) -> str:
    return f"default {100 * floor:.1f}%"


@dataclass(frozen=True)
class NoiseModel:
    """A measured model, as read: per case id its between-process half-width (relative)."""

    path: str  # as shown in records and pages (repository-relative when it lies in the repository)
    sha256: str
    device: str
    runs: int
    commit: str | None
    sweep: str | None
    cases: dict[str, float]
    method: dict = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        n = self.method.get("commits", 0) if isinstance(self.method, dict) else 0
        made = self.commit[:12] if self.commit else (f"{n} commits" if n else "commit unknown")
        return f"measured: {self.path} ({self.runs} runs, {made})"

    def term(self, case_id: str, floor: float) -> tuple[float, str]:
        """(the run-to-run half-width to add for this case, which one it is)."""
        v = self.cases.get(case_id)
        if v is None:
            return floor, f"{default_text(floor)} (case not in {self.path})"
        return max(floor, v), self.describe()


@dataclass(frozen=True)
class NoiseChoice:
    """What a run's `noise` setting resolved to: a model or none, and a note for the user."""

    setting: str
    model: NoiseModel | None = None
    note: str = ""

    def term(self, case_id: str, floor: float) -> tuple[float, str]:
        if self.model is None:
            return floor, default_text(floor)
        return self.model.term(case_id, floor)

    def provenance(self) -> dict:
        m = self.model
        d: dict[str, Any] = {"setting": self.setting, "path": None}
        if m is not None:
            d.update(path=m.path, sha256=m.sha256, device=m.device, runs=m.runs, commit=m.commit,
                     cases=len(m.cases), applied=m.describe())
        else:
            d["applied"] = "default (timing.rerun_rel)"
        if self.note:
            d["note"] = self.note
        return d


# ----------------------------------------------------------------------------------- reading


def setting_problem(v: Any) -> str | None:
    """What is wrong with a `timing.noise` value, or None."""
    if not isinstance(v, str) or not v.strip():
        return f"expected auto, none or the path of a noise model (.json), got {v!r}"
    return None


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _number(v: Any, path: Path, key: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise SpecError(path, key, f"expected a number between {lo:g} and {hi:g}, got {json.dumps(v)[:40]}")
    return float(v)


def load(path: Path, root: Path | None = None) -> NoiseModel:
    """Read a noise model file. Numbers and names only; anything else is a SpecError (exit 2)."""

    root = root or _REPO_ROOT
    data = read_bounded(path, MAX_MODEL_BYTES, "a noise model")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SpecError(path, "", f"not a noise model (JSON: {str(e).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict):
        raise SpecError(path, "", "not a noise model: expected an object with device, runs and cases")
    if "records" in doc and "provenance" in doc:
        raise SpecError(path, "", "a results file, not a noise model (scripts/repro.py calibrate writes one, e.g. "
                        "results/h200/noise/count-block.json)")
    dev = doc.get("device")
    if not isinstance(dev, str) or not dev:
        raise SpecError(path, "device", f"expected the GPU's name, got {json.dumps(dev)[:40]}")
    runs = doc.get("runs")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise SpecError(path, "runs", f"expected the number of runs (>= 2), got {json.dumps(runs)[:40]}")
    commit, sweep = doc.get("commit"), doc.get("sweep")
    for k, v in (("commit", commit), ("sweep", sweep)):
        if v is not None and not isinstance(v, str):
            raise SpecError(path, k, f"expected a string, got {json.dumps(v)[:40]}")
    cases = doc.get("cases")
    if not isinstance(cases, dict):
        raise SpecError(path, "cases", "expected an object {case_id: {rerun_rel: number, ...}}")
    terms = {}
    for cid, c in cases.items():
        if not isinstance(c, dict):
            raise SpecError(path, f"cases.{cid}", "expected an object with rerun_rel")
        terms[str(cid)] = _number(c.get("rerun_rel"), path, f"cases.{cid}.rerun_rel", 0.0, 1.0)
    method = doc.get("method") if isinstance(doc.get("method"), dict) else {}
    method = {k: v for k, v in method.items() if isinstance(v, (int, float, str))}
    commits = doc.get("commits")
    if isinstance(commits, list) and all(isinstance(c, str) for c in commits):
        method["commits"] = len(commits)  # a model measured over several commits names how many
    return NoiseModel(_shown(path, root), hashlib.sha256(data).hexdigest(), dev, runs, commit, sweep, terms, method)


def auto_path(sweep: Any, device_slug: Any, root: Path | None = None) -> Path | None:
    """results/<device_slug>/noise/<sweep>.json under the repository; None unless both names are one
    plain path component (safe_stem: a name read from a results file never leaves that folder)."""
    if not all(safe_stem(v) for v in (sweep, device_slug)):
        return None
    return (root or _REPO_ROOT) / "results" / device_slug / "noise" / f"{sweep}.json"


def resolve(setting: str, *, sweep: str | None, device_name: str, device_slug: str, timing=None,
            root: Path | None = None) -> NoiseChoice:
    """The model a run uses. `auto`: auto_path when it exists and was measured on `device_name`
    (another device's model is ignored, with a note); `none`: no model; else a path (relative to
    the working directory, then the repository root), used even when made on another device (noted).
    `timing`: the run's settings, to note a model made under other timing settings."""

    root = root or _REPO_ROOT
    if setting == "none":
        return NoiseChoice(setting)
    if setting == "auto":
        if not sweep:
            return NoiseChoice(setting, note="timing.noise auto: no sweep name to look a model up by")
        p = auto_path(sweep, device_slug, root)
        if p is None:
            return NoiseChoice(setting, note=f"timing.noise auto: sweep {str(sweep)[:40]!r} is not a plain name")
        if not p.exists():
            return NoiseChoice(setting)
        m = load(p, root)
        if m.device != device_name:
            return NoiseChoice(setting, note=f"{m.path} was measured on {m.device}, not {device_name}: ignored "
                                             "(the default run-to-run term applies)")
        return NoiseChoice(setting, m, _method_note(m, timing))
    p = Path(setting).expanduser()
    if not p.is_absolute() and not p.exists() and (root / p).exists():
        p = root / p
    if not p.exists():
        raise UsageError(f"{getattr(timing, _GIVEN_AS, 'timing.noise')}: {setting}: no such noise model file "
                         "(expected auto, none or a path)")
    m = load(p, root)
    note = _method_note(m, timing)
    if m.device != device_name:
        note = f"{m.path} was measured on {m.device}, not {device_name}; used as asked" + (f"; {note}" if note else "")
    return NoiseChoice(setting, m, note)


def _method_note(m: NoiseModel, timing) -> str:
    if timing is None or not m.method:
        return ""
    now = asdict(timing)
    diff = sorted(k for k, v in m.method.items() if k != "noise" and k in now and now[k] != v)
    return (f"{m.path} was measured under other timing settings ({', '.join(diff)})") if diff else ""


# The resolved choice rides on the Timing object (an attribute, not a dataclass field: the setting
# `noise` is what resume keys and provenance.timing record; the model's file and hash are recorded
# in provenance.noise_model). It pickles with the Timing to per-GPU workers.
_ATTR = "_noise_choice"


# Where the setting was given, for the error naming a missing model file: the spec's key
# (timing.noise), unless --timing set it (`given_as`). An attribute on the Timing, as the choice is.
_GIVEN_AS = "_noise_given_as"


def given_as(timing, where: str) -> None:
    setattr(timing, _GIVEN_AS, where)


def bind(timing, choice: NoiseChoice) -> NoiseChoice:
    setattr(timing, _ATTR, choice)
    return choice


def bound(timing) -> NoiseChoice | None:
    c = getattr(timing, _ATTR, None)
    return c if isinstance(c, NoiseChoice) and c.setting == getattr(timing, "noise", "auto") else None


def apply(spec, device) -> NoiseChoice:
    """Resolve the spec's timing.noise for `device` and bind it to spec.timing (what the Timer reads)."""
    return bind(spec.timing, resolve(spec.timing.noise, sweep=spec.name, device_name=device.name,
                                     device_slug=device.slug, timing=spec.timing))


def for_timer(timing, device) -> NoiseChoice:
    """The choice a Timer uses: the bound one; else an explicit path (or none) resolved here; else
    (auto, unbound: a command that did not resolve it) no model."""
    c = bound(timing)
    if c is not None:
        return c
    setting = getattr(timing, "noise", "auto")
    if setting == "auto" or device is None:
        return NoiseChoice(setting, note="auto: not resolved by this command" if setting == "auto" else "")
    return bind(timing, resolve(setting, sweep=None, device_name=device.name, device_slug=device.slug,
                                timing=timing))


# ----------------------------------------------------------------------------------- the term


def within_part(rel: float, within: float | None, rerun: float | None) -> float:
    """The within-run part of a stated half-width `rel`: `within` where recorded, else `rel` less its
    run-to-run term `rerun` in quadrature (the timer adds them in quadrature)."""
    if within is not None:
        return within
    rerun = rerun or 0.0
    return math.sqrt(max(0.0, rel * rel - rerun * rerun))


def restated(rel: float, within: float | None, rerun: float | None, model: NoiseModel, case_id: str) -> float:
    """A stated relative half-width re-stated with `model`, as the timer states it when the model is
    in force: the within-run part (within_part) with max(`rerun`, the model's term for the case) in
    quadrature."""
    within = within_part(rel, within, rerun)
    rerun = rerun or 0.0
    term, _ = model.term(case_id, rerun)
    return math.hypot(within, term)


def page_line(prov: dict, records: list) -> str | None:
    """The sweep page's line on the run-to-run term: the model (file, runs, commit) or the default,
    and how many cases the model did not cover. None for a run that was not timed."""
    timed = [r for r in records if r.timing.get("median_us") is not None]
    if not timed:
        return None
    nm = prov.get("noise_model")
    floor = (prov.get("timing") or {}).get("rerun_rel") or 0
    if not isinstance(nm, dict):
        return (f"- Noise model: none recorded (made before measured models): a {100 * floor:.1f}% run-to-run term"
                if floor else "- Noise model: none recorded; no run-to-run term")
    if not nm.get("path"):
        why = f" ({nm['note']})" if nm.get("note") else ""
        return (f"- Noise model: {default_text(floor)} run-to-run term (timing.noise {nm.get('setting')}: no measured "
                f"model{why})")
    missing = sum(1 for r in timed if "case not in" in str(r.timing.get("noise_model", "")))
    line = (f"- Noise model: {nm.get('applied')}, sha256 {str(nm.get('sha256'))[:12]}: per case the larger of "
            f"{100 * floor:.1f}% and its measured between-process half-width, in quadrature")
    if missing:
        line += f"; {missing} of {len(timed)} cases are not in it and carry the {default_text(floor)} term"
    if nm.get("note"):
        line += f" ({nm['note']})"
    return line

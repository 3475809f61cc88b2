"""When two runs' numbers may be set side by side (`differences`, `check_comparable`) and which
half-width a record may claim (`file_noise`), as docs/gate.md states it: one rule for `compare`,
`history`, `merge` and `recommend --check`. A record's run-to-run term is its verified model's for the
case (`named`), never below timing.rerun_rel, else assumed: its own, capped at rerun_rel and ASSUMED_MAX."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from moebench.core import noise as N
from moebench.core.text import slugify
from moebench.errors import UsageError

# Timer settings that decide how long a measurement runs, or only the half-width it states (rerun_rel,
# noise: the run-to-run term and the model it comes from), not what it measures. Every other key of the
# timer settings (l2, groups, placements, launches per graph, placement memory, ...) changes the number.
NOISE_ONLY = frozenset({"warmup", "min_replays", "max_replays", "max_seconds", "target_rel_noise", "clock_drop",
                        "clock_retries", "rerun_rel", "noise"})
DEVICE_KEYS = ("name", "backend", "sm_count")
# compared where both runs state it (a MIG slice or another board of one name can have another L2)
DEVICE_KEYS_STATED = ("l2_bytes",)
# rel_noise and hypot(rel_noise_within, rerun_rel) must agree within this (absolute): each is stated
# rounded to 5 decimals, so a record as the timer writes it is off by 1.5e-5 at most
PARTS_TOLERANCE = 1e-4
# An assumed run-to-run term (not a measured model's) counts for no more than timing.rerun_rel's
# default: a wider spread must be measured (scripts/repro.py calibrate), not stated
ASSUMED_MAX = 0.005


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def settings_of(prov: dict) -> dict:
    """{device, timing, switches} of a run: provenance.device and .timing where the file has them
    (a results file), else provenance.settings.device and .timing (a stream's header); the kill
    switches from provenance.settings. Of its own result it returns the same."""
    s = _dict(prov.get("settings"))
    return {"device": _dict(prov.get("device")) or _dict(s.get("device")),
            "timing": _dict(prov.get("timing")) or _dict(s.get("timing")),
            "switches": _dict(s.get("switches")) or _dict(prov.get("switches"))}


@dataclass
class Differences:
    device: list[str] = field(default_factory=list)
    number: list[str] = field(default_factory=list)  # settings that change the number
    noise_only: list[str] = field(default_factory=list)


def differences(a: dict, b: dict) -> Differences:
    """What tells the runs of two provenances apart (settings_of each), as `key: a -> b` phrases."""
    sa, sb = settings_of(a), settings_of(b)
    out = Differences()
    da, db = sa["device"], sb["device"]
    out.device = [f"{k} {da.get(k)!r} -> {db.get(k)!r}" for k in DEVICE_KEYS + DEVICE_KEYS_STATED
                  if da.get(k) != db.get(k) and (k in DEVICE_KEYS or (k in da and k in db))]
    ta, tb = sa["timing"], sb["timing"]
    for k in sorted(set(ta) | set(tb)):
        if ta.get(k) != tb.get(k):
            (out.noise_only if k in NOISE_ONLY else out.number).append(
                f"{k}: {ta.get(k, 'absent')!r} -> {tb.get(k, 'absent')!r}")
    wa, wb = sa["switches"], sb["switches"]
    out.number += [f"${k}: {wa.get(k)!r} -> {wb.get(k)!r}" for k in sorted(set(wa) | set(wb)) if wa.get(k) != wb.get(k)]
    return out


def _device_text(d: dict) -> str:
    """"NVIDIA H200 (132 SMs)", or what is missing of it."""
    if not d.get("name"):
        return "a device the file does not name (no provenance.device.name)"
    return f"{d['name']} ({d.get('sm_count', 'unknown')} SMs)"


def check_comparable(pb: dict, pn: dict, *, allow_settings: bool = False, allow_device: bool = False) -> list[str]:
    """Refuse (UsageError, exit 2) two runs timed on different devices or under settings that change
    the numbers, unless allowed; returns notes on what was allowed to differ."""
    diff, notes = differences(pb, pn), []
    db, dn = settings_of(pb)["device"], settings_of(pn)["device"]
    if diff.device:
        what = f"BASE ran on {_device_text(db)}, NEW on {_device_text(dn)}"
        what += "".join(f", {d}" for d in diff.device if d.startswith(DEVICE_KEYS_STATED))
        if not allow_device:
            raise UsageError(f"{what}: times of two devices are no gate; pass --allow-device to compare them anyway "
                             "(--cycles compares in clock cycles)")
        notes.append(f"{what}: a cross-device comparison (--allow-device)")
    elif db.get("uuid") and dn.get("uuid") and db["uuid"] != dn["uuid"]:
        notes.append(f"BASE and NEW ran on two GPUs of one model ({str(db['uuid'])[:12]}, "
                     f"{str(dn['uuid'])[:12]}): a kernel can time differently on two of them every time (measured on "
                     "H200s: results/h200/TIMER.md, \"Four more hosts\"); each file's noise model covers that only "
                     "where it was measured across GPUs")
    if diff.number:
        what = "the two runs were timed under other settings (" + "; ".join(diff.number) + ")"
        if not allow_settings:
            raise UsageError(f"{what}: their numbers measure different things; pass --allow-settings to compare them "
                             "anyway")
        notes.append(f"{what} (--allow-settings)")
    return notes


# ============================================================================ stated noise


@dataclass(frozen=True)
class Noise:
    """The half-width a record is judged by: hypot(within, term)."""

    rel: float
    within: float
    term: float  # the run-to-run term
    measured: bool  # the term is a measured model's for this case


def _part(t: dict, key: str) -> float | None:
    v = t.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"timing.{key} is {v!r}; a half-width is a number >= 0")
    return float(v)


def record_noise(t: dict, case_id: str, model: N.NoiseModel | None, cap: float) -> Noise | None:
    """A record's judged half-width (see the module docstring); None when it states no rel_noise or
    no run-to-run term; ValueError when a part is not a number >= 0 or the parts disagree."""
    rel, within, rerun = (_part(t, k) for k in ("rel_noise", "rel_noise_within", "rerun_rel"))
    if rel is None or rerun is None:
        return None
    if within is None:
        within = N.within_part(rel, None, rerun)
    elif abs(rel - math.hypot(within, rerun)) > PARTS_TOLERANCE:
        raise ValueError(f"rel_noise {rel:g} is not hypot(rel_noise_within {within:g}, rerun_rel {rerun:g}) = "
                         f"{math.hypot(within, rerun):.5f} (tolerance {PARTS_TOLERANCE:g})")
    m = model.cases.get(case_id) if model is not None else None
    term = max(cap, m) if m is not None else min(rerun, cap)
    return Noise(math.hypot(within, term), within, term, m is not None)


@dataclass
class FileNoise:
    """Per case id of one file, the judged half-width (None: not judged), and what a reader must know."""

    by_case: dict[str, Noise | None]
    model: str  # the model in force, in words
    notes: list[str] = field(default_factory=list)
    sha256: str | None = None  # of the named model, when verified

    def restate(self, model: N.NoiseModel | None, why: str) -> None:
        """Widen each term to `model`'s for its case (max of the two), as the timer states it with the model."""
        if model is None or model.sha256 == self.sha256:
            return
        n = 0
        for cid, x in self.by_case.items():
            m = model.cases.get(cid)
            if x is not None and m is not None:
                self.by_case[cid] = Noise(math.hypot(x.within, max(x.term, m)), x.within, max(x.term, m), True)
                n += 1
        self.model += f"; re-stated with {model.describe()} ({why}) for {n} records"

    def describe(self) -> str:
        xs = list(self.by_case.values())
        measured, assumed = sum(bool(x and x.measured) for x in xs), sum(bool(x and not x.measured) for x in xs)
        return (f"{self.model}: {measured} of {len(xs)} records with a measured run-to-run term, {assumed} with an "
                f"assumed one (at most {100 * ASSUMED_MAX:g}%), {len(xs) - measured - assumed} state none (not judged)")


def named(nm: Any, results: Path | None) -> tuple[N.NoiseModel | None, str]:
    """The model a results file names (provenance.noise_model: path and sha256), read as data and
    verified: a relative path without `..`, inside the repository's results/ folder or the results
    file's own folder; its bytes must hash to the sha256 named, else the archived copy beside it
    (archive/<stem>-<sha256[:12]>.json) that does. (None, why) when none is named ('') or it cannot
    be verified."""
    root = N._REPO_ROOT.resolve()
    if not isinstance(nm, dict) or nm.get("path") is None:
        return None, ""
    text, sha = nm.get("path"), nm.get("sha256")
    if not isinstance(text, str) or not isinstance(sha, str) or Path(text).is_absolute() or ".." in Path(text).parts:
        return None, (f"provenance.noise_model names {str(text)[:80]!r} (sha256 {str(sha)[:12]}): not a relative path "
                      "inside the repository's results/ or the file's folder; no model used")
    places = [(root / "results", root / text)] + ([(results.parent.resolve(), results.parent / text)] if results else [])
    for inside, p in places:
        p = p.resolve()
        if not p.is_relative_to(inside):
            continue
        for q in (p, p.parent / "archive" / f"{p.stem}-{sha[:12]}.json"):
            if q.is_file() and q.stat().st_size <= N.MAX_MODEL_BYTES and \
                    hashlib.sha256(q.read_bytes()).hexdigest() == sha:
                return N.load(q, root), ""
    return None, (f"provenance.noise_model names {text} with sha256 {sha[:12]}, and no such file holds those bytes "
                  "(in the repository's results/ or the file's folder, or archived beside it): its model is not "
                  "here, no model used")


def file_noise(prov: dict, records: Sequence[Any], source: Path | str | None, *, name: str = "",
               allow_foreign: bool = False) -> FileNoise:
    """The judged half-width of every timed record of a file (record_noise), with its named model
    verified (`named`); UsageError (exit 2) for a record whose noise is malformed.
    `source`: the file's path (a model may lie next to it); `name`: how messages call the file."""
    name = name or str(source or "the file")
    model, why = named(prov.get("noise_model"), Path(source) if source else None)
    notes = [f"{name}: {why}"] if why else []
    if model is not None and (bad := foreign(model, prov)):
        notes.append(f"{name}: its noise model {model.path} {bad}: " + ("used as asked (--allow-foreign-model)" if
                     allow_foreign else "not used (--allow-foreign-model uses it)"))
        model = model if allow_foreign else None
    floor = settings_of(prov)["timing"].get("rerun_rel")
    cap = min(float(floor), ASSUMED_MAX) if isinstance(floor, (int, float)) and floor >= 0 else ASSUMED_MAX
    out, moved = {}, []
    for r in records:
        if r.status != "ok" or r.timing.get("median_us") is None:
            continue
        try:
            x = out[r.case_id] = record_noise(r.timing, r.case_id, model, cap)
        except ValueError as e:
            raise UsageError(f"{name}: case {r.case_id} ({r.label}): {e}; a stated noise is checked, not "
                             "trusted") from None
        if x is not None and abs(float(r.timing["rerun_rel"]) - x.term) > PARTS_TOLERANCE:
            moved.append(f"{r.case_id} {100 * float(r.timing['rerun_rel']):.3g}% -> {100 * x.term:.3g}%")
    if moved:
        notes.append(f"{name}: {len(moved)} records state a run-to-run term other than "
                     + (f"their noise model's ({model.path})" if model else
                        f"an assumed one may be (timing.rerun_rel, at most {100 * ASSUMED_MAX:g}%)")
                     + f"; judged with that (e.g. {moved[0]})")
    text = f"measured model {model.path} (sha256 {model.sha256[:12]})" if model else "no verified noise model"
    return FileNoise(out, text, notes, model.sha256 if model else None)


def foreign(model: N.NoiseModel, prov: dict) -> str:
    """Why `model` is not one for the runs of `prov` (another device or sweep), or ''."""
    dev, sweep = settings_of(prov)["device"].get("name"), prov.get("sweep")
    if dev and model.device != dev:
        return f"was measured on {model.device}, not {dev}"
    if model.sweep and sweep and model.sweep != sweep:
        return f"is the model of sweep {model.sweep!r}, not {sweep!r}"
    return ""


def model_for(setting: str, prov: dict, *, allow_foreign: bool = False) -> tuple[N.NoiseModel | None, str]:
    """The model `--noise SETTING` names for the runs of `prov`, and a line on what was used: auto, the
    repository's results/<device>/noise/<sweep>.json for its device (none when there is none); none;
    else a model file, refused (UsageError) when measured on another device or for another sweep,
    unless `allow_foreign` (then said)."""
    if setting == "none":
        return None, ""
    dev = settings_of(prov)["device"].get("name")
    if setting == "auto":
        if not isinstance(dev, str) or not dev:
            return None, "no device named: no noise model looked up"
        choice = N.resolve("auto", sweep=prov.get("sweep"), device_name=dev, device_slug=slugify(dev))
        return choice.model, (choice.note or "")
    model = N.load(Path(setting))
    bad = foreign(model, prov)
    if bad and not allow_foreign:
        raise UsageError(f"--noise: {setting} {bad}; a model of another device or sweep does not describe these "
                         "runs (--allow-foreign-model uses it anyway)")
    return model, (f"--noise: {setting} {bad}: used as asked (--allow-foreign-model)" if bad else "")

"""Sweep specs: YAML -> a validated, typed `Spec`. No torch import.

Every error names the file, the key path and what was expected, e.g.
``sweeps/x.yaml: axes.block_size[2]: must be a power of two, got 96``.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moebench.errors import SpecError
from moebench.expr import ExprError, compile_expr
from moebench.families import FamilySpec, catalogue

PACKAGE_ROOT = Path(__file__).resolve().parent.parent

# A spec is a page of YAML; anything this big is the wrong file (and reading /dev/zero never ends).
MAX_SPEC_BYTES = 4 * 2**20
# Values end up as kernel arguments and tensor sizes: they must fit a signed 64-bit integer.
INT64_MAX = 2**63 - 1
# Sweep names become result file names: no path separators, no surprises in a shell.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

TOP_KEYS = {
    "name": "sweep name (string)",
    "family": "kernel family",
    "description": "free text",
    "model": "model config name (configs/NAME.yaml)",
    "variants": "list of variant names or {variant, label, params, axes}",
    "baseline": "{variant: NAME, PARAM: VALUE...}: the launch every variant must equal bit-exactly",
    "axes": "PARAM: [values...] (cartesian product)",
    "zip": "list of {PARAM: [values...]} groups whose lists advance together",
    "fixed": "PARAM: value",
    "where": "filter expression(s) over parameters",
    "quick": "overrides for the CI smoke shape: axes, zip, fixed, where, variants",
    "pivot": "{rows: PARAM, cols: PARAM, metric: COLUMN}",
    "timing": "timer settings",
    "seed": "default input seed",
    "verify": "correctness matrix: axes, zip, fixed, where, variants, quick",
    "max_cases": "refuse to expand past this many cases without --force",
}

MODEL_KEYS = ("name", "num_experts", "topk", "hidden", "moe_ffn", "moe_layers", "ep", "local_experts")

TIMING_KEYS: dict[str, tuple[type, float | None, float | None]] = {
    # key: (type, min, max)
    "launches_per_graph": (int, 1, 10000),
    "warmup": (int, 0, 10000),
    "min_replays": (int, 3, 1_000_000),
    "max_replays": (int, 3, 1_000_000),
    "max_seconds": (float, 0.001, 3600),
    "target_rel_noise": (float, 0.0, 1.0),
    "l2": (str, None, None),
    "cold_l2_multiple": (float, 1.0, 100.0),
    "clock_drop": (float, 0.0, 1.0),
    "placements": (int, 1, 64),
}
L2_MODES = ("warm", "cold")
# the keys a matrix may have at each level (the top level is checked against TOP_KEYS)
MATRIX_KEYS = ("axes", "zip", "fixed", "where", "variants")


@dataclass
class Timing:
    launches_per_graph: int = 50
    warmup: int = 5
    min_replays: int = 40
    max_replays: int = 4000
    max_seconds: float = 1.0
    target_rel_noise: float = 0.005
    l2: str = "warm"
    cold_l2_multiple: float = 3.0
    clock_drop: float = 0.9  # flag a case whose SM clock ended below this fraction of max
    placements: int = 8  # warm L2: independently allocated input/output sets rotated per graph


@dataclass
class VariantEntry:
    variant: str
    label: str
    params: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, list] = field(default_factory=dict)


@dataclass
class Matrix:
    """What expands into cases: the sweep itself, its quick override, or the verify matrix."""

    variants: list[VariantEntry]
    axes: dict[str, list]
    zips: list[dict[str, list]]
    fixed: dict[str, Any]
    where: list[str]


@dataclass
class Spec:
    path: Path
    name: str
    family: FamilySpec
    description: str
    model_name: str | None
    model: dict[str, Any]
    baseline: dict[str, Any] | None
    sweep: Matrix
    quick: Matrix
    verify: Matrix | None
    verify_quick: Matrix | None
    pivot: dict[str, str]
    timing: Timing
    seed: int
    max_cases: int
    sha256: str
    raw: dict = field(repr=False, default_factory=dict)

    def matrix(self, *, quick: bool = False, verify: bool = False) -> Matrix:
        if verify:
            if self.verify is None:
                raise SpecError(self.path, "verify", "this spec has no verify matrix")
            return self.verify_quick if (quick and self.verify_quick) else self.verify
        return self.quick if quick else self.sweep


# ----------------------------------------------------------------------------------- resolving


def resolve_spec_path(name_or_path: str, root: Path | None = None) -> Path:
    """NAME -> sweeps/NAME.yaml (cwd first, then the project root); a path is taken as is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path or _exists(p):
        return p
    for base in ([root] if root else []) + [Path.cwd(), PACKAGE_ROOT]:
        cand = base / "sweeps" / f"{name_or_path}.yaml"
        if _exists(cand):
            return cand
    known = sorted({q.stem for base in (Path.cwd(), PACKAGE_ROOT) for q in (base / "sweeps").glob("*.yaml")})
    raise SpecError(f"sweeps/{name_or_path}.yaml", "", "no such sweep; built-in sweeps: "
                    + (", ".join(known) or "none") + _did_you_mean(name_or_path, known))


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def builtin_sweeps() -> list[Path]:
    seen: dict[str, Path] = {}
    for base in (PACKAGE_ROOT, Path.cwd()):
        for q in sorted((base / "sweeps").glob("*.yaml")):
            seen.setdefault(q.stem, q)
    return [seen[k] for k in sorted(seen)]


def builtin_models() -> list[Path]:
    seen: dict[str, Path] = {}
    for base in (PACKAGE_ROOT, Path.cwd()):
        for q in sorted((base / "configs").glob("*.yaml")):
            seen.setdefault(q.stem, q)
    return [seen[k] for k in sorted(seen)]


def read_yaml(path: Path) -> tuple[Any, bytes]:
    try:
        if not path.exists():
            raise SpecError(path, "", "no such file")
        if path.is_dir():
            raise SpecError(path, "", "is a directory, expected a YAML file")
        if not path.is_file():
            raise SpecError(path, "", "not a regular file, expected a YAML file")
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError(path, "", f"{path.stat().st_size} bytes is too large for a spec "
                            f"(at most {MAX_SPEC_BYTES}); is this the right file?")
        data = path.read_bytes()
    except OSError as e:
        raise SpecError(path, "", f"cannot read: {e.strerror or e}") from None
    except ValueError as e:  # e.g. an embedded NUL byte in the path
        raise SpecError(path, "", f"cannot read: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(path, "", f"not UTF-8 text (bad byte at offset {e.start})") from None
    return parse_yaml(text, path), data


class _SpecYamlLoader(yaml.SafeLoader):
    """The safe loader, with a line number on values YAML itself cannot build (2024-13-01, !!int x)."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError) as e:
            shown = repr(node.value)[:40] if isinstance(node, yaml.ScalarNode) else node.tag
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown} as {node.tag.rsplit(':', 1)[-1]}: {e}", node.start_mark) from None


def parse_yaml(text: str, path: Path) -> Any:
    """One YAML document -> Python values. Duplicate keys and self-referencing aliases are errors
    (PyYAML would keep the last duplicate silently and build a cyclic value)."""
    loader = _SpecYamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, "", set(), set(), path)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(path, "", f"invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise SpecError(path, "", "invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_nodes(node: yaml.Node, key: str, active: set[int], done: set[int], path: Path) -> None:
    if id(node) in active:
        raise SpecError(path, key, "an alias refers to a value that contains it (a cycle)")
    if id(node) in done:  # an alias to a value already checked: once is enough (and keeps this linear)
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            sub = f"{key}.{name}" if key else str(name)
            if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG:
                ident = (k.tag, k.value)
                if ident in lines:
                    raise SpecError(path, sub, f"key given twice (lines {lines[ident]} and "
                                    f"{k.start_mark.line + 1}); keep one")
                lines[ident] = k.start_mark.line + 1
            _check_nodes(k, sub, active, done, path)
            _check_nodes(v, sub, active, done, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _check_nodes(v, f"{key}[{i}]", active, done, path)
    active.discard(id(node))
    done.add(id(node))


def load_model(name: str, spec_path: Path) -> tuple[dict[str, Any], bytes]:
    known = [p.stem for p in builtin_models()]
    if not NAME_RE.fullmatch(name):
        raise SpecError(spec_path, "model", f"expected a model config name (configs/NAME.yaml), got {name!r}; "
                        f"known: {', '.join(known) or 'none'}")
    cands = [spec_path.resolve().parent.parent / "configs" / f"{name}.yaml",
             Path.cwd() / "configs" / f"{name}.yaml", PACKAGE_ROOT / "configs" / f"{name}.yaml"]
    path = next((c for c in cands if c.exists()), None)
    if path is None:
        raise SpecError(spec_path, "model", f"unknown model config {name!r}; known: "
                        f"{', '.join(known) or 'none'}{_did_you_mean(name, known)}")
    doc, data = read_yaml(path)
    if not isinstance(doc, dict):
        raise SpecError(path, "", f"expected a mapping of model values, got {_kind(doc)}")
    for k, v in doc.items():
        if k not in MODEL_KEYS:
            raise SpecError(path, str(k), f"unknown model key; expected one of {', '.join(MODEL_KEYS)}"
                            + _did_you_mean(k, MODEL_KEYS))
        if k == "name":
            if not isinstance(v, str):
                raise SpecError(path, k, f"expected a string, got {_show(v)}")
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= INT64_MAX:
            raise SpecError(path, str(k), f"expected a positive integer, got {_show(v)}")
    return doc, data


# ----------------------------------------------------------------------------------- loading


def _kind(v: Any) -> str:
    if v is None:
        return "nothing (empty)"
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer",
            float: "a number", bool: "a boolean"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    """A value as a short phrase for a message: scalars as written, containers by kind."""
    if v is None or isinstance(v, (dict, list, set, tuple)):
        return _kind(v) if not isinstance(v, (list, dict)) or v else f"an empty {_kind(v)[2:]}"
    if isinstance(v, bool):
        return str(v).lower()
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _did_you_mean(word: Any, choices) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Loader:
    def __init__(self, path: Path, family: FamilySpec | None = None):
        self.path = path
        self.family = family

    def fail(self, key: str, msg: str):
        raise SpecError(self.path, key, msg)

    def mapping(self, v: Any, key: str) -> dict:
        if not isinstance(v, dict):
            self.fail(key, f"expected a mapping, got {_kind(v)}")
        for k in v:
            if not isinstance(k, str):
                self.fail(key, f"keys must be strings, got {k!r}")
        return v

    def keys(self, d: dict, key: str, allowed: dict | tuple) -> None:
        for k in d:
            if k not in allowed:
                sub = f"{key}.{k}" if key else k
                self.fail(sub, f"unknown key; expected one of {', '.join(allowed)}")

    def string(self, v: Any, key: str) -> str:
        if not isinstance(v, str) or not v.strip():
            self.fail(key, f"expected a non-empty string, got {_kind(v)}")
        return v

    def param_name(self, name: str, key: str) -> None:
        if name not in self.family.params:
            self.fail(key, f"unknown parameter of family {self.family.name!r}; expected one of "
                      f"{', '.join(self.family.params)}")

    def value(self, name: str, v: Any, key: str) -> Any:
        self.param_name(name, key)
        p = self.family.params[name]
        if p.type is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        problem = p.check(v)
        if problem:
            self.fail(key, problem)
        return v

    def axes(self, v: Any, key: str) -> dict[str, list]:
        v = self.mapping(v, key)
        out = {}
        for name, vals in v.items():
            k = f"{key}.{name}"
            self.param_name(name, k)
            if not isinstance(vals, list):
                vals = [vals]
            if not vals:
                self.fail(k, "expected a non-empty list of values")
            out[name] = [self.value(name, x, f"{k}[{i}]") for i, x in enumerate(vals)]
            if len(set(map(repr, out[name]))) != len(out[name]):
                self.fail(k, f"repeated values in {out[name]}")
        return out

    def fixed(self, v: Any, key: str) -> dict[str, Any]:
        v = self.mapping(v, key)
        return {name: self.value(name, x, f"{key}.{name}") for name, x in v.items()}

    def zips(self, v: Any, key: str) -> list[dict[str, list]]:
        if not isinstance(v, list):
            self.fail(key, f"expected a list of {{PARAM: [values]}} groups, got {_kind(v)}")
        out = []
        for i, g in enumerate(v):
            k = f"{key}[{i}]"
            grp = self.axes(g, k)
            if not grp:
                self.fail(k, "expected at least one parameter")
            lens = {len(x) for x in grp.values()}
            if len(lens) != 1:
                self.fail(k, f"lists must have equal lengths to zip, got {sorted(lens)}")
            out.append(grp)
        return out

    def where(self, v: Any, key: str) -> list[str]:
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list):
            self.fail(key, f"expected an expression or a list of them, got {_kind(v)}")
        for i, e in enumerate(items):
            try:
                compile_expr(e, self.family.params)
            except ExprError as err:
                self.fail(f"{key}[{i}]" if isinstance(v, list) else key, str(err))
        return list(items)

    def variants(self, v: Any, key: str) -> list[VariantEntry]:
        if not isinstance(v, list) or not v:
            self.fail(key, f"expected a non-empty list of variants, got {_kind(v)}")
        out, labels = [], set()
        for i, item in enumerate(v):
            k = f"{key}[{i}]"
            if isinstance(item, str):
                item = {"variant": item}
            item = self.mapping(item, k)
            self.keys(item, k, ("variant", "label", "params", "axes"))
            if "variant" not in item:
                self.fail(f"{k}.variant", "missing; name a variant of family "
                          f"{self.family.name!r}: {', '.join(self.family.variants)}")
            name = self.string(item["variant"], f"{k}.variant")
            if name not in self.family.variants:
                self.fail(f"{k}.variant", f"unknown variant {name!r}; family {self.family.name!r} has "
                          f"{', '.join(self.family.variants)}")
            label = self.string(item.get("label", name), f"{k}.label")
            if label in labels:
                self.fail(f"{k}.label", f"label {label!r} used twice; give each entry its own label")
            labels.add(label)
            params = self.fixed(item.get("params", {}) or {}, f"{k}.params")
            axes = self.axes(item.get("axes", {}) or {}, f"{k}.axes")
            vs = self.family.variants[name]
            for pname in list(params) + list(axes):
                p = self.family.params[pname]
                if p.role == "launch" and pname not in vs.params:
                    self.fail(f"{k}", f"variant {name!r} does not take {pname!r}; it takes "
                              f"{', '.join(vs.params) or 'no launch parameters'}")
            out.append(VariantEntry(name, label, params, axes))
        return out

    def matrix(self, d: dict, key: str, base: Matrix | None) -> Matrix:
        pre = f"{key}." if key else ""
        if key:
            self.keys(d, key, ("axes", "zip", "fixed", "where", "variants", "quick"))
        variants = self.variants(d["variants"], pre + "variants") if "variants" in d else (
            base.variants if base else None)
        axes = self.axes(d.get("axes") or {}, pre + "axes") if "axes" in d else {}
        zips = self.zips(d["zip"], pre + "zip") if "zip" in d else None
        fixed = self.fixed(d.get("fixed") or {}, pre + "fixed") if "fixed" in d else {}
        where = self.where(d["where"], pre + "where") if "where" in d else None
        # within one level a parameter is set in one place only
        seen: dict[str, str] = {}
        groups = [("axes", axes), ("fixed", fixed)] + [(f"zip[{i}]", z) for i, z in enumerate(zips or [])]
        for src, names in groups:
            for n in names:
                if n in seen:
                    self.fail(f"{pre}{src}.{n}", f"{n!r} is also set in {pre}{seen[n]}")
                seen[n] = src
        if base is not None:
            # this level overrides the base: a name it sets, in any form, replaces the base's setting
            own = set(seen)
            zip_names = {n for z in (zips or []) for n in z}
            axes = {**{k: v for k, v in base.axes.items() if k not in own}, **axes}
            fixed = {**{k: v for k, v in base.fixed.items() if k not in own}, **fixed}
            if zips is None:
                zips = [z for z in base.zips if not (set(z) & own)]
            elif base.zips and not zip_names:
                zips = list(base.zips)
            where = base.where if where is None else where
        return Matrix(variants=variants, axes=axes, zips=zips or [], fixed=fixed, where=where or [])

def load_spec(name_or_path: str) -> Spec:
    path = resolve_spec_path(name_or_path)
    doc, data = read_yaml(path)
    L = _Loader(path)
    if doc is None:
        L.fail("", "empty file; a sweep spec needs at least name, family and variants")
    if not isinstance(doc, dict):
        L.fail("", f"expected a mapping at the top level, got {_kind(doc)}")
    L.mapping(doc, "")
    L.keys(doc, "", TOP_KEYS)
    for req in ("name", "family", "variants"):
        if req not in doc:
            L.fail(req, f"missing; {TOP_KEYS[req]} is required")
    name = L.string(doc["name"], "name")
    fam_name = L.string(doc["family"], "family")
    cat = catalogue()
    if fam_name not in cat:
        L.fail("family", f"unknown family {fam_name!r}; known: {', '.join(cat)}")
    family = cat[fam_name]
    L.family = family
    description = doc.get("description", "") or ""
    if not isinstance(description, str):
        L.fail("description", f"expected a string, got {_kind(description)}")

    h = hashlib.sha256(data)
    model, model_name = {}, None
    if "model" in doc:
        model_name = L.string(doc["model"], "model")
        model, mdata = load_model(model_name, path)
        h.update(mdata)

    seed = doc.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        L.fail("seed", f"expected a non-negative integer, got {seed!r}")

    max_cases = doc.get("max_cases", 5000)
    if isinstance(max_cases, bool) or not isinstance(max_cases, int) or max_cases < 1:
        L.fail("max_cases", f"expected a positive integer, got {max_cases!r}")

    sweep = L.matrix(doc, "", None)
    quick_doc = L.mapping(doc.get("quick") or {}, "quick") if "quick" in doc else {}
    if "quick" in quick_doc:
        L.fail("quick.quick", "unknown key; expected one of axes, zip, fixed, where, variants")
    quick = L.matrix(quick_doc, "quick", sweep) if quick_doc else sweep

    verify = verify_quick = None
    if "verify" in doc:
        vdoc = L.mapping(doc["verify"] or {}, "verify")
        verify = L.matrix(vdoc, "verify", Matrix(sweep.variants, {}, [], dict(sweep.fixed), []))
        if "quick" in vdoc:
            verify_quick = L.matrix(L.mapping(vdoc["quick"] or {}, "verify.quick"), "verify.quick", verify)

    baseline = None
    if "baseline" in doc:
        b = dict(L.mapping(doc["baseline"], "baseline"))
        if "variant" not in b:
            L.fail("baseline.variant", f"missing; name a variant of {family.name!r}: {', '.join(family.variants)}")
        vname = L.string(b.pop("variant"), "baseline.variant")
        if vname not in family.variants:
            L.fail("baseline.variant", f"unknown variant {vname!r}; family {family.name!r} has "
                   f"{', '.join(family.variants)}")
        params = {}
        for k, v in b.items():
            params[k] = L.value(k, v, f"baseline.{k}")
            if family.params[k].role != "launch" or k not in family.variants[vname].params:
                L.fail(f"baseline.{k}", f"the baseline may set only launch parameters of {vname!r}: "
                       f"{', '.join(family.variants[vname].params) or 'none'}")
        baseline = {"variant": vname, **params}
    elif not family.host_only:
        L.fail("baseline", "missing; name the launch every variant must equal bit-exactly, "
               "e.g. {variant: persistent, block_size: 1024}")

    pivot = dict(family.default_pivot)
    if "pivot" in doc:
        pv = L.mapping(doc["pivot"], "pivot")
        L.keys(pv, "pivot", ("rows", "cols", "metric"))
        for k, v in pv.items():
            pivot[k] = L.string(v, f"pivot.{k}")
        for k in ("rows", "cols"):
            if k in pivot and pivot[k] not in family.params and pivot[k] not in ("variant", "label"):
                L.fail(f"pivot.{k}", f"expected a parameter of {family.name!r} or 'label'; "
                       f"got {pivot[k]!r}")

    timing = Timing()
    if "timing" in doc:
        t = L.mapping(doc["timing"], "timing")
        L.keys(t, "timing", TIMING_KEYS)
        for k, v in t.items():
            typ, lo, hi = TIMING_KEYS[k]
            key = f"timing.{k}"
            if typ is str:
                if v not in L2_MODES:
                    L.fail(key, f"expected one of {', '.join(L2_MODES)}, got {v!r}")
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or (typ is int and not isinstance(v, int)):
                    L.fail(key, f"expected {'an integer' if typ is int else 'a number'}, got {v!r}")
                if (lo is not None and v < lo) or (hi is not None and v > hi):
                    L.fail(key, f"must be between {lo:g} and {hi:g}, got {v}")
            setattr(timing, k, typ(v))
        if timing.max_replays < timing.min_replays:
            L.fail("timing.max_replays", f"must be >= min_replays ({timing.min_replays}), got {timing.max_replays}")

    return Spec(path=path, name=name, family=family, description=description, model_name=model_name,
                model=model, baseline=baseline, sweep=sweep, quick=quick, verify=verify,
                verify_quick=verify_quick, pivot=pivot, timing=timing, seed=seed, max_cases=max_cases,
                sha256=h.hexdigest(), raw=doc)

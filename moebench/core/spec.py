"""Sweep specs: YAML -> a validated, typed `Spec`. No torch import.

Every error names the file, the key path and what was expected, e.g.
``sweeps/x.yaml: axes.block_size[2]: must be a power of two, got 96``.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from moebench.core.expr import ExprError, compile_expr
from moebench.core.text import PACKAGE_ROOT, kind, read_bounded, safe_stem, show
from moebench.core.family import FamilySpec, broken, catalogue, family_error
from moebench.core.noise import given_as as noise_given_as
from moebench.core.noise import setting_problem as noise_setting_problem
from moebench.errors import SpecError, UsageError
from moebench.sources import plugins

# A spec is a page of YAML; anything this big is the wrong file (and reading /dev/zero never ends).
MAX_SPEC_BYTES = 4 * 2**20
# Values end up as kernel arguments and tensor sizes: they must fit a signed 64-bit integer.
INT64_MAX = 2**63 - 1

# the keys of a spec's top level (what each holds: `Spec` and the `_Loader` checks below)
TOP_KEYS = ("name", "family", "description", "model", "variants", "baseline", "axes", "zip", "fixed", "where",
            "quick", "pivot", "timing", "seed", "verify", "max_cases", "plugins")

MODEL_KEYS = ("name", "num_experts", "topk", "hidden", "moe_ffn", "moe_layers", "ep", "local_experts")



def _knob(default: Any, lo: float | None = None, hi: float | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A timing setting: its default, and the range (or, for a string, the choices) a spec may set."""
    return field(default=default, metadata={"range": (lo, hi), "choices": choices})


# the keys a matrix may have at each level (the top level is checked against TOP_KEYS)
MATRIX_KEYS = ("axes", "zip", "fixed", "where", "variants")


@dataclass
class Timing:
    """The timer's settings (a spec's `timing:` block, --timing KEY=VALUE)."""

    # launches captured per graph: the graph's own launch cost amortised over them
    launches_per_graph: int = _knob(200, 1, 10000)
    # rounds of every closure before a case's first graph is captured (1 before each further graph),
    # and replays of each graph before its timed replays
    warmup: int = _knob(5, 0, 10000)
    min_replays: int = _knob(20, 3, 1_000_000)
    max_replays: int = _knob(4000, 3, 1_000_000)
    max_seconds: float = _knob(1.0, 0.001, 3600)
    target_rel_noise: float = _knob(0.005, 0.0, 1.0)
    l2: str = _knob("warm", choices=('warm', 'cold'))
    cold_l2_multiple: float = _knob(3.0, 1.0, 100.0)
    clock_drop: float = _knob(0.9, 0.0, 1.0)  # flag a case whose SM clock ended below this fraction of max
    placements: int = _knob(8, 1, 64)  # warm L2: independently allocated input/output sets rotated per graph
    clock_retries: int = _knob(0, 0, 5)  # re-time a case whose clock fell below clock_drop, after a 1 s pause
    # warm L2: each set also sits at this many - 1 further placements (copies of the same data in
    # fresh memory), all rotated in the graph, as far as the warm L2 budget allows
    placement_copies: int = _knob(8, 1, 64)
    # `groups` graphs, each over its own freshly allocated copies of the input sets, replays
    # interleaved: the estimate is the mean of the group medians and its stated half-width the
    # t-interval over them, so placement luck shows in the uncertainty. A case whose groups
    # disagree adds groups (up to `max_groups`, 0: = groups) while the interval is wider than
    # groups_rel_noise, within max_seconds. 1 group is the single-graph timer (median of replays).
    groups: int = _knob(4, 1, 64)
    max_groups: int = _knob(16, 0, 256)
    groups_rel_noise: float = _knob(0.01, 0.0, 1.0)
    # caching: input sets come from torch's caching allocator (several small sets share a 2 MiB
    # segment); private: every set and copy gets its own memory pool, so no two share a segment
    placement_memory: str = _knob("private", choices=('caching', 'private'))
    # private placements only: the k-th placement's pool starts with a pad of (k mod
    # placement_strata) x placement_stride bytes, so the small buffers of consecutive placements sit
    # at different addresses (L2 slices) instead of all at one offset of their segments
    placement_strata: int = _knob(8, 1, 64)
    placement_stride: int = _knob(4096, 0, 1 << 20)
    # the run-to-run component no single run can see, added in quadrature to the stated 95%
    # half-width (rel_noise; the within-run part stays as rel_noise_within)
    rerun_rel: float = _knob(0.005, 0.0, 1.0)
    # the measured between-process term (moebench.core.noise): `auto` uses
    # results/<device>/noise/<sweep>.json of the repository when it was measured on this GPU,
    # `none` never a model, else the path of a model (scripts/repro.py calibrate); a case then adds
    # the larger of rerun_rel and its measured half-width
    noise: str = _knob("auto")


# each timing key: (type, min, max, choices), read off `Timing`
TIMING_KEYS = {f.name: (type(f.default), *f.metadata["range"], f.metadata["choices"]) for f in fields(Timing)}


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
    key: str = ""  # the key path it is written under, for messages: "", "quick.", "verify." or "verify.quick."


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

    def matrix(self, *, quick: bool = False, verify: bool = False) -> Matrix:
        if verify:
            if self.verify is None:
                raise SpecError(self.path, "verify", "this spec has no verify matrix")
            return self.verify_quick if (quick and self.verify_quick) else self.verify
        return self.quick if quick else self.sweep


# ----------------------------------------------------------------------------------- resolving


def resolve_spec_path(name_or_path: str) -> Path:
    """NAME -> sweeps/NAME.yaml (cwd first, then the project root); a path is taken as is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path or _exists(p):
        return p
    for base in (Path.cwd(), PACKAGE_ROOT):
        cand = base / "sweeps" / f"{name_or_path}.yaml"
        if _exists(cand):
            return cand
    known = [q.stem for q in builtin_sweeps()]
    raise SpecError(f"sweeps/{name_or_path}.yaml", "", "no such sweep; built-in sweeps: "
                    + (", ".join(known) or "none") + _did_you_mean(name_or_path, known))


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _builtin(folder: str) -> list[Path]:
    """The YAML files of `folder` (sweeps, configs) in the working directory and the project root;
    the working directory's win a name clash, as a name resolves (resolve_spec_path, the model's)."""
    seen: dict[str, Path] = {}
    for base in (Path.cwd(), PACKAGE_ROOT):
        for q in sorted((base / folder).glob("*.yaml")):
            seen.setdefault(q.stem, q)
    return [seen[k] for k in sorted(seen)]


def builtin_sweeps() -> list[Path]:
    return _builtin("sweeps")


def builtin_models() -> list[Path]:
    return _builtin("configs")


def read_yaml(path: Path) -> tuple[Any, bytes]:
    data = read_bounded(path, MAX_SPEC_BYTES, "a YAML spec")
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
    loader = None
    try:
        loader = _SpecYamlLoader(text)  # refuses control characters right away
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, "", set(), set(), path)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(e, yaml.reader.ReaderError):
            where = f" at offset {e.position}"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        context = getattr(e, "context", None)
        if context and not problem.startswith(context):
            problem = f"{context}, {problem}"
        raise SpecError(path, "", f"invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise SpecError(path, "", "invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
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
    if not safe_stem(name):
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
        raise SpecError(path, "", f"expected a mapping of model values, got {kind(doc)}")
    for k, v in doc.items():
        if k not in MODEL_KEYS:
            raise SpecError(path, str(k), f"unknown model key; expected one of {', '.join(MODEL_KEYS)}"
                            + _did_you_mean(k, MODEL_KEYS))
        if k == "name":
            if not isinstance(v, str):
                raise SpecError(path, k, f"expected a string, got {show(v)}")
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= INT64_MAX:
            raise SpecError(path, str(k), f"expected a positive integer, got {show(v)}")
    return doc, data


# ----------------------------------------------------------------------------------- loading


def unknown_variant(name: str, family: FamilySpec) -> str:
    """Why `name` is no variant of `family`: the variants it has, and where a variant it lacks
    comes from (another family, a plugin file that was not loaded, or an installed one that failed
    to load)."""
    other = [f.name for f in catalogue().values() if f is not family and name in f.variants]
    where = (f"{name!r} is a variant of family {', '.join(other)}" if other else _broken_plugins() or
             "a plugin's variant is registered by its file: pass --plugin FILE.py, or list it in the spec's plugins:")
    return (f"unknown variant {name!r}; family {family.name!r} has {', '.join(family.variants)}"
            + _did_you_mean(name, family.variants) + f"; {where}")


def _broken_plugins() -> str:
    """The installed plugins that failed to load, each with its FILE:LINE error, as a phrase ("" when
    none did): a variant or family a spec names but no one registered may be one of theirs."""
    why = [e for k, e in broken().items() if k.startswith("plugin ")]
    return f"an installed plugin failed to load, and may be what registers it: {'; '.join(why)}" if why else ""


def _did_you_mean(word: Any, choices) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


_FAILED = object()  # what a part of a spec gives when it is wrong (its SpecError is kept by the _Loader)


class _Loader:
    """Checks the parts of one spec file. `attempt` keeps a part's error and goes on, so one run
    reports every mistake; a part that stands on a wrong one is not checked (no error follows
    from another)."""

    def __init__(self, path: Path):
        self.path = path
        self.family: FamilySpec | None = None
        self.errors: list[SpecError] = []

    def fail(self, key: str, msg: str):
        raise SpecError(self.path, key, msg)

    def attempt(self, fn, *args):
        """fn(*args), or _FAILED with its SpecError kept."""
        try:
            return fn(*args)
        except SpecError as e:
            self.errors.append(e)
            return _FAILED

    def raise_kept(self, since: int) -> None:
        """Raise the last of the errors kept after the first `since`, if any (the caller's `attempt`
        keeps it again): parts checked each on its own, then the whole fails."""
        if len(self.errors) > since:
            raise self.errors.pop()

    def mapping(self, v: Any, key: str, what: str = "a mapping") -> dict:
        if v is None:
            self.fail(key, f"expected {what}, got nothing; give it values or delete the key")
        if not isinstance(v, dict):
            self.fail(key, f"expected {what}, got {show(v)}")
        for k in v:
            if not isinstance(k, str):
                self.fail(key, f"keys must be strings, got {show(k)}")
        return v

    def keys(self, d: dict, key: str, allowed: dict | tuple) -> None:
        """Each unknown key of `d` is an error of its own (kept); the known ones are checked on."""
        for k in d:
            if k not in allowed:
                sub = f"{key}.{k}" if key else k
                self.attempt(self.fail, sub, f"unknown key; expected one of {', '.join(allowed)}"
                             + _did_you_mean(k, allowed))

    def string(self, v: Any, key: str) -> str:
        if not isinstance(v, str) or not v.strip():
            self.fail(key, f"expected a non-empty string, got {show(v)}")
        return v

    def param_name(self, name: str, key: str) -> None:
        if name not in self.family.params:
            self.fail(key, f"unknown parameter of family {self.family.name!r}; expected one of "
                      f"{', '.join(self.family.params)}" + _did_you_mean(name, self.family.params))

    def value(self, name: str, v: Any, key: str) -> Any:
        self.param_name(name, key)
        p = self.family.params[name]
        if p.type is float and isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > INT64_MAX:
                self.fail(key, f"expected a number of sensible size, got {show(v)}")
            v = float(v)
        problem = p.check(v)
        if problem:
            self.fail(key, problem)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT64_MAX:
            self.fail(key, f"must fit a signed 64-bit integer, got a {len(str(abs(v)))}-digit number")
        if isinstance(v, float) and not math.isfinite(v):
            self.fail(key, f"expected a finite number, got {v}")
        return v

    def axes(self, v: Any, key: str, unique: bool = True) -> dict[str, list]:
        """PARAM: [values...], each parameter checked on its own (a wrong one's error is kept, and
        raised once all are checked)."""
        v = self.mapping(v, key, "a mapping PARAM: [values...]")
        n = len(self.errors)
        out = {name: vals for name, vals in ((name, self.attempt(self._axis, name, vals, f"{key}.{name}", unique))
                                             for name, vals in v.items()) if vals is not _FAILED}
        self.raise_kept(n)
        return out

    def _axis(self, name: str, vals: Any, k: str, unique: bool) -> list:
        self.param_name(name, k)
        if isinstance(vals, dict):
            self.fail(k, f"expected a list of values (or one value), got {show(vals)}")
        if isinstance(vals, list):
            if not vals:
                self.fail(k, "expected a non-empty list of values, got an empty list")
            out = [self.value(name, x, f"{k}[{i}]") for i, x in enumerate(vals)]
        else:  # one value is a one-value axis
            out = [self.value(name, vals, k)]
        if unique and len(set(map(repr, out))) != len(out):
            self.fail(k, f"repeated values in {out}; list each value once")
        return out

    def fixed(self, v: Any, key: str) -> dict[str, Any]:
        """PARAM: value, each parameter checked on its own (as axes)."""
        v = self.mapping(v, key, "a mapping PARAM: value")
        n = len(self.errors)
        out = {}
        for name, x in v.items():
            if isinstance(x, list) and name in self.family.params:
                self.attempt(self.fail, f"{key}.{name}", "expected one value, got a list; sweep several values "
                             "under axes")
            else:
                got = self.attempt(self.value, name, x, f"{key}.{name}")
                if got is not _FAILED:
                    out[name] = got
        self.raise_kept(n)
        return out

    def zips(self, v: Any, key: str) -> list[dict[str, list]]:
        if not isinstance(v, list):
            hint = "; write zip: [{a: [...], b: [...]}]" if isinstance(v, dict) else ""
            self.fail(key, f"expected a list of {{PARAM: [values]}} groups, got {show(v)}{hint}")
        out = []
        for i, g in enumerate(v):
            k = f"{key}[{i}]"
            # a column may repeat a value (rows [16384, 16384] against live_rows [2048, 16384]);
            # a whole row may not
            grp = self.axes(g, k, unique=False)
            if not grp:
                self.fail(k, "expected at least one parameter")
            lens = {n: len(x) for n, x in grp.items()}
            if len(set(lens.values())) != 1:
                shown = ", ".join(f"{n} has {m}" for n, m in lens.items())
                self.fail(k, f"lists must have equal lengths to zip, got {shown}")
            rows = list(zip(*(map(repr, x) for x in grp.values())))
            for j, row in enumerate(rows):
                if row in rows[:j]:
                    shown = ", ".join(f"{n}={x[j]!r}" for n, x in grp.items())
                    self.fail(k, f"entry {j} repeats an earlier one ({shown}); list each combination once")
            out.append(grp)
        return out

    def where(self, v: Any, key: str) -> list[str]:
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list):
            self.fail(key, f"expected an expression or a list of them, got {show(v)}")
        for i, e in enumerate(items):
            try:
                compile_expr(e, self.family.params)
            except ExprError as err:
                self.fail(f"{key}[{i}]" if isinstance(v, list) else key, str(err))
        return list(items)

    def variants(self, v: Any, key: str) -> list[VariantEntry]:
        names = ", ".join(self.family.variants)
        if not isinstance(v, list):
            self.fail(key, f"expected a list of variants, got {show(v)}; family {self.family.name!r} has {names}")
        if not v:
            self.fail(key, f"expected at least one variant, got an empty list; family {self.family.name!r} "
                      f"has {names}")
        out, labels = [], set()
        for i, item in enumerate(v):
            k = f"{key}[{i}]"
            if isinstance(item, str):
                item = {"variant": item}
            item = self.mapping(item, k, "a variant name or {variant, label, params, axes}")
            self.keys(item, k, ("variant", "label", "params", "axes"))
            if "variant" not in item:
                self.fail(f"{k}.variant", f"missing; name a variant of family {self.family.name!r}: {names}")
            name = self.string(item["variant"], f"{k}.variant")
            if name not in self.family.variants:
                self.fail(f"{k}.variant", unknown_variant(name, self.family))
            label = self.string(item.get("label", name), f"{k}.label")
            if label in labels:
                self.fail(f"{k}.label", f"label {label!r} used twice; give each entry its own label")
            labels.add(label)
            params = self.fixed(item["params"], f"{k}.params") if "params" in item else {}
            axes = self.axes(item["axes"], f"{k}.axes") if "axes" in item else {}
            for pname in params:
                if pname in axes:
                    self.fail(f"{k}.axes.{pname}", f"{pname!r} is also set in {k}.params; set it in one place")
            vs = self.family.variants[name]
            for src, pnames in (("params", params), ("axes", axes)):
                for pname in pnames:
                    p = self.family.params[pname]
                    if p.role == "launch" and pname not in vs.params:
                        self.fail(f"{k}.{src}.{pname}", f"variant {name!r} does not take {pname!r}; it takes "
                                  f"{', '.join(vs.params) or 'no launch parameters'}")
            out.append(VariantEntry(name, label, params, axes))
        return out

    def matrix(self, d: dict, key: str, base: Matrix | None, allowed: tuple = MATRIX_KEYS) -> Matrix | object:
        """One level of cases (the sweep, quick, verify, verify.quick) over `base`, the level it
        overrides; _FAILED when a part of it is wrong (each part's error is kept)."""
        pre = f"{key}." if key else ""
        if key:
            self.keys(d, key, allowed)
        n = len(self.errors)
        variants = self.attempt(self.variants, d["variants"], pre + "variants") if "variants" in d else (
            base.variants if base else _FAILED)
        axes = self.attempt(self.axes, d["axes"], pre + "axes") if "axes" in d else {}
        zips = self.attempt(self.zips, d["zip"], pre + "zip") if "zip" in d else []
        fixed = self.attempt(self.fixed, d["fixed"], pre + "fixed") if "fixed" in d else {}
        where = self.attempt(self.where, d["where"], pre + "where") if "where" in d else None
        if len(self.errors) > n or variants is _FAILED:
            return _FAILED
        return self.attempt(self._combined, d, pre, base, variants, axes, zips, fixed, where)

    def _combined(self, d: dict, pre: str, base: Matrix | None, variants, axes, zips, fixed, where) -> Matrix:
        """The checks across the parts of one level, and the level merged over its base."""
        # within one level a parameter is set in one place only
        seen: dict[str, str] = {}
        groups = [("axes", axes), ("fixed", fixed)] + [(f"zip[{i}]", z) for i, z in enumerate(zips)]
        for src, names in groups:
            for n in names:
                if n in seen:
                    self.fail(f"{pre}{src}.{n}", f"{n!r} is also set in {pre}{seen[n]}; set it in one place")
                seen[n] = src
        # a launch parameter set here must be read by some variant, or its values would vanish in dedupe
        for n, src in seen.items():
            if self.family.params[n].role == "launch" and not any(
                    n in self.family.variants[ve.variant].params for ve in variants):
                takers = [v.name for v in self.family.variants.values() if n in v.params]
                self.fail(f"{pre}{src}.{n}", f"no variant here takes {n!r} "
                          f"({', '.join(ve.label for ve in variants)}); "
                          f"it is read by {', '.join(takers) or 'no variant'}")
        if base is not None:
            # this level overrides the base: a name it sets, in any form, replaces the base's setting;
            # everything else the base sets stays
            for i, z in enumerate(base.zips):
                hit = set(z) & set(seen)
                if hit and hit != set(z):
                    n = sorted(hit)[0]
                    rest = ", ".join(sorted(set(z) - hit))
                    self.fail(f"{pre}{seen[n]}.{n}", f"{n!r} is zipped with {rest} in the level this "
                              f"overrides; set {rest} here too, or none of them")
            axes = {**{k: v for k, v in base.axes.items() if k not in seen}, **axes}
            fixed = {**{k: v for k, v in base.fixed.items() if k not in seen}, **fixed}
            zips = [z for z in base.zips if not (set(z) & set(seen))] + zips
            where = base.where if where is None else where
        # a variant's own axes cannot sweep a parameter that advances in a zip group
        zipped = {n: i for i, z in enumerate(zips) for n in z}
        for i, ve in enumerate(variants):
            for n in ve.axes:
                if n in zipped:
                    self.fail(f"{pre if 'variants' in d else ''}variants[{i}].axes.{n}",
                              f"{n!r} advances in a zip group ({', '.join(zips[zipped[n]])}); "
                              "a variant may fix it under params, not sweep it")
        return Matrix(variants=variants, axes=axes, zips=zips, fixed=fixed, where=where or [], key=pre)


def _plugins(doc: dict, path: Path, L: "_Loader") -> list[dict]:
    """Run the spec's plugin files (paths relative to the spec), so the variants and families they
    register are known when the spec names them."""
    if "plugins" not in doc:
        return []
    items = doc["plugins"]
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        L.fail("plugins", f"expected a list of Python files, got {show(doc['plugins'])}")
    out = []
    for i, item in enumerate(items):
        L.string(item, f"plugins[{i}]")
        p = Path(item).expanduser()
        p = p if p.is_absolute() else path.resolve().parent / p
        plugins.load_file(p, where=f"{path}: plugins[{i}]")
        digest = next(d["sha256"] for d in plugins.loaded() if d["path"] == str(p.resolve()))
        out.append({"path": str(item), "sha256": digest})
    return out


def load_spec(name_or_path: str) -> Spec:
    """The spec of a name (sweeps/NAME.yaml) or a path, checked whole: every mistake found is
    reported at once (SpecErrors, one line each), not only the first."""
    path = resolve_spec_path(name_or_path)
    doc, data = read_yaml(path)
    L = _Loader(path)
    if doc is None:
        L.fail("", "empty file; a sweep spec needs at least name, family and variants")
    if not isinstance(doc, dict):
        L.fail("", f"expected a mapping of spec keys (name, family, variants, ...) at the top level, "
               f"got {show(doc)}")
    L.mapping(doc, "")
    L.keys(doc, "", TOP_KEYS)
    plugin_files = L.attempt(_plugins, doc, path, L)  # before the family and variant names are checked
    cat = catalogue()
    for req, hint in (("name", "a sweep name"), ("family", f"a kernel family: {', '.join(cat)}"),
                      ("variants", "a list of variant names")):
        if req not in doc:
            L.attempt(L.fail, req, f"missing; the spec needs {hint}")
    name = L.attempt(_name, L, doc["name"]) if "name" in doc else _FAILED
    family = L.attempt(_family, L, doc["family"], cat) if "family" in doc and plugin_files is not _FAILED else _FAILED
    L.family = family if family is not _FAILED else None
    description = doc.get("description", "") or ""
    if not isinstance(description, str):
        L.attempt(L.fail, "description", f"expected a string, got {show(description)}")
    model, model_name, mdata = {}, None, b""
    if "model" in doc:
        model_name = L.attempt(L.string, doc["model"], "model")
        found = L.attempt(load_model, model_name, path) if model_name is not _FAILED else _FAILED
        model, mdata = found if found is not _FAILED else ({}, b"")
    seed = L.attempt(_count, L, doc.get("seed", 0), "seed", 0)
    max_cases = L.attempt(_count, L, doc.get("max_cases", 5000), "max_cases", 1)
    timing = L.attempt(_timing, L, doc["timing"]) if "timing" in doc else Timing()
    if L.family is not None:
        sweep, quick, verify, verify_quick = _matrices(L, doc)
        baseline = L.attempt(_baseline, L, doc, family)
        pivot = L.attempt(_pivot, L, doc, family)
    if L.errors:
        raise L.errors[0] if len(L.errors) == 1 else SpecErrors(L.errors)
    h = hashlib.sha256(data)
    for plugin in plugin_files:
        h.update(plugin["sha256"].encode())
    h.update(mdata)
    return Spec(path=path, name=name, family=family, description=description, model_name=model_name,
                model=model, baseline=baseline, sweep=sweep, quick=quick, verify=verify,
                verify_quick=verify_quick, pivot=pivot, timing=timing, seed=seed, max_cases=max_cases,
                sha256=h.hexdigest())


class SpecErrors(SpecError):
    """Several mistakes in one spec: each its own SpecError, shown one per line (the first one's
    path, key and message are this error's)."""

    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        super().__init__(errors[0].path, errors[0].key, errors[0].message)
        self.args = ("\nerror: ".join(str(e) for e in errors),)  # the CLI says "error: " before the first


def _name(L: "_Loader", v: Any) -> str:
    name = L.string(v, "name")
    if not safe_stem(name):
        if safe_stem(name[:100]):
            L.fail("name", f"expected at most 100 characters (it names the result files), got {len(name)}")
        L.fail("name", f"expected letters, digits, '.', '_' or '-' (it names the result files), got {name!r}")
    return name


def _family(L: "_Loader", v: Any, cat: dict) -> FamilySpec:
    fam_name = L.string(v, "family")
    if fam_name not in cat:
        more = _broken_plugins()
        L.fail("family", family_error(fam_name) or f"unknown family {fam_name!r}; known: {', '.join(cat)}"
               + _did_you_mean(fam_name, cat) + (f"; {more}" if more else ""))
    return cat[fam_name]


def _count(L: "_Loader", v: Any, key: str, least: int) -> int:
    """seed (>= 0) and max_cases (>= 1): an integer that fits int64."""
    if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= INT64_MAX:
        L.fail(key, f"expected a {'non-negative' if least == 0 else 'positive'} integer, got {show(v)}")
    return v


def _matrices(L: "_Loader", doc: dict) -> tuple:
    """The sweep's matrix, its quick override, the verify matrix and its quick override (None where
    the spec has none; _FAILED where one is wrong or stands on one that is)."""
    sweep = L.matrix(doc, "", None) if "variants" in doc else _FAILED
    quick = sweep
    if "quick" in doc and sweep is not _FAILED:
        quick = _quick(L, doc["quick"], "quick", sweep)
    verify = verify_quick = None
    if "verify" in doc and sweep is not _FAILED:
        vdoc = L.attempt(L.mapping, doc["verify"], "verify", f"a mapping ({', '.join(MATRIX_KEYS + ('quick',))})")
        verify = _FAILED if vdoc is _FAILED else L.matrix(
            vdoc, "verify", Matrix(sweep.variants, {}, [], dict(sweep.fixed), []), MATRIX_KEYS + ("quick",))
        if verify is not _FAILED and "quick" in vdoc:
            verify_quick = _quick(L, vdoc["quick"], "verify.quick", verify)
    return sweep, quick, verify, verify_quick


def _quick(L: "_Loader", v: Any, key: str, base: Matrix) -> Matrix | object:
    """A `quick:` level (`key`: quick or verify.quick) over `base`, the level it overrides."""
    qdoc = L.attempt(L.mapping, v, key, f"a mapping of overrides ({', '.join(MATRIX_KEYS)})")
    return L.matrix(qdoc, key, base) if qdoc is not _FAILED else _FAILED


def _baseline(L: "_Loader", doc: dict, family: FamilySpec) -> dict | None:
    if "baseline" not in doc:
        if not family.host_only:
            L.fail("baseline", "missing; name the launch every variant must equal bit-exactly, "
                   "e.g. {variant: persistent, block_size: 1024}")
        return None
    b = dict(L.mapping(doc["baseline"], "baseline", "a mapping {variant: NAME, PARAM: VALUE...}"))
    if "variant" not in b:
        L.fail("baseline.variant", f"missing; name a variant of {family.name!r}: {', '.join(family.variants)}")
    vname = L.string(b.pop("variant"), "baseline.variant")
    if vname not in family.variants:
        L.fail("baseline.variant", unknown_variant(vname, family))
    takes = family.variants[vname].params
    params = {}
    for k, v in b.items():
        if k in family.params and (family.params[k].role != "launch" or k not in takes):
            L.fail(f"baseline.{k}", f"the baseline may set only launch parameters of {vname!r}: "
                   f"{', '.join(takes) or 'none'}")
        params[k] = L.value(k, v, f"baseline.{k}")
    return {"variant": vname, **params}


def _pivot(L: "_Loader", doc: dict, family: FamilySpec) -> dict[str, str]:
    pivot = dict(family.default_pivot)
    if "pivot" not in doc:
        return pivot
    pv = L.mapping(doc["pivot"], "pivot", "a mapping {rows: PARAM, cols: PARAM, metric: COLUMN}")
    L.keys(pv, "pivot", ("rows", "cols", "metric"))
    for k, v in pv.items():
        pivot[k] = L.string(v, f"pivot.{k}")
    for k in ("rows", "cols"):
        if k in pivot and pivot[k] not in family.params and pivot[k] not in ("variant", "label"):
            L.fail(f"pivot.{k}", f"expected a parameter of {family.name!r}, 'variant' or 'label'; "
                   f"got {pivot[k]!r}" + _did_you_mean(pivot[k], family.params))
    return pivot


def _timing(L: "_Loader", doc: Any) -> Timing:
    t = L.mapping(doc, "timing", f"a mapping of timer settings ({', '.join(TIMING_KEYS)})")
    L.keys(t, "timing", TIMING_KEYS)
    timing = Timing()
    set_timing(timing, {k: v for k, v in t.items() if k in TIMING_KEYS},
               lambda key, problem: L.attempt(L.fail, f"timing.{key}" if key else "timing", problem))
    return timing


# ----------------------------------------------------------------------------------- timing settings


def timing_problem(key: str, v: Any) -> str | None:
    """What is wrong with timing setting `key` = `v` (a YAML value), or None."""
    typ, lo, hi, choices = TIMING_KEYS[key]
    if key == "noise":
        return noise_setting_problem(v)
    if typ is str:
        if not isinstance(v, str) or v not in choices:
            return f"expected one of {', '.join(choices)}, got {show(v)}"
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (typ is int and not isinstance(v, int)):
        return f"expected {'an integer' if typ is int else 'a number'}, got {show(v)}"
    if (lo is not None and not lo <= v) or (hi is not None and not v <= hi):  # refuses NaN too
        return f"must be between {lo:g} and {hi:g}, got {show(v)}"
    return None


def set_timing(t: Timing, given: dict[str, Any], fail) -> None:
    """Set the timing settings `given` (a spec's `timing:` block, or --timing): each checked
    (fail(key, problem) for a bad one, which is then not set), then against each other. `groups`
    set above the default `max_groups`, which was not given, lifts the cap with it."""
    for k, v in given.items():
        problem = timing_problem(k, v)
        if problem:
            fail(k, problem)
        else:
            setattr(t, k, TIMING_KEYS[k][0](v))
    if "groups" in given and "max_groups" not in given and t.max_groups and t.max_groups < t.groups:
        t.max_groups = t.groups
    if t.max_replays < t.min_replays:
        fail("max_replays", f"must be >= min_replays ({t.min_replays}), got {t.max_replays}")
    if t.max_groups and t.max_groups < t.groups:
        fail("max_groups", f"must be 0 (= groups) or >= groups ({t.groups}), got {t.max_groups}")
    if t.placement_stride % 512:
        # torch's allocator rounds every block to 512 bytes: another stride would not move the buffers by it
        fail("placement_stride", f"must be a multiple of 512 bytes, got {t.placement_stride}")


def apply_timing_overrides(timing: Timing, text: str) -> list[str]:
    """Apply `--timing KEY=VALUE,...` to a spec's timing settings (the same checks as the spec's
    `timing:` block); returns the keys set. A bad item, or a key given twice, is a UsageError naming
    it."""
    given: dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or key not in TIMING_KEYS:
            raise UsageError(f"--timing: expected KEY=VALUE with KEY one of {', '.join(TIMING_KEYS)}; got {item!r}"
                             + (_did_you_mean(key, TIMING_KEYS) if sep else ""))
        if key in given:  # which one was meant is a guess (a spec's timing: block refuses it too)
            raise UsageError(f"--timing {key}: given more than once; give each key once")
        try:
            given[key] = yaml.safe_load(raw)
        except yaml.YAMLError:
            given[key] = raw

    def fail(key: str, problem: str):
        raise UsageError(f"--timing {key}: {problem}")

    set_timing(timing, given, fail)
    if "noise" in given:  # a missing model file is found when the run resolves it: named as given here
        noise_given_as(timing, "--timing noise")
    return list(given)

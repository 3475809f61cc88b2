"""Expand a spec matrix into concrete cases: axes (cartesian) x zip groups x variants.

A case is one (variant, full parameter set). Its id is a short hash of the family, the
variant label and every resolved parameter, so it is stable across runs and across edits
of a spec that leave the case itself unchanged.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from moebench.errors import SpecError
from moebench.core.expr import ExprError, compile_expr, evaluator
from moebench.core.family import REQUIRED
from moebench.core.spec import Matrix, Spec
from moebench.core.text import varying


@dataclass(frozen=True)
class Case:
    family: str
    variant: str
    label: str
    params: dict[str, Any]  # every parameter of the family; launch params the variant ignores are None
    id: str
    # where each value came from: "spec", "model NAME" or "default" (not part of the id)
    origins: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def short(self, varying: tuple[str, ...] = ()) -> str:
        keys = varying or tuple(self.params)
        bits = ",".join(f"{k}={self.params[k]}" for k in keys if self.params.get(k) is not None)
        return f"{self.label}[{bits}]"


def case_id(family: str, label: str, params: dict[str, Any]) -> str:
    blob = json.dumps([family, label, {k: v for k, v in sorted(params.items()) if v is not None}],
                      sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


# No spec key or flag lifts a product of axes past this: a million cases is already days of GPU
# time, and expanding (or validating) a larger product would take minutes and gigabytes.
HARD_MAX_CASES = 1_000_000


def count_product(m: Matrix) -> int:
    """Upper bound on the cases before filters, computed without expanding."""
    n = 1
    for v in m.axes.values():
        n *= len(v)
    for z in m.zips:
        n *= len(next(iter(z.values())))
    total = 0
    for ve in m.variants:
        k = n
        for v in ve.axes.values():
            k *= len(v)
        total += k
    return total


def _where_key(spec: Spec, m: Matrix, pre: str) -> str:
    """Where the filters of `m` were written: an override level without its own `where` inherits one."""
    for level, key in ((spec.verify, "verify."), (spec.sweep, "")):
        if level is not None and level is not m and m.where and m.where is level.where:
            return key + "where"
    return pre + "where"


def _conjuncts(tree: ast.Expression) -> list[ast.Expression]:
    """`a and b and c` as three filters, so each can prune the product as soon as its own names
    are bound; anything else as itself."""
    body = tree.body
    if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And):
        return [ast.Expression(body=v) for v in body.values]
    return [tree]


def _levels(axes: dict[str, list], zips: list[dict[str, list]], keep: set[str]) -> list[list[dict]]:
    """The product as nested levels, slowest first: one level per axis, then one per zip group
    (the order the cases come out in). Names not in `keep` (set elsewhere for this variant) do not
    change a case, so their levels are left out; the distinct cases and their order stay the same."""
    levels = [[{n: v} for v in vals] for n, vals in axes.items() if n in keep]
    for z in zips:
        names = [n for n in z if n in keep]
        if names:
            rows = len(next(iter(z.values())))
            levels.append([{n: z[n][i] for n in names} for i in range(rows)])
    return levels


def expand(spec: Spec, *, quick: bool = False, verify: bool = False, force: bool = False) -> list[Case]:
    """The cases of a matrix, in order: variants, then the product of axes and zip groups (last
    axis fastest), filtered by `where`, checked against the family's rules, duplicates dropped.

    The count before filters is computed first (`count_product`): past max_cases it needs --force,
    past HARD_MAX_CASES nothing lifts it. The product is never materialised: it is walked level by
    level, and each `where` conjunct is evaluated at the first level that binds all its names, so a
    filter that pins one axis prunes the rest of the product under every other value."""
    fam = spec.family
    m = spec.matrix(quick=quick, verify=verify)
    pre = m.key
    where_key = _where_key(spec, m, pre)
    bound = count_product(m)
    if bound > HARD_MAX_CASES:
        raise SpecError(spec.path, pre + "axes", f"expands to up to {bound} cases before filters, over moebench's "
                        f"hard limit of {HARD_MAX_CASES} (no key or flag lifts it); split the sweep")
    if bound > spec.max_cases and not force:
        raise SpecError(spec.path, pre + "axes", f"expands to up to {bound} cases, over max_cases={spec.max_cases}; "
                        "narrow the axes, raise max_cases, or pass --force")
    wheres = [(c, w) for w in m.where for c in _conjuncts(compile_expr(w, fam.params))]
    rules = [(compile_expr(r, fam.params), r, msg) for r, msg in fam.rules]
    compiled = {id(t): evaluator(t) for t, _ in wheres} | {id(t): evaluator(t) for t, _, _ in rules}

    def check(tree, text: str, env: dict, params: dict, label: str, key: str) -> bool:
        try:
            return bool(compiled[id(tree)](env))
        except ExprError as e:
            names = sorted(tree_names(tree))
            shown = ", ".join(f"{k}={env[k]!r}" for k in names)
            ignored = [k for k in names if params.get(k) is None and fam.params[k].role == "launch"]
            note = (f" ({', '.join(ignored)} not taken by {label!r}, so it reads as 0)" if ignored else "")
            raise SpecError(spec.path, key, f"{text!r} cannot be evaluated for {label!r} with {shown}{note}: "
                            f"{e}") from None

    cases: list[Case] = []
    seen: set[str] = set()
    for ve in m.variants:
        used = set(fam.variants[ve.variant].params)
        axes = {**m.axes, **ve.axes}
        point_names = set(axes) | {n for z in m.zips for n in z}
        # every value that does not change along the product, resolved once per variant
        const: dict[str, Any] = {}
        origins: dict[str, str] = {}
        for name, p in fam.params.items():
            if p.role == "launch" and name not in used:
                const[name] = None
                continue
            origin = "spec"
            if name in ve.params:
                v = ve.params[name]
            elif name in point_names:
                origins[name] = origin
                continue
            elif name in m.fixed:
                v = m.fixed[name]
            elif p.model_key and p.model_key in spec.model:
                v, origin = spec.model[p.model_key], f"model {spec.model_name}"
            elif name == "seed":
                v = spec.seed
            elif p.default is not REQUIRED:
                v, origin = p.default, "default"
            else:
                hint = " or name a model config that has it" if p.model_key else ""
                raise SpecError(spec.path, pre + "fixed", f"parameter {name!r} has no value; set it in "
                                f"axes or fixed{hint} ({p.help})")
            const[name] = v
            origins[name] = origin
        levels = _levels(axes, m.zips, set(fam.params) - set(const))
        bound_at = {}  # name -> the level that binds it (-1: bound before the product)
        for i, lv in enumerate(levels):
            for n in lv[0]:
                bound_at[n] = i
        env = {k: (v if v is not None else 0) for k, v in const.items()}
        checks: list[list] = [[] for _ in range(len(levels) + 1)]  # checks[i + 1]: after level i is bound
        for tree, text in wheres:
            at = max((bound_at.get(n, -1) for n in tree_names(tree)), default=-1)
            checks[at + 1].append((tree, text))

        def passes(i: int) -> bool:
            return all(check(tree, text, env, const, ve.label, where_key) for tree, text in checks[i])

        def walk(i: int):
            if i == len(levels):
                yield {k: env[k] for k in bound_at}
                return
            for values in levels[i]:
                env.update(values)
                if passes(i + 1):
                    yield from walk(i + 1)

        if not passes(0):
            continue
        for point in walk(0):
            params = {name: (point[name] if name in point else const[name]) for name in fam.params}
            penv = {k: (v if v is not None else 0) for k, v in params.items()}
            for tree, text, msg in rules:
                if not check(tree, text, penv, params, ve.label, pre + "axes"):
                    shown = ", ".join(f"{k}={params[k]}" for k in sorted(tree_names(tree)))
                    raise SpecError(spec.path, where_key if m.where else pre + "axes",
                                    f"{msg} ({text}) but a case has {shown}; add a where: filter "
                                    f"such as {text!r}")
            cid = case_id(fam.name, ve.label, params)
            if cid in seen:
                continue
            seen.add(cid)
            cases.append(Case(fam.name, ve.variant, ve.label, params, cid, dict(origins)))
    if not cases:
        shown = "; ".join(m.where)
        raise SpecError(spec.path, where_key if m.where else pre + "axes",
                        f"expands to 0 cases: every case is filtered out by {shown!r}" if m.where
                        else "expands to 0 cases")
    return cases


def tree_names(tree) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in ("min", "max")}


def baseline_params(spec: Spec, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of the spec's baseline launch at the shape of `params`: the shape values
    as given; each launch parameter the baseline variant reads from the baseline entry, else the
    sweep's `fixed`, else the family default; the others None."""
    fam = spec.family
    b = dict(spec.baseline or {})
    takes = fam.variants[b.pop("variant")].params
    out = {}
    for name, p in fam.params.items():
        if p.role != "launch":
            out[name] = params.get(name)
        elif name not in takes:
            out[name] = None
        else:
            out[name] = b.get(name, spec.sweep.fixed.get(name, p.default))
    return out


def baseline_case(spec: Spec, case: Case) -> Case:
    """The baseline launch at `case`'s shape, as a case of its own."""
    variant = spec.baseline["variant"]
    params = baseline_params(spec, case.params)
    origins = {**case.origins, **{k: "baseline" for k in spec.baseline if k != "variant"}}
    return Case(case.family, variant, variant, params, case_id(case.family, variant, params), origins)


def is_baseline(spec: Spec, variant: str, params: dict[str, Any]) -> bool:
    """Whether a case (its variant and parameters) is the spec's baseline launch at its shape."""
    if not spec.baseline or variant != spec.baseline["variant"]:
        return False
    want = baseline_params(spec, params)
    return all(params.get(k) == want[k] for k in spec.family.variants[variant].params)


def shape_key(case: Case, shape_params: tuple[str, ...]) -> tuple:
    """Cases with the same shape key see the same inputs."""
    return tuple((k, case.params[k]) for k in shape_params)


def varying_params(cases: list[Case]) -> tuple[str, ...]:
    """Parameters that take more than one value across cases (for short labels and tables)."""
    return tuple(varying([c.params for c in cases]))

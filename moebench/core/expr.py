"""A tiny, safe expression language for `where:` filters and family rules.

Grammar: numbers, strings, parameter names, + - * / // %, comparisons, and/or/not,
min(a, b, ...), max(a, b, ...). Anything else is rejected when the spec is loaded, not when
it runs. The kinds are checked against the parameter types too: arithmetic and ordering need
numbers (or two strings, for ordering), so ``routing > 3`` is refused at load time instead of
failing on the first case.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Mapping

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_FUNCS = {"min": min, "max": max}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.USub: "-", ast.UAdd: "+"}

# A filter is one line of a spec; past this it is a mistake (and deep nesting overflows the parser).
MAX_CHARS = 1000

# The kinds the checker tracks. "any" is where it cannot tell (an `or` of a string and a number).
NUM, STR, ANY = "number", "string", "any"


class ExprError(ValueError):
    pass


def _kind_of_type(t: Any) -> str:
    if t is str:
        return STR
    if t in (int, float, bool):
        return NUM
    return ANY


def compile_expr(text: str, names: Mapping[str, Any]) -> ast.Expression:
    """Parse and check an expression against `names` (name -> parameter: anything with a `.type`);
    raise ExprError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expected a non-empty expression string")
    if len(text) > MAX_CHARS:
        raise ExprError(f"expression too long ({len(text)} characters, at most {MAX_CHARS}); "
                        "split it into a list of filters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"not a valid expression ({e.msg}): {text!r}") from None
    except (ValueError, MemoryError, RecursionError):  # NUL bytes; parser stack overflow on deep nesting
        raise ExprError(f"not a valid expression: {text!r}") from None
    known = set(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in known and node.id not in _FUNCS:
                raise ExprError(f"unknown name {node.id!r} in {text!r}; known: {', '.join(sorted(known))}")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise ExprError(f"only min(...) and max(...) may be called, in {text!r}")
            if len(node.args) < 2:
                raise ExprError(f"{node.func.id}(...) needs at least two arguments, in {text!r}")
        elif isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, str, bool):
                raise ExprError(f"unsupported constant {node.value!r} in {text!r}; use numbers and strings")
        elif not isinstance(node, (ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp,
                                   ast.Load, ast.And, ast.Or, ast.Not, ast.USub,
                                   ast.UAdd, *_BIN, *_CMP)):
            raise ExprError(f"unsupported syntax {type(node).__name__} in {text!r}")
    for node in ast.walk(tree):  # a bare name used as a function: min = min(...) only
        if isinstance(node, ast.Name) and node.id in _FUNCS and node.id not in known:
            if not any(isinstance(c, ast.Call) and c.func is node for c in ast.walk(tree)):
                raise ExprError(f"{node.id!r} is a function; call it as {node.id}(a, b), in {text!r}")
    kinds = {n: _kind_of_type(getattr(p, "type", None)) for n, p in names.items()}
    try:
        _infer(tree.body, kinds, text)
    except RecursionError:
        raise ExprError(f"expression nested too deeply: {text!r}") from None
    return tree


def _infer(node: ast.AST, kinds: dict[str, str], text: str) -> str:
    """The kind an expression yields; raise ExprError where an operator gets the wrong kinds."""
    if isinstance(node, ast.Constant):
        return STR if isinstance(node.value, str) else NUM
    if isinstance(node, ast.Name):
        return kinds.get(node.id, ANY)
    if isinstance(node, ast.BinOp):
        for side in (node.left, node.right):
            if _infer(side, kinds, text) == STR:
                raise ExprError(f"{_SYMBOL[type(node.op)]!r} needs numbers, but "
                                f"{ast.unparse(side)!r} is a string, in {text!r}")
        return NUM
    if isinstance(node, ast.UnaryOp):
        k = _infer(node.operand, kinds, text)
        if isinstance(node.op, ast.Not):
            return NUM
        if k == STR:
            raise ExprError(f"unary {_SYMBOL[type(node.op)]!r} needs a number, but "
                            f"{ast.unparse(node.operand)!r} is a string, in {text!r}")
        return NUM
    if isinstance(node, ast.BoolOp):
        ks = {_infer(v, kinds, text) for v in node.values}
        return ks.pop() if len(ks) == 1 else ANY
    if isinstance(node, ast.Compare):
        left = node.left
        lk = _infer(left, kinds, text)
        for op, right in zip(node.ops, node.comparators):
            rk = _infer(right, kinds, text)
            if isinstance(op, _ORDER) and ANY not in (lk, rk) and lk != rk:
                raise ExprError(f"cannot order {ast.unparse(left)!r} ({lk}) against {ast.unparse(right)!r} "
                                f"({rk}) with {_SYMBOL[type(op)]!r}, in {text!r}")
            left, lk = right, rk
        return NUM
    # ast.Call, the last kind of expression compile_expr lets through
    ks = {_infer(a, kinds, text) for a in node.args}
    if STR in ks and NUM in ks:
        raise ExprError(f"{node.func.id}(...) mixes strings and numbers, in {text!r}")
    return ks.pop() if len(ks) == 1 else ANY


def evaluator(tree: ast.Expression) -> Callable[[dict[str, Any]], Any]:
    """A compiled expression as a function of env; any failure (division by zero, mixed kinds) is
    an ExprError. The tree becomes nested closures once, so a filter checked at every point of a
    large product does not dispatch on node types at every call."""
    fn = _closure(tree.body)

    def run(env: dict[str, Any]) -> Any:
        try:
            return fn(env)
        except ExprError:
            raise
        except (ArithmeticError, TypeError, ValueError, KeyError, RecursionError) as e:
            raise ExprError(str(e) or type(e).__name__) from None

    return run


def _closure(node: ast.AST) -> Callable[[dict[str, Any]], Any]:
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        return lambda env: env[name]
    if isinstance(node, ast.BinOp):
        left, right, op, sym = _closure(node.left), _closure(node.right), _BIN[type(node.op)], _SYMBOL[type(node.op)]

        def binop(env):
            a, b = left(env), right(env)
            if isinstance(a, str) or isinstance(b, str):  # "ab" * 10**12 would try to allocate it
                raise ExprError(f"{sym!r} needs numbers, got {a!r} and {b!r}")
            return op(a, b)

        return binop
    if isinstance(node, ast.UnaryOp):
        operand = _closure(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if isinstance(node.op, ast.USub):
            return lambda env: -operand(env)
        return lambda env: +operand(env)
    if isinstance(node, ast.BoolOp):
        parts = [_closure(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if isinstance(node, ast.Compare):
        first = _closure(node.left)
        pairs = [(_CMP[type(op)], _closure(c)) for op, c in zip(node.ops, node.comparators)]

        def compare(env):
            left = first(env)
            for op, comp in pairs:
                right = comp(env)
                if not op(left, right):
                    return False
                left = right
            return True

        return compare
    # ast.Call, the last kind of expression compile_expr lets through
    fn, args = _FUNCS[node.func.id], [_closure(a) for a in node.args]
    return lambda env: fn(*(a(env) for a in args))

"""A tiny, safe expression language for `where:` filters and family rules.

Grammar: numbers, strings, parameter names, + - * / // %, comparisons, and/or/not,
min(...), max(...). Anything else is rejected when the spec is loaded, not when it runs.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Iterable

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUNCS = {"min": min, "max": max}


class ExprError(ValueError):
    pass


def compile_expr(text: str, names: Iterable[str]) -> ast.Expression:
    """Parse and check an expression; raise ExprError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expected a non-empty expression string")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"not a valid expression ({e.msg}): {text!r}") from None
    known = set(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in known and node.id not in _FUNCS:
                raise ExprError(f"unknown name {node.id!r} in {text!r}; known: {', '.join(sorted(known))}")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise ExprError(f"only min(...) and max(...) may be called, in {text!r}")
        elif not isinstance(node, (ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp,
                                   ast.Constant, ast.Load, ast.And, ast.Or, ast.Not, ast.USub,
                                   ast.UAdd, *_BIN, *_CMP)):
            raise ExprError(f"unsupported syntax {type(node).__name__} in {text!r}")
    return tree


def evaluate(tree: ast.Expression, env: dict[str, Any]) -> Any:
    return _eval(tree.body, env)


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, env) for v in node.values)
        return any(_eval(v, env) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](*(_eval(a, env) for a in node.args))
    raise ExprError(f"unsupported syntax {type(node).__name__}")

"""Size expressions in task files (``"2*M*N*K"``, ``"rows*cols"``), evaluated without ``eval``."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping

_BINARY: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS: dict[str, Callable[..., int]] = {"min": min, "max": max}


class ExpressionError(ValueError):
    pass


def names_in(expression: str) -> set[str]:
    """The size names an expression refers to (raises ExpressionError when it does not parse)."""
    tree = _parse(expression)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCTIONS}


def evaluate(expression: str | int, sizes: Mapping[str, int]) -> int:
    """Evaluate an integer expression over named sizes: + - * // % **, min(), max(), parentheses."""
    if isinstance(expression, int):
        return expression
    return int(_eval(_parse(expression).body, sizes, expression))


def _parse(expression: str) -> ast.Expression:
    try:
        return ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse size expression {expression!r}: {exc.msg}") from None


def _eval(node: ast.AST, sizes: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in sizes:
            raise ExpressionError(f"{text!r} uses {node.id!r}, which is not a size; sizes are {sorted(sizes)}")
        return sizes[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left, sizes, text), _eval(node.right, sizes, text))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, sizes, text)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_eval(a, sizes, text) for a in node.args))
    raise ExpressionError(
        f"unsupported syntax in size expression {text!r}: use integers, sizes, + - * // % **, min, max"
    )

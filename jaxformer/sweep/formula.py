"""Hyperparameter formulas of a sweep spec, evaluated without running code.

A formula such as ``"min(1e-2, 3e-3 * (N / 1e5) ** -0.3)"`` or ``"0.99 if N < 1e5 else 0.95"``
is parsed into Python's expression tree and walked by `evaluate`, which knows only:

- numbers (``3e-3``, ``64``, ``true``/``false`` as ``True``/``False``) and the names of `NAMES`;
- arithmetic ``+ - * / // % **``, unary ``+ -`` and ``not``;
- comparisons (``<``, ``<=``, ``==``, ``!=``, ``>``, ``>=``, chained), ``and`` / ``or``;
- conditional expressions ``a if condition else b``;
- calls of the functions in `FUNCTIONS` with positional arguments.

Anything else — attribute access, subscripts, strings, lambdas, comprehensions, keyword
arguments, any other name — is refused with a `FormulaError` naming the offending token,
before anything is evaluated. Powers are computed in floating point, so ``10**10**10``
overflows at once (an error) instead of building a huge integer; every result must be a
finite number (an integer too: within a float's range), ``round``'s digits are within +-400,
and a formula nests at most 100 levels deep. Spec files are shared between people: a formula
must never run code.
"""

from __future__ import annotations

import ast
import math
import operator
import sys
from typing import Callable

# variables a formula may use: the run's exact parameter count N, tokens D, compute C (FLOPs),
# the shaped model's width and depth, and the seed
NAMES = ("N", "D", "C", "d_model", "num_layers", "seed")
_MAX_ROUND_DIGITS = 400  # past a float's 308 decimal digits: round(1, -10**9) would build 10**(10**9) first


def _round(number: float, ndigits: int | None = None, /) -> float:
    """``round``, with ``ndigits`` bounded (`_MAX_ROUND_DIGITS`)."""
    if isinstance(ndigits, int) and abs(ndigits) > _MAX_ROUND_DIGITS:
        raise ValueError(f"round's ndigits must be within -{_MAX_ROUND_DIGITS}..{_MAX_ROUND_DIGITS}")
    return round(number, ndigits)


_round.__qualname__ = "round"  # Python's messages on its arguments ("round() takes ...") name it as written


FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min, "max": max, "abs": abs, "round": _round, "int": int, "float": float,
    "sqrt": math.sqrt, "log": math.log, "log2": math.log2, "log10": math.log10, "exp": math.exp,
    "floor": math.floor, "ceil": math.ceil,
}
CONSTANTS = {"pi": math.pi, "e": math.e}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}
_MAX_LENGTH = 1000
_MAX_DEPTH = 100


class FormulaError(ValueError):
    """A formula that is not a plain arithmetic expression of the allowed names and functions."""


def _describe(node: ast.AST) -> str:
    """The offending token: its source text where it is short, else the kind of construct."""
    kinds = {ast.Attribute: "attribute access", ast.Subscript: "subscript", ast.Lambda: "lambda",
             ast.ListComp: "comprehension", ast.SetComp: "comprehension", ast.DictComp: "comprehension",
             ast.GeneratorExp: "comprehension", ast.NamedExpr: "assignment expression", ast.Starred: "starred argument"}
    text = ast.unparse(node)
    kind = kinds.get(type(node), type(node).__name__)
    return f"{text!r} ({kind})" if len(text) <= 40 else kind


def check(formula: str, names: tuple[str, ...] = NAMES) -> ast.Expression:
    """The parsed tree of ``formula``; raises `FormulaError` on syntax or any construct outside the grammar."""
    if len(formula) > _MAX_LENGTH:
        raise FormulaError(f"formula is longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(formula.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as error:
        raise FormulaError(f"not an expression ({getattr(error, 'msg', 'nested too deeply')})") from None
    if _depth(tree) > _MAX_DEPTH:  # `evaluate` recurses once per level
        raise FormulaError(f"formula nests deeper than {_MAX_DEPTH} levels")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
               ast.Name, ast.Constant, ast.Load, ast.And, ast.Or, *_BINARY, ast.Pow, *_UNARY, *_COMPARE)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise FormulaError(f"{_describe(node)} is not allowed in a formula")
        if isinstance(node, ast.Constant) and (isinstance(node.value, complex)
                                               or not isinstance(node.value, (int, float))):
            raise FormulaError(f"{_describe(node)} is not allowed in a formula (only numbers)")
        if isinstance(node, ast.Name) and node.id not in (*names, *FUNCTIONS, *CONSTANTS):
            raise FormulaError(f"unknown name {node.id!r} (allowed: {', '.join(names)}; "
                               f"functions: {', '.join(FUNCTIONS)})")
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
                raise FormulaError(f"{_describe(node.func)} is not a function a formula may call "
                                   f"(allowed: {', '.join(FUNCTIONS)})")
            if node.keywords:
                raise FormulaError(f"keyword argument {node.keywords[0].arg!r} is not allowed in a formula")
        if isinstance(node, ast.Name) and node.id in FUNCTIONS and not _is_called(tree, node):
            raise FormulaError(f"function {node.id!r} must be called, e.g. {node.id}(N)")
    return tree


def _depth(tree: ast.AST) -> int:
    """The expression tree's depth, counted without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _is_called(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(node, ast.Call) and node.func is name for node in ast.walk(tree))


def evaluate(formula: str, variables: dict[str, float]) -> float | int | bool:
    """The value of ``formula`` with ``variables`` bound (see the module docstring for the grammar)."""
    tree = check(formula, tuple(variables))
    try:
        value = _value(tree.body, variables)
    except (ArithmeticError, ValueError, TypeError) as error:
        raise FormulaError(f"cannot evaluate ({type(error).__name__}: {error})") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise FormulaError(f"evaluates to {value}, not a finite number")
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        digits = int(value.bit_length() * math.log10(2)) + 1  # str() of a huge int is refused past 4300 digits
        raise FormulaError(f"evaluates to an integer of about {digits} digits, past any float")
    return value


def _value(node: ast.AST, variables: dict[str, float]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return variables[node.id] if node.id in variables else CONSTANTS[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, variables), _value(node.right, variables)
        if isinstance(node.op, ast.Pow):  # in floats: 10**10**10 overflows instead of building a huge int
            result = math.pow(float(left), float(right))
            return int(result) if isinstance(left, int) and isinstance(right, int) and right >= 0 else result
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_value(node.operand, variables))
    if isinstance(node, ast.BoolOp):
        value = None
        for child in node.values:  # Python's short-circuit: the first false (and) / true (or) operand
            value = _value(child, variables)
            if bool(value) != isinstance(node.op, ast.And):
                break
        return value
    if isinstance(node, ast.Compare):
        left = _value(node.left, variables)
        for op, comparator in zip(node.ops, node.comparators):
            right = _value(comparator, variables)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _value(node.body if _value(node.test, variables) else node.orelse, variables)
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*(_value(arg, variables) for arg in node.args))
    raise FormulaError(f"{_describe(node)} is not allowed in a formula")  # unreachable after `check`

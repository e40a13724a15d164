"""Safe expressions for constraints and derived values.

An expression such as ``np % npool == 0 and is_square(ndiag)`` is parsed once with
:mod:`ast`, checked against a whitelist of node types, operators and functions, and then
evaluated by walking the tree. Nothing is passed to ``eval``: attribute access, subscripts,
comprehensions, lambdas and calls of anything but the listed functions are refused at parse
time with a message naming the offending part.

Expressions are bounded (see :mod:`tunelab.limits`): their length, node count and nesting
depth at parse time; the integers, strings and tuples they compute before each operation
that could grow them (``**``, ``*``, ``+``), so ``((10**64)**64)**64`` or ``'a' * 10**11``
is refused at once instead of exhausting the CPU or the memory; so is ``round(x, -10**9)``
(the digits ``round`` rounds to are bounded like the integers). ``%`` on a string (printf
formatting, which can pad to any width) is not allowed.

Values are those of the study language: an expression's value is a number, a string or a
boolean (tuples only inside it, for ``in``); a complex number (``(-1) ** 0.5``) is an
evaluation error wherever it appears, like ``sqrt(-1)``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tunelab.limits import LIMITS

__all__ = ["FUNCTIONS", "Expression", "ExpressionError"]


class ExpressionError(ValueError):
    """An expression that is not allowed, refers to an unknown name, or fails to evaluate."""


def _is_square(n: Any) -> bool:
    if isinstance(n, bool) or not isinstance(n, int | float) or n < 0 or n != int(n):
        return False
    root = math.isqrt(int(n))
    return root * root == int(n)


_ROUND_DIGITS = int(LIMITS.integer_bits * math.log10(2))
"""The most digits ``round`` may round to either side (those of the largest integer an
expression may compute): ``round(x, -10**9)`` would compute ``10**(10**9)`` first."""


def _round(number: Any, ndigits: Any = None) -> Any:
    """``round``, with ``ndigits`` bounded by :data:`_ROUND_DIGITS`."""
    if isinstance(ndigits, int) and not isinstance(ndigits, bool) and \
            abs(ndigits) > _ROUND_DIGITS:
        raise ExpressionError(f"round(): ndigits {ndigits} is beyond ±{_ROUND_DIGITS:,} "
                              f"(the digits of a {LIMITS.integer_bits}-bit integer)")
    return round(number, ndigits)


def _is_pow2(n: Any) -> bool:
    if isinstance(n, bool) or not isinstance(n, int | float) or n < 1 or n != int(n):
        return False
    return int(n) & (int(n) - 1) == 0


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "is_square": _is_square,
    "is_pow2": _is_pow2,
    "sqrt": math.sqrt,
    "isqrt": math.isqrt,
    "log2": math.log2,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "round": _round,
}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


@dataclass(frozen=True)
class Expression:
    """A parsed, whitelisted expression and the names it reads."""

    source: str
    tree: ast.Expression
    names: frozenset[str]

    @classmethod
    def parse(cls, source: str) -> Expression:
        """Parse ``source``; raise :class:`ExpressionError` for anything not whitelisted
        or over the size limits."""
        if not isinstance(source, str) or not source.strip():
            raise ExpressionError("an expression must be a non-empty string")
        if len(source) > LIMITS.expression_chars:
            raise ExpressionError(f"longer than {LIMITS.expression_chars:,} characters "
                                  f"({len(source):,})")
        shown = _shorten(source)
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"invalid syntax in {shown!r}: {exc.msg}") from None
        except (RecursionError, MemoryError, ValueError):
            raise ExpressionError(f"{shown!r} is nested too deeply to parse") from None
        _check_size(tree, shown)
        for node in ast.walk(tree):
            _check_node(node, shown)
        func_nodes = {
            id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)
        }
        names = {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in func_nodes
        }
        return cls(source.strip(), tree, frozenset(names))

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        """Evaluate with ``values`` bound to names: a number, string or boolean. Errors, and a
        value of any other type (a tuple, None), become :class:`ExpressionError`."""
        try:
            value = _bounded(_eval(self.tree.body, values))
        except ExpressionError:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise ExpressionError(f"{_shorten(self.source)!r} failed: {exc}") from None
        if not isinstance(value, int | float | str):  # bool is an int
            raise ExpressionError(f"{_shorten(self.source)!r} gives {_shorten(repr(value))}, "
                                  f"a {type(value).__name__}: an expression's value must be a "
                                  "number, string or boolean")
        if isinstance(value, float) and not math.isfinite(value):
            raise ExpressionError(f"{_shorten(self.source)!r} gives {value}: a value that "
                                  "overflowed (or is not a number) is no value to run with")
        return value


def _shorten(source: str, width: int = 80) -> str:
    """``source`` cut for an error message."""
    return source if len(source) <= width else source[:width - 1] + "…"


def _check_size(tree: ast.AST, shown: str) -> None:
    """Refuse trees with too many nodes or nested too deeply (walked without recursion)."""
    count = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, ast.expr_context | ast.operator | ast.unaryop | ast.cmpop |
                      ast.boolop):
            continue
        count += 1
        if count > LIMITS.expression_nodes:
            raise ExpressionError(f"{shown!r} has more than {LIMITS.expression_nodes} terms")
        if depth > LIMITS.expression_depth:
            raise ExpressionError(f"{shown!r} is nested more than "
                                  f"{LIMITS.expression_depth} levels deep")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _bounded(value: Any) -> Any:
    """``value``, or ExpressionError when it is an integer or sequence over the limits, or a
    complex number (which no study value is)."""
    if isinstance(value, complex):
        raise ExpressionError(f"{_shorten(repr(value))} is a complex number (a negative number "
                              "to a fractional power); expressions compute real numbers only")
    if isinstance(value, int) and value.bit_length() > LIMITS.integer_bits:
        raise ExpressionError(f"an integer larger than {LIMITS.integer_bits} bits")
    if isinstance(value, str | tuple) and len(value) > LIMITS.string_chars:
        raise ExpressionError(f"a {'string' if isinstance(value, str) else 'tuple'} longer "
                              f"than {LIMITS.string_chars:,}")
    return value


def _size(value: Any) -> int:
    """What an operand contributes to a result's size: bits of an int, length of a sequence."""
    if isinstance(value, int):
        return abs(value).bit_length()
    if isinstance(value, str | tuple):
        return len(value)
    return 0


def _check_growth(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse, before computing it, an operation whose result would be over the limits."""
    ints = isinstance(left, int) and isinstance(right, int)
    if isinstance(op, ast.Pow):
        if isinstance(right, int | float) and abs(right) > 64:
            raise ExpressionError("exponent larger than 64 is not allowed")
        if ints and right > 0 and _size(left) * right > LIMITS.integer_bits:
            raise ExpressionError(f"a {_size(left)}-bit integer ** {right} is larger than "
                                  f"{LIMITS.integer_bits} bits")
    elif isinstance(op, ast.Mult):
        if ints and _size(left) + _size(right) > LIMITS.integer_bits + 1:
            raise ExpressionError(f"a product larger than {LIMITS.integer_bits} bits")
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | tuple) and isinstance(n, int) and \
                    len(seq) * n > LIMITS.string_chars:
                raise ExpressionError(f"repeating a sequence of {len(seq)} {n} times is "
                                      f"longer than {LIMITS.string_chars:,}")
    elif isinstance(op, ast.Add):
        if isinstance(left, str | tuple) and _size(left) + _size(right) > LIMITS.string_chars:
            raise ExpressionError(f"a concatenation longer than {LIMITS.string_chars:,}")
    elif isinstance(op, ast.Mod) and isinstance(left, str | bytes):
        raise ExpressionError("string formatting with % is not allowed")


def _check_node(node: ast.AST, source: str) -> None:
    allowed = (
        ast.Expression,
        ast.Constant,
        ast.Name,
        ast.Load,
        ast.BinOp,
        ast.UnaryOp,
        ast.BoolOp,
        ast.Compare,
        ast.IfExp,
        ast.Call,
        ast.Tuple,
        ast.List,
        ast.And,
        ast.Or,
        *_BINARY,
        *_UNARY,
        *_COMPARE,
    )
    if not isinstance(node, allowed):
        raise ExpressionError(f"{type(node).__name__} is not allowed in {source!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = ast.unparse(node.func)
            valid = ", ".join(FUNCTIONS)
            raise ExpressionError(f"unknown function {name!r} in {source!r}; allowed: {valid}")
        if node.keywords:
            raise ExpressionError(f"keyword arguments are not allowed in {source!r}")
    if isinstance(node, ast.Constant) and not isinstance(
        node.value, int | float | str | bool | type(None)
    ):
        raise ExpressionError(f"constant {node.value!r} is not allowed in {source!r}")


def _eval(node: ast.AST, values: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        if node.id in values:
            return values[node.id]
        if node.id in ("True", "False", "None"):  # pragma: no cover - parsed as Constant
            return {"True": True, "False": False, "None": None}[node.id]
        raise ExpressionError(f"unknown name {node.id!r}")
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        _check_growth(node.op, left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, values)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, values)
            if result:
                return result
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, values) else node.orelse, values)
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)  # guaranteed by _check_node
        args = [_eval(a, values) for a in node.args]
        return _bounded(FUNCTIONS[node.func.id](*args))
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_eval(e, values) for e in node.elts)
    raise ExpressionError(f"cannot evaluate {type(node).__name__}")  # pragma: no cover

"""Dim expressions: tiny arithmetic over the spec's dims (``"2*I"``, ``"1/sqrt(K)"``),
checked when a spec loads (:func:`_check_expr`) and evaluated without ``eval``
(:func:`eval_expr`), with bounds on exponents, integer widths and length.
"""

from __future__ import annotations

import ast
import math

_ALLOWED_FUNCS = {"sqrt": math.sqrt, "min": min, "max": max, "ceil": math.ceil}
_ARITY = {"sqrt": (1, 1), "ceil": (1, 1), "min": (2, 64), "max": (2, 64)}
MAX_EXPONENT = 64
"""Largest ``**`` exponent a dim expression may use (FLOP counts need 1 or 2)."""
MAX_INT_BITS = 256
"""Widest integer a dim expression may produce on the way (a 70B shape's FLOPs take ~50)."""
MAX_EXPR_CHARS = 400
"""Longest dim expression (the catalogue's longest is ~40 characters)."""


def eval_expr(expr: str | int | float, dims: dict[str, int]) -> float | int:
    """Evaluate a dim expression such as ``"2*I"`` or ``"1/sqrt(K)"``.

    Only numbers, dim names, ``+ - * / // % **``, parentheses and ``sqrt/min/max/ceil``
    are accepted. Raises ``ValueError`` naming the unknown dim or the bad construct, a
    division by zero, an exponent beyond :data:`MAX_EXPONENT` or an integer wider than
    :data:`MAX_INT_BITS` bits (``"9**9**9"`` would compute for hours).
    """
    if isinstance(expr, (int, float)):
        return expr
    tree = ast.parse(expr, mode="eval")

    def bounded(x):
        if isinstance(x, complex):
            raise ValueError(f"in expression {expr!r}: a complex value ({x})")
        if isinstance(x, int) and x.bit_length() > MAX_INT_BITS:
            raise ValueError(f"in expression {expr!r}: an intermediate value is wider than {MAX_INT_BITS} bits")
        if isinstance(x, float) and abs(x) > 2.0**MAX_INT_BITS:
            raise ValueError(f"in expression {expr!r}: an intermediate value beyond 2**{MAX_INT_BITS}")
        return x

    def ev(node: ast.AST):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return bounded(node.value)
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise ValueError(f"unknown dim {node.id!r} in {expr!r} (known: {sorted(dims)})")
            return dims[node.id]
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
                raise ValueError(f"in expression {expr!r}: exponent {b} is beyond {MAX_EXPONENT}")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                raise ValueError(f"in expression {expr!r}: division by zero")
            ops = {
                ast.Add: lambda: a + b,
                ast.Sub: lambda: a - b,
                ast.Mult: lambda: a * b,
                ast.Div: lambda: a / b,
                ast.FloorDiv: lambda: a // b,
                ast.Mod: lambda: a % b,
                ast.Pow: lambda: a**b,
            }
            if type(node.op) in ops:
                return bounded(ops[type(node.op)]())
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ALLOWED_FUNCS
            and not node.keywords
        ):
            args = [ev(a) for a in node.args]
            lo, hi = _ARITY[node.func.id]
            if not lo <= len(args) <= hi:
                raise ValueError(
                    f"in expression {expr!r}: {node.func.id}() takes "
                    + (f"{lo} argument" if lo == hi else f"at least {lo} arguments")
                    + f", got {len(args)}"
                )
            return bounded(_ALLOWED_FUNCS[node.func.id](*args))
        raise ValueError(f"unsupported construct {ast.dump(node)[:60]} in expression {expr!r}")

    return ev(tree)


def expr_names(expr: str | int | float) -> set[str]:
    """The dim names an expression refers to (empty for numbers)."""
    if isinstance(expr, (int, float)):
        return set()
    return {
        n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name) and n.id not in _ALLOWED_FUNCS
    }


def _check_expr(v: str | int | float) -> str | int | float:
    if isinstance(v, str):
        if len(v) > MAX_EXPR_CHARS:
            raise ValueError(f"expression of {len(v)} characters (at most {MAX_EXPR_CHARS})")
        try:
            tree = ast.parse(v, mode="eval")
        except SyntaxError as e:
            raise ValueError(f"not an arithmetic expression: {v!r} ({e.msg})") from None
        except (MemoryError, RecursionError):
            raise ValueError(f"expression too deeply nested: {v[:60]!r}...") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and (type(node.value) not in (int, float)):
                raise ValueError(
                    f"in expression {v!r}: {ast.unparse(node)} is not a number (only numbers and dim names)"
                )
            ok = (
                ast.Expression,
                ast.Constant,
                ast.Name,
                ast.BinOp,
                ast.UnaryOp,
                ast.Call,
                ast.Add,
                ast.Sub,
                ast.Mult,
                ast.Div,
                ast.FloorDiv,
                ast.Mod,
                ast.Pow,
                ast.USub,
                ast.Load,
            )
            if not isinstance(node, ok):
                raise ValueError(f"unsupported construct in expression {v!r}")
            if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in _ALLOWED_FUNCS and not node.keywords
            ):
                raise ValueError(
                    f"in expression {v!r}: only {', '.join(sorted(_ALLOWED_FUNCS))}(...) may be "
                    f"called, got {ast.unparse(node.func)}(...)"
                )
    return v

"""Rules on the module's shape: what module level may hold, what code runs at import time
(only cutlass/quack/math constructors), and the constructs a candidate may not use at all
(try, with, global/nonlocal, async, match, generators, string annotations, mutable
defaults; classes other than custom epilogue ops are ``rules_classes``').
"""

from __future__ import annotations

import ast

from .facts import ModuleFacts, names_in_target, snippet, store_targets
from .lists import TRY_STAR

IMPORT_TIME_CALL_ROOTS = ("cutlass", "quack", "math")
"""Roots of the callables allowed at import time (GemmConfig, ColVecLoad, Float32, math.sqrt)."""


def module_statements(m: ModuleFacts) -> None:
    """``module-level-call`` / ``module-level-statement``: module level holds only imports,
    defs, assignments and a docstring (try/class/with/global/async have their own kinds)."""
    for node in m.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.AugAssign)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # docstring / string note
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            m.add(
                "module-level-call",
                node,
                f"module-level call `{snippet(node.value)}`: module level may hold only imports, "
                "defs, assignments and a docstring (no code runs at import time)",
            )
            continue
        if isinstance(node, (ast.Try,) + TRY_STAR):
            continue  # reported as try-except by the node walk
        if isinstance(node, (ast.ClassDef, ast.AsyncFunctionDef, ast.With, ast.AsyncWith, ast.Global, ast.Nonlocal)):
            continue  # reported by their own kinds
        what = type(node).__name__.lower()
        extra = " (remove the __main__/test block)" if isinstance(node, ast.If) else ""
        m.add(
            "module-level-statement",
            node,
            f"module-level `{what}` statement: module level may hold only imports, defs, "
            f"assignments and a docstring{extra}",
        )


def import_time_calls(m: ModuleFacts) -> None:
    """Code that runs at import: module-level assignment values and annotations, default
    arguments, annotations of functions, decorators and their arguments. Only
    cutlass/quack/math constructors and the module's custom op classes may be called there
    (no torch, no builtins), never
    with one of the candidate's functions as an argument (a library call could run it
    at import), and defaults and annotations hold no calls at all.
    Module-level values are not lists/dicts/sets (shared mutable state)."""
    exprs: list[tuple[ast.AST, str]] = []
    for node in m.tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            exprs.append((node.value, "module-level value"))
            names = [n for t in store_targets(node) for n in names_in_target(t)]
            for sub in ast.walk(node.value):
                if isinstance(sub, (ast.List, ast.Dict, ast.Set)) and names != ["__all__"]:
                    m.add(
                        "module-level-container",
                        sub,
                        f"`{snippet(sub)}` at module level is mutable state shared by every call; "
                        "use a tuple or build it inside the entry",
                    )
        if isinstance(node, ast.AnnAssign):
            exprs.append((node.annotation, "annotation"))
    for node in ast.walk(m.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in [*node.args.defaults, *node.args.kw_defaults]:
                if d is not None:
                    exprs.append((d, "default argument"))
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    exprs.append((arg.annotation, "annotation"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            exprs.append((node.returns, "annotation"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if not m.is_gemm_epilogue(target):
                    m.add(
                        "import-time-call",
                        dec,
                        f"decorator `{snippet(dec)}`: only quack's @gemm_epilogue(...) may decorate a "
                        "function (a decorator is code that runs at import time)",
                    )
                elif isinstance(dec, ast.Call):
                    exprs += [(x, "decorator argument") for x in [*dec.args, *(k.value for k in dec.keywords)]]
    for e, where in exprs:
        if where == "annotation":
            for sub in ast.walk(e):
                if isinstance(sub, ast.Name) and (sub.id in m.module_data or sub.id in m.module_defs):
                    m.add(
                        "string-annotation",
                        sub,
                        f"annotation `{snippet(e)}` names `{sub.id}`, a value of this module: annotations may "
                        "only name types (library code may evaluate them: typing.get_type_hints)",
                    )
        for sub in ast.walk(e):
            if isinstance(sub, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.NamedExpr, ast.Lambda)):
                m.add(
                    "import-time-call",
                    sub,
                    f"`{snippet(sub)}` in a {where}: comprehensions, lambdas and `:=` are code; write the value out",
                )
            if not isinstance(sub, ast.Call):
                continue
            q = m.qualname(sub.func) or ""
            if where not in ("default argument", "annotation") and m.is_op_class_call(sub):
                continue  # constructing a custom op: rules_classes.op_class_uses judges it
            if where in ("default argument", "annotation") or q.split(".")[0] not in IMPORT_TIME_CALL_ROOTS:
                m.add(
                    "import-time-call",
                    sub,
                    f"`{snippet(sub)}` runs at import time ({where}): only cutlass/quack/math constructors "
                    "may be called there (GemmConfig(...), ColVecLoad(...)); allocate and compute in the entry, per call",
                )
                continue
            for arg in [*sub.args, *(k.value for k in sub.keywords)]:
                if isinstance(arg, ast.Name) and arg.id in m.module_defs:
                    m.add(
                        "import-time-call",
                        sub,
                        f"`{snippet(sub)}` passes your function `{arg.id}` to a library call at import time "
                        "(the library could run it there)",
                    )


def try_except(m: ModuleFacts, node: ast.AST) -> None:
    m.add("try-except", node, "try/except is not allowed: a failing kernel must fail loudly, never fall back silently")


def with_statement(m: ModuleFacts, node: ast.AST) -> None:
    m.add(
        "with-statement", node, "`with` blocks are not allowed (no contexts, streams or grad modes in candidate code)"
    )


def global_nonlocal(m: ModuleFacts, node: ast.Global | ast.Nonlocal) -> None:
    m.add(
        "global-nonlocal",
        node,
        f"`{type(node).__name__.lower()} {', '.join(node.names)}` is not allowed: no state may live across calls",
    )


def async_code(m: ModuleFacts, node: ast.AST) -> None:
    m.add("async", node, "async code is not allowed")


def match_statement(m: ModuleFacts, node: ast.Match) -> None:
    m.add(
        "match-statement",
        node,
        "`match` is not allowed: class patterns read attributes by name "
        "(dunders included), outside every attribute check",
    )


def generator(m: ModuleFacts, node: ast.AST) -> None:
    m.add(
        "generator", node, "generator functions (`yield`) are not allowed: a generator's frame keeps state across calls"
    )


def string_annotations(m: ModuleFacts, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.AnnAssign | ast.arg) -> None:
    """``string-annotation``: a string literal anywhere in a return, variable or parameter annotation."""
    anns = [node.returns] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else [node.annotation]
    for ann in anns:
        for sub in ast.walk(ann) if ann is not None else ():
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                m.add(
                    "string-annotation",
                    sub,
                    f"string annotation `{snippet(sub)}`: typing/inspect/functools evaluate string annotations as code; "
                    "annotate with plain names or not at all",
                )


def mutable_defaults(m: ModuleFacts, node: ast.FunctionDef | ast.Lambda) -> None:
    """``mutable-default``: a list/dict/set display or constructor as a default argument."""
    args = node.args
    for d in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
        if isinstance(d, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
            isinstance(d, ast.Call)
            and isinstance(d.func, ast.Name)
            and d.func.id in ("dict", "list", "set", "bytearray")
        ):
            m.add("mutable-default", d, f"mutable default argument `{snippet(d)}`: it keeps state across calls")

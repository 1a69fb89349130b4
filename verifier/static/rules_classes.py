"""Rules on custom epilogue ops: the one kind of class a candidate may define.

A class is allowed only as a custom op over one of quack's op bases
(:data:`~coda_agent.verifier.static.op_bases.OP_BASES`): defined at module level with that
one base and nothing else in its header (no metaclass, keywords or decorators), a body
of a docstring, the class attributes the base reads as configuration (set to one of the
base's literals) and the device hooks the base declares, with the base's exact
parameters. Everything else an op has -- ``__init__``, host-time hooks, dunders -- stays
quack's. A hook is an epilogue body (every epilogue rule applies to it) that computes
from its arguments only: it never reads ``self``, so the op object (and through it the
host methods, such as ``to_params``, whose getattr is a gadget:
tests/verifier/corpus/getattr_gadget_exec.py) is out of reach. The class is used only by
constructing it where it is named, at import time (a module-level value or a
``@gemm_epilogue`` declaration), with literal arguments.

What that leaves out, on purpose: state (no class attributes but the base's literals, no
attribute or item stores anywhere), code at class creation (no metaclass,
``__init_subclass__``, decorators, calls in the body), callables in attributes, host code
in the op (no host hook), and ``super()`` (a banned builtin).
"""

from __future__ import annotations

import ast

from . import op_bases
from .facts import ModuleFacts, binds, literal_name, snippet

FIX = (
    "a custom epilogue op is a module-level `class Name(<op base>):` holding a docstring, the "
    "base's class attributes and its device hooks (" + op_bases.allowed_bases() + ")"
)


def op_class(m: ModuleFacts, node: ast.ClassDef) -> None:
    """``class-definition`` for a class that is no custom op (where it stands, its header,
    its base); ``op-class`` for what a custom op's body holds."""
    if node not in m.tree.body:
        m.add(
            "class-definition",
            node,
            f"class `{node.name}` is defined inside a function or class: {FIX}; otherwise write plain functions",
        )
        return
    if node.decorator_list or node.keywords:
        m.add(
            "class-definition",
            node,
            f"class `{node.name}`: no decorators, metaclass= or other keywords on an op class "
            f"(code that runs when the class is created); {FIX}",
        )
    base = node.bases[0] if len(node.bases) == 1 else None
    q = m.qualname(base) if isinstance(base, (ast.Name, ast.Attribute)) else None
    rules = op_bases.op_base(q) if q else None
    if rules is None:
        got = ", ".join(snippet(b) for b in node.bases) or "no base"
        m.add(
            "class-definition",
            node,
            f"class `{node.name}({got})`: a class must have exactly one base, one of quack's op bases; "
            f"{FIX}; otherwise write plain functions",
        )
        return
    op_class_body(m, node, rules)


def op_class_body(m: ModuleFacts, node: ast.ClassDef, rules: op_bases.OpBase) -> None:
    seen: set[str] = set()
    hooks = ", ".join(f"def {h}({', '.join(p)})" for h, p in rules.hooks.items())
    attrs = "; ".join(f"{a} = one of {list(v)}" for a, v in rules.attrs.items())
    for i, stmt in enumerate(node.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            if isinstance(stmt.value.value, str):
                continue
        if isinstance(stmt, ast.Pass):
            continue
        name = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            v = stmt.value
            if name in rules.attrs and isinstance(v, ast.Constant) and v.value in rules.attrs[name]:
                if name in seen:
                    m.add("op-class", stmt, f"`{name}` is set twice in class `{node.name}`; set it once")
                seen.add(name)
                continue
            m.add(
                "op-class",
                stmt,
                f"`{snippet(stmt)}` in op class `{node.name}`: the only class attributes are the base's "
                f"configuration, as literals ({attrs or 'none for this base'}); no other attribute, "
                "value or callable (state kept across calls)",
            )
            continue
        if isinstance(stmt, ast.FunctionDef) and stmt.name in rules.hooks:
            if stmt.name in seen:
                m.add(
                    "op-class", stmt, f"hook `{stmt.name}` is defined twice in class `{node.name}`; the last one wins"
                )
            seen.add(stmt.name)
            hook(m, node, stmt, rules.hooks[stmt.name])
            continue
        what = (
            f"method `{stmt.name}`"
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            else f"`{snippet(stmt)}`"
        )
        m.add(
            "op-class",
            stmt,
            f"{what} in op class `{node.name}`: an op class overrides only the base's device hooks "
            f"({hooks}) and sets its configuration ({attrs or 'none'}); __init__, host-time methods, "
            "dunders and other statements stay quack's",
        )


def hook(m: ModuleFacts, cls: ast.ClassDef, fn: ast.FunctionDef, params: tuple[str, ...]) -> None:
    """A hook: no decorators, exactly the base's parameters, and no use of ``self``."""
    a = fn.args
    got = tuple(p.arg for p in a.args)
    if fn.decorator_list or a.posonlyargs or a.vararg or a.kwarg or a.kwonlyargs or a.defaults or got != params:
        m.add(
            "op-class",
            fn,
            f"hook `{cls.name}.{fn.name}` must be `def {fn.name}({', '.join(params)}):` exactly "
            "(the base's parameters; no decorators, defaults, *args, **kwargs or keyword-only)",
        )
    me = got[0] if got else None
    for n in ast.walk(fn):
        if n is not fn and isinstance(n, ast.Name) and n.id == me and isinstance(n.ctx, ast.Load):
            m.add(
                "op-class",
                n,
                f"`{snippet(m.parents.get(n) or n)}` in hook `{cls.name}.{fn.name}` reads `{me}`: a hook "
                "computes from its other arguments and module-level constants only (the op object "
                "reaches quack's host methods)",
            )


def op_class_uses(m: ModuleFacts) -> None:
    """``op-class``: a custom op class is only constructed, where it is named, at import time
    (a module-level value or a ``@gemm_epilogue`` declaration), with literal arguments and a
    literal name; ``name-redefined``: its name is bound once."""
    if not m.class_names:
        return
    counts: dict[str, int] = {}
    for n in ast.walk(m.tree):
        for name in binds(n):
            counts[name] = counts.get(name, 0) + 1
    for name in sorted(m.class_names):
        if counts.get(name, 0) > 1:
            m.add(
                "name-redefined",
                next(n for n in m.tree.body if isinstance(n, ast.ClassDef) and n.name == name),
                f"`{name}` names a custom op class and is bound again elsewhere: bind it once",
            )
    for n in ast.walk(m.tree):
        if not (isinstance(n, ast.Name) and n.id in m.class_names and isinstance(n.ctx, ast.Load)):
            continue
        call = m.parents.get(n)
        if not (isinstance(call, ast.Call) and call.func is n):
            m.add(
                "op-class",
                n,
                f"op class `{n.id}` is used as a value (`{snippet(call or n)[:60]}`): construct it where "
                f'you name it, `{n.id}("name")`, in a @gemm_epilogue declaration or a module-level assignment',
            )
            continue
        if not at_import_time(m, call):
            m.add(
                "op-class",
                call,
                f"`{snippet(call)}` constructs an op at run time: construct ops at import time, in a "
                "@gemm_epilogue declaration or a module-level assignment",
            )
        args = [*call.args, *(k.value for k in call.keywords)]
        if any(k.arg is None for k in call.keywords) or not all(isinstance(x, ast.Constant) for x in args):
            m.add(
                "op-class",
                call,
                f'`{snippet(call)}`: an op\'s arguments are literals (its name, numbers), as in `{n.id}("name")`',
            )
        elif literal_name(call) is None:
            m.add("op-class", call, f'`{snippet(call)}`: give the op its name first, `{n.id}("name", ...)`')


def at_import_time(m: ModuleFacts, node: ast.AST) -> bool:
    """True inside a module-level assignment's value or a module-level def's decorators."""
    child, up = node, m.parents.get(node)
    while up is not None:
        if isinstance(up, (ast.Assign, ast.AnnAssign)) and up in m.tree.body:
            return child is up.value
        if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return up in m.tree.body and child in up.decorator_list
        if isinstance(up, (ast.Lambda, ast.stmt)):
            return False
        child, up = up, m.parents.get(up)
    return False

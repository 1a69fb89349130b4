"""Rules against state that survives a call: no attribute or item stores, no augmented
assignment in host code, no container-mutating calls; and an ownership analysis per
function that names the specific case (module-level or closure containers, locals aliasing
them, parameters defaulting to them, the entry writing into its inputs, imported state).
"""

from __future__ import annotations

import ast

from .facts import ModuleFacts, is_alias_expr, own_nodes, root_name, snippet, store_targets
from .lists import BANNED_BUILTINS, BUILTIN_NAMES, METADATA_ATTRS, MUTATING_METHODS


def attribute_write(m: ModuleFacts, node: ast.Attribute) -> None:
    """``attribute-write``: any store to or deletion of an attribute (assignment, ``for`` and
    comprehension targets alike)."""
    if isinstance(node.ctx, (ast.Store, ast.Del)):
        root = m.qualname(node)
        whose = f" (an attribute of the imported `{root.rsplit('.', 1)[0]}`)" if root else ""
        m.add(
            "attribute-write",
            node,
            f"store to attribute `{snippet(node)}`{whose}: candidate code must not "
            "patch modules, functions or objects (in any form: assignment, for or comprehension target)",
        )


def subscript_store(m: ModuleFacts, node: ast.Subscript) -> None:
    """``subscript-store``: any item assignment or deletion."""
    if isinstance(node.ctx, (ast.Store, ast.Del)):
        m.add(
            "subscript-store",
            node,
            f"item store `{snippet(node)}`: no item assignment or deletion in candidate code (results "
            "come from the kernels; containers are built whole, never updated)",
        )


def augmented_assignment(m: ModuleFacts, node: ast.AugAssign) -> None:
    """``augmented-assignment``: ``x += y`` outside an epilogue body (in place on lists, dicts, tensors)."""
    if not m.in_epilogue_fn(node):
        m.add(
            "augmented-assignment",
            node,
            f"`{snippet(node)}`: augmented assignment updates lists, dicts and tensors in place "
            "(state across calls through aliases); write `x = x + y`",
        )


def container_mutation(m: ModuleFacts, node: ast.Call) -> None:
    """``container-mutation``: a mutating method called on any receiver not reached through an import."""
    if isinstance(node.func, ast.Attribute) and node.func.attr in MUTATING_METHODS:
        # Receivers reached through an import (``operator.add``, ``fe.REGISTRY.clear``) are
        # functions, or imported state that imported_state reports by name.
        if m.qualname(node.func.value) is None:
            m.add(
                "container-mutation",
                node,
                f"`{snippet(node)}` mutates its receiver: candidate code builds values and never "
                "updates containers (no state may survive a call)",
            )


def functions_state(m: ModuleFacts) -> None:
    """State mutation by every function and lambda (:func:`function_state`) and on imported objects."""
    for node in ast.walk(m.tree):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            function_state(m, node)
    imported_state(m)


def imported_state(m: ModuleFacts) -> None:
    """Subscript stores and mutating calls on objects reached through an import
    (``fe.TORCH_OP_EPI_MODS.clear()``), anywhere in the module."""

    def imported(node: ast.AST) -> bool:
        r = root_name(node)
        return r is not None and r in m.aliases and m.aliases[r].split(".")[0] in ("torch", "quack", "cutlass")

    for n in ast.walk(m.tree):
        for t in store_targets(n):
            for e in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                if isinstance(e, ast.Subscript) and imported(e):
                    m.add("module-state-mutation", n, f"`{snippet(n)}` mutates state of an imported module")
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, (ast.Attribute, ast.Subscript))
        ):
            meth = n.func.attr
            if meth in MUTATING_METHODS and imported(n.func.value):
                m.add("module-state-mutation", n, f"`{snippet(n)}` mutates state of an imported module")


def function_state(m: ModuleFacts, fn: ast.FunctionDef | ast.Lambda) -> None:
    args = fn.args
    params = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    if args.vararg:
        params.append(args.vararg.arg)
    if args.kwarg:
        params.append(args.kwarg.arg)
    body_nodes = list(own_nodes(fn))
    local: set[str] = set(params)
    for n in body_nodes:
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            local.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn:
            local.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                local.add((a.asname or a.name).split(".")[0])
    # Parameters whose default is shared state, and locals aliasing shared state.
    tainted: set[str] = set()
    all_defaults = list(zip(reversed([*args.posonlyargs, *args.args]), reversed(args.defaults), strict=False))
    all_defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=False) if d is not None]
    for a, d in all_defaults:
        r = root_name(d)
        if r is not None and r in m.module_data:
            tainted.add(a.arg)

    def shared(name: str | None) -> bool:
        if name is None:
            return False
        if name in tainted:
            return True
        if name in local or name in m.aliases or name in m.module_defs:
            return False
        return name not in BANNED_BUILTINS and name not in BUILTIN_NAMES

    for _ in range(2):  # aliasing fixpoint (a = SHARED; b = a[0])
        for n in body_nodes:
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                if is_alias_expr(n.value) and shared(root_name(n.value)):
                    tainted.add(n.targets[0].id)

    label = "lambda" if isinstance(fn, ast.Lambda) else f"function `{fn.name}`"
    is_entry = isinstance(fn, ast.FunctionDef) and fn.name == m.spec.entry.function and fn in m.tree.body
    inputs: set[str] = set()
    if is_entry:
        inputs = {a.arg for a in [*args.posonlyargs, *args.args]}
        for _ in range(2):
            for n in body_nodes:
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                    if isinstance(n.value, (ast.Name, ast.Subscript, ast.Attribute)) and root_name(n.value) in inputs:
                        if not (isinstance(n.value, ast.Attribute) and n.value.attr in METADATA_ATTRS):
                            inputs.add(n.targets[0].id)
    for n in body_nodes:
        if is_entry and isinstance(n, (ast.Assign, ast.AugAssign)):
            tgts = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in tgts:
                for e in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                    if isinstance(e, ast.Subscript) and root_name(e) in inputs:
                        m.add(
                            "input-mutation",
                            n,
                            f"`{snippet(n)}` writes into the input `{root_name(e)}` (or a view of it): "
                            "inputs are read-only; write results into fresh outputs",
                        )
    for n in body_nodes:
        for t in store_targets(n):
            if isinstance(t, (ast.Tuple, ast.List)):
                elts = list(t.elts)
            else:
                elts = [t]
            for e in elts:
                if isinstance(e, ast.Starred):
                    e = e.value
                if isinstance(e, ast.Subscript) and shared(root_name(e)):
                    m.add(
                        "module-state-mutation",
                        n,
                        f"{label} mutates `{root_name(e)}`, which it does not own (`{snippet(n)}`): "
                        "state kept across calls (caches, counters) is not allowed",
                    )
                elif isinstance(e, ast.Name) and isinstance(n, ast.AugAssign) and e.id in tainted:
                    m.add(
                        "module-state-mutation",
                        n,
                        f"{label} updates `{e.id}` in place, an alias of state it does not own (`{snippet(n)}`)",
                    )
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            meth = n.func.attr
            recv = n.func.value
            if (meth in MUTATING_METHODS or (meth.endswith("_") and not meth.startswith("_"))) and shared(
                root_name(recv)
            ):
                m.add(
                    "module-state-mutation",
                    n,
                    f"{label} calls `.{meth}()` on `{root_name(recv)}`, which it does not own "
                    f"(`{snippet(n)}`): state kept across calls (caches, counters) is not allowed",
                )
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id == "next"
            and n.args
            and shared(root_name(n.args[0]))
        ):
            m.add(
                "module-state-mutation",
                n,
                f"{label} advances the iterator `{root_name(n.args[0])}`, which it does not own (`{snippet(n)}`): state kept across calls",
            )
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id in ("dict", "list", "set")
            and n.func.attr in MUTATING_METHODS
            and n.args
            and shared(root_name(n.args[0]))
        ):
            m.add("module-state-mutation", n, f"{label} mutates `{root_name(n.args[0])}` through `{snippet(n.func)}`")

"""Rules on imports and on names rooted in an import: the import allow-list, and what
``torch.<x>``, ``operator.<x>``, ``functools.<x>`` and the allowed libraries' names may be
(resolved by introspection of the libraries: :mod:`~coda_agent.verifier.static.surface`).
"""

from __future__ import annotations

import ast

from . import surface
from .facts import ModuleFacts, snippet
from .lists import (
    CAST_METHODS,
    FUNCTOOLS_CACHES,
    JUDGED_ELSEWHERE,
    OPERATOR_BANNED,
    REEXPORTED_MODULES,
    REFLECTIVE_ATTRS,
    STREAM_RE,
    TORCH_ALLOWED,
    TORCH_MATH,
    TORCH_RUNTIME,
    VALUE_ATTRIBUTES,
    VALUE_MATH_METHODS,
    import_msg,
    torch_api_msg,
    torch_math_msg,
)


def import_allowed(module: str) -> bool:
    """True when ``module`` (a dotted name) is on the candidate import allow-list."""
    return surface.module_import_allowed(module)


def imports(m: ModuleFacts) -> None:
    """``banned-import``: every import outside the allow-list, relative and star imports,
    stdlib modules reached through an allowed package; ``from M import n`` of an allowed
    module is judged like ``M.n`` where it stands (:func:`check_qualified`)."""
    for node in ast.walk(m.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not import_allowed(a.name):
                    m.add("banned-import", node, import_msg(a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                m.add("banned-import", node, "relative imports are not allowed: the candidate is a single module")
                continue
            mod = node.module or ""
            for a in node.names:
                if a.name == "*":
                    m.add(
                        "banned-import", node, f"`from {mod} import *` hides which names are used; import them by name"
                    )
                    continue
                full = f"{mod}.{a.name}"
                if a.name in REEXPORTED_MODULES or a.name in REFLECTIVE_ATTRS:
                    m.add(
                        "banned-import",
                        node,
                        f"`from {mod} import {a.name}` reaches `{a.name}` through an allowed package; "
                        + import_msg(a.name),
                    )
                # `from quack import activation` imports a module; `from torch import empty`
                # imports an attribute (checked like `torch.empty` wherever it is used).
                if import_allowed(mod) or import_allowed(full):
                    if mod != "__future__":
                        # `from torch import matmul` is checked like `torch.matmul`;
                        # `from cutlass.cute import x` resolves x by introspection.
                        check_qualified(m, node, full)
                else:
                    m.add("banned-import", node, import_msg(full if mod in ("quack", "cutlass") else mod))


def check_qualified(m: ModuleFacts, node: ast.AST, q: str) -> None:
    parts = q.split(".")
    if (
        parts[0] == "typing"
        and len(parts) > 1
        and parts[1] in surface.STD_WHITELIST["typing"]
        and not isinstance(node, (ast.Import, ast.ImportFrom))
        and not m.not_a_value(node)
    ):
        # typing.Optional[s] with a run-time string s is a ForwardRef that library code
        # evaluates with get_type_hints (quack's Scalar(..., dtype=...) builds such a type;
        # tests/verifier/test_static.py::test_metaclasses_typing_values_and_callbacks_are_refused);
        # typing names belong in annotations
        m.add(
            "banned-attribute",
            node,
            f"`{q}` is used as a value (`{snippet(m.parents.get(node) or node)[:60]}`): "
            "typing names may appear only in annotations",
        )
        return
    if any(STREAM_RE.search(p) for p in parts[1:]) and parts[0] in ("torch", "cutlass", "quack"):
        m.add(
            "stream-or-sync",
            node,
            f"`{q}`: streams, events, synchronization and CUDA graphs are not allowed in candidate code",
        )
        return
    root = parts[0]
    if root == "torch" and len(parts) >= 2:
        x = parts[1]
        if x.startswith("_"):
            m.add("banned-attribute", node, f"`{q}`: private torch APIs are not allowed")
        elif x in ("ops", "library"):
            m.add("banned-attribute", node, f"`{q}`: torch.ops/torch.library reach kernels behind the verifier's back")
        elif m.torch_allowed(parts):
            pass
        elif x in TORCH_MATH:
            m.add("torch-math", node, torch_math_msg(q, m.spec))
        elif x in TORCH_RUNTIME:
            m.add(
                "banned-attribute",
                node,
                f"`{q}`: the torch runtime, RNG, dispatcher and global settings are off limits to candidate code",
            )
        elif x in TORCH_ALLOWED:
            rest = [p for p in parts[2:] if p in VALUE_MATH_METHODS or p in CAST_METHODS]
            odd = [p for p in parts[2:] if p not in VALUE_ATTRIBUTES and p not in JUDGED_ELSEWHERE]
            if rest:
                m.add("torch-math", node, torch_math_msg(q, m.spec))
            elif odd:
                # torch.<x> is a dtype, class or function, never a module: what lies below it
                # is a value's attribute (`torch.float32.to_params` hides the getattr gadget
                # behind an alias: tests/verifier/corpus/alias_rebinding_gadget.py)
                m.add(
                    "value-attribute",
                    node,
                    f"`{q}`: `.{odd[0]}` is not an attribute candidates may use "
                    f"on `torch.{x}` (allowed on values: {', '.join(sorted(VALUE_ATTRIBUTES))})",
                )
        else:
            m.add("torch-api", node, torch_api_msg(q, m.spec))
    elif root == "operator" and len(parts) >= 2 and parts[1] in OPERATOR_BANNED:
        kind = OPERATOR_BANNED[parts[1]]
        msg = (
            torch_math_msg(q, m.spec)
            if kind == "torch-math"
            else f"`{q}` reaches objects by string or mutates them; not allowed in candidate code"
        )
        m.add(kind, node, msg)
    elif root == "functools" and len(parts) >= 2 and parts[1] in FUNCTOOLS_CACHES:
        m.add("call-cache", node, f"`{q}` caches results across calls; every call must recompute from its inputs")
    else:
        check_surface(m, node, q)


def check_surface(m: ModuleFacts, node: ast.AST, q: str) -> None:
    """Resolve ``q`` by introspection of the allowed libraries (never the candidate) and
    reject modules outside the allow-list, re-exported foreign objects and unknown names."""
    res = surface.judge(q)
    if res is None:
        return
    kind, msg, is_module = res
    if not is_module:
        m.add(kind, node, msg)
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return
    parent = m.parents.get(node)
    if (
        isinstance(parent, ast.Assign)
        and node is parent.value
        and all(isinstance(t, ast.Name) for t in parent.targets)
        and parent in m.tree.body
    ):
        # `cute = cutlass.cute` at module level: an alias, resolved through m.aliases.
        # Inside a function it would not be (aliases are module-level only), so
        # `cu = cutlass.cute; cu.make_ptr(...)` would go unjudged.
        return
    m.add(
        "banned-attribute",
        node,
        f"the module `{msg}` may only be used as `{q}.<name>` (not passed around or stored as a value)",
    )

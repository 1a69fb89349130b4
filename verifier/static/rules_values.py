"""Rules on names, attributes and values: banned builtins and dunders, what an attribute
of a value may be (an allow-list), library callables and epilogue mods called where they
are named, strings kept in place, identity comparisons and string formatting.
"""

from __future__ import annotations

import ast
import re

from . import surface
from .facts import ModuleFacts, inner_private, is_dunder, snippet
from .lists import (
    BANNED_BUILTINS,
    CAST_METHODS,
    HOST_ESCAPE_ATTRS,
    INTROSPECTION_ATTRS,
    JUDGED_ELSEWHERE,
    MUTATING_METHODS,
    POINTER_ATTRS,
    REEXPORTED_MODULES,
    REFERENCE_CHECKED_METHODS,
    REFLECTIVE_ATTRS,
    STREAM_RE,
    TORCH_MATH,
    TORCH_RUNTIME,
    VALUE_ATTRIBUTES,
    builtin_msg,
)
from .rules_imports import check_qualified


def check_name(m: ModuleFacts, node: ast.Name) -> None:
    # No exemption for a name some import or assignment binds: the alias table is
    # module-wide, so `from math import pi as eval` in a helper would free the real `eval`
    # everywhere else. Binding such a name is reported by rules_bindings.bindings.
    if node.id in BANNED_BUILTINS and isinstance(node.ctx, ast.Load):
        m.add("banned-call", node, builtin_msg(node.id))
        return
    if is_dunder(node.id):
        if node.id == "__all__" and isinstance(node.ctx, ast.Store):
            return
        m.add("banned-attribute", node, f"dunder name `{node.id}` is not allowed (no reflection on modules/builtins)")
        return
    if m.is_chain_top(node) and node.id in m.aliases and isinstance(node.ctx, ast.Load):
        q = m.aliases[node.id]
        parent = m.parents.get(node)
        if q == "torch" and not isinstance(parent, (ast.Import, ast.ImportFrom)):
            m.add(
                "banned-attribute",
                node,
                "the torch module may only be used as `torch.<name>` (not passed around or stored as a value)",
            )
            return
        check_qualified(m, node, q)


def check_value_use(m: ModuleFacts, node: ast.Name | ast.Attribute) -> None:
    """``library-alias`` / ``epilogue-attribute``: the rules on calls (banned keywords,
    ``out=``, ``device=`` of allocations, callbacks handed to the library) see the callee
    where the call names it, so a library callable or an epilogue mod may only be
    *called* where it is named: ``alloc = torch.empty; alloc(..., out=x)``,
    ``gm = swiglu_epi.gemm`` and ``swiglu_epi.plan(...).run`` would get banned keywords
    past every rule (tests/verifier/corpus/aliased_banned_keywords.py). Annotations,
    ``isinstance`` class arguments and bare
    decorators are not calls and stay allowed; non-callable library values (dtypes,
    constants) too."""
    if not isinstance(node.ctx, ast.Load) or not m.is_chain_top(node) or m.not_a_value(node):
        return
    parent = m.parents.get(node)
    called = isinstance(parent, ast.Call) and parent.func is node
    if isinstance(node, ast.Name) and any(k.value is node for k in m.prepass_keywords):
        return  # `prepass=fn` in a @gemm_epilogue(...): rules_epilogue.prepass_fns judges it
    if isinstance(node, ast.Name) and node.id in m.local_defs and not called:
        # a def handed to anything as a value reaches library code that may run it, read its
        # annotations or install it (nested defs too, not only module-level ones: e.g. as a
        # class's __init_subclass__)
        m.add(
            "library-callback",
            node,
            f"your function `{node.id}` is used as a value (`{snippet(parent or node)[:60]}`): "
            "call your functions where you name them; none may be passed, stored or returned",
        )
        return
    if isinstance(node, ast.Name) and node.id in m.epilogue_names:
        if not called:
            m.add(
                "library-alias",
                node,
                f"the epilogue mod `{node.id}` is used as a value (`{snippet(parent or node)[:60]}`): "
                f"call it where you name it, `{node.id}(...)` or `{node.id}.gemm(...)`",
            )
        return
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in m.epilogue_names:
        if node.attr != "gemm":
            m.add(
                "epilogue-attribute",
                node,
                f"`{snippet(node)}`: an epilogue mod is used as `mod(...)` or "
                "`mod.gemm(...)` only (`plan()`/`run()` skip quack's host checks of the operands)",
            )
        elif not called:
            m.add(
                "library-alias",
                node,
                f"`{snippet(node)}` is used as a value: call `{snippet(node)}(...)` where you name it",
            )
        return
    if called:
        return
    q = m.qualname(node)
    if q is None or q.split(".")[0] not in ("torch", "cutlass", "quack") or not surface.is_library_callable(q):
        return
    m.add(
        "library-alias",
        node,
        f"`{snippet(node)}` (`{q}`) is used as a value (`{snippet(parent or node)[:60]}`): "
        "call library functions where you name them, so that the rules on their arguments see the call",
    )


def check_attribute(m: ModuleFacts, node: ast.Attribute) -> None:
    attr = node.attr
    if attr.startswith("_") and inner_private(node.value):
        return  # reported once, at the first private link of the chain
    if is_dunder(attr):
        m.add("banned-attribute", node, f"dunder attribute `.{attr}` is not allowed (no reflection: {snippet(node)})")
        return
    if attr in INTROSPECTION_ATTRS:
        m.add(
            "introspection", node, f"`.{attr}` reaches frames/code objects; candidate code must not inspect the harness"
        )
        return
    if attr in REEXPORTED_MODULES and not (
        isinstance(node.value, ast.Name)
        and m.aliases.get(node.value.id) == "torch"
        and attr in TORCH_RUNTIME | TORCH_MATH
    ):
        m.add(
            "banned-attribute",
            node,
            f"`{snippet(node)}` reaches the `{attr}` module through another module: an import in disguise",
        )
        return
    if attr in REFLECTIVE_ATTRS:
        m.add(
            "banned-call",
            node,
            f"`{snippet(node)}`: loading code, reaching objects by name and walking frames/the heap are not allowed",
        )
        return
    if attr in POINTER_ATTRS:
        m.add(
            "data-ptr",
            node,
            f"`.{attr}` exposes raw pointers/storage: outputs must not depend on addresses (no pointer-keyed caches)",
        )
        return
    if attr in HOST_ESCAPE_ATTRS or attr.endswith("Storage"):
        m.add(
            "host-escape",
            node,
            f"`{snippet(node)}`: copies to the host, numpy, files and shared memory are not allowed "
            "(a kernel's host code only allocates, makes views and launches)",
        )
        return
    if attr.startswith("_"):
        m.add(
            "banned-attribute",
            node,
            f"private attribute `{snippet(node)}` is not allowed (private APIs bypass the contract)",
        )
        return
    if not m.is_chain_top(node):
        return
    q = m.qualname(node)
    if q is not None:
        check_qualified(m, node, q)
        return
    if STREAM_RE.search(attr):
        m.add(
            "stream-or-sync",
            node,
            f"`{snippet(node)}`: streams, events, synchronization and CUDA graphs are not allowed in candidate code",
        )


def check_value_attribute(m: ModuleFacts, node: ast.Attribute) -> None:
    """``value-attribute``: an attribute read on a value (not an import-rooted chain, which
    :func:`surface.judge` resolves, nor an epilogue mod, which ``epilogue-attribute``
    judges) must be in :data:`VALUE_ATTRIBUTES` or a ``GemmConfig`` field."""
    attr = node.attr
    if not isinstance(node.ctx, ast.Load) or attr.startswith("_") or attr in JUDGED_ELSEWHERE:
        return  # stores are attribute-writes; the rest have their own, more specific findings
    if STREAM_RE.search(attr) and m.is_chain_top(node):
        return  # the stream rule reports it (it looks at the top of a chain only)
    root = node.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id in m.aliases:
        return
    if isinstance(root, ast.Name) and root.id in m.epilogue_names and node.value is root:
        return  # `mod.gemm`: the epilogue-attribute rule; deeper links are values'
    if attr in VALUE_ATTRIBUTES or attr in surface.config_fields():
        return
    if attr == "out" and isinstance(node.value, ast.Name) and node.value.id in m.module_data:
        m.add(
            "value-attribute",
            node,
            f"`{snippet(node)}`: a grouped-statistics op's writer is declared as "
            f'`GroupedColStatsOut("<name>", {node.value.id})` (quack.epilogue.ops) in extra_ops=; '
            "methods of library objects are off limits",
        )
        return
    m.add(
        "value-attribute",
        node,
        f"`{snippet(node)}`: `.{attr}` is not an attribute candidates may use on a value; "
        "host code reads tensor metadata, makes views and calls epilogue mods (allowed: "
        f"{', '.join(sorted(VALUE_ATTRIBUTES))}, and GemmConfig fields). Library objects' methods are "
        "off limits: some do getattr/setattr by a name they are given",
    )


def method_references(m: ModuleFacts, node: ast.Attribute) -> None:
    """Methods named on a value without being called where named: tensor methods through
    the ``torch.Tensor`` class, references to mutating/in-place methods, to the tensor
    methods the call rules judge (math, allocation, views) and to dtype casts."""
    recv_q = m.qualname(node.value)
    if recv_q == "torch.Tensor" and isinstance(node.ctx, ast.Load):
        m.add(
            "banned-attribute",
            node,
            f"`{snippet(node)}`: tensor methods are reached through tensors, not through the "
            "class (`torch.Tensor.addmm_` was a GEMM and an in-place write in one reference)",
        )
    if (
        isinstance(node.ctx, ast.Load)
        and recv_q is None
        and (
            node.attr in MUTATING_METHODS
            or node.attr in ("send", "throw")
            or (node.attr.endswith("_") and not node.attr.startswith("_"))
        )
    ):
        m.add(
            "mutating-attribute",
            node,
            f"`{snippet(node)}`: a reference to a method that mutates its receiver, drives a generator "
            "or formats/introspects objects is not allowed (called or passed around)",
        )
    parent = m.parents.get(node)
    if (
        isinstance(node.ctx, ast.Load)
        and recv_q is None
        and node.attr in REFERENCE_CHECKED_METHODS
        and not (isinstance(parent, ast.Call) and parent.func is node)
        and not m.in_epilogue_fn(node)
        and not m.is_type_info(node.value)
    ):
        m.add(
            "torch-math",
            node,
            f"`{snippet(node)}`: a reference to a tensor method the rules check where "
            "it is called (math, allocation, views) is not allowed (`mm = x.matmul; mm(w)` hides a GEMM); "
            "call the method where you name it",
        )
    if (
        isinstance(node.ctx, ast.Load)
        and recv_q is None
        and node.attr in CAST_METHODS | {"to"}
        and not (isinstance(parent, ast.Call) and parent.func is node)
    ):
        m.add(
            "precision-cast",
            node,
            f"`{snippet(node)}`: a reference to a dtype-cast method (called "
            "later or passed around, as in `c = x.to; c(torch.float16)`) is not allowed",
        )


def string_constant(m: ModuleFacts, node: ast.Constant) -> None:
    """A string naming a dunder (``banned-attribute``), or a string or bytes constant used as a
    value (``string-value``: see :meth:`~coda_agent.verifier.static.facts.ModuleFacts.string_in_place`)."""
    if isinstance(node.value, str) and is_dunder(node.value):
        m.add(
            "banned-attribute",
            node,
            f"the string {node.value!r} names a dunder attribute: no reflection by name either",
        )
    elif isinstance(node.value, (str, bytes)) and not m.string_in_place(node):
        m.add(
            "string-value",
            node,
            f"the string {node.value[:30]!r} is used as a value (`{snippet(m.parents.get(node) or node)[:60]}`): "
            'strings may appear only as docstrings, dict keys, subscripts (`res["D"]`), keyword values and '
            'arguments of cutlass/quack/torch calls (`ColVecLoad("rstd")`, `mode="acc_pair"`) and in '
            "comparisons; a string bound to a name, concatenated or passed to your own functions can be "
            "%-formatted or turned into an attribute name",
        )


def identity_compare(m: ModuleFacts, node: ast.Compare) -> None:
    """``is``/``is not`` other than against ``None`` (``banned-call``)."""
    if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and not (
        len(node.ops) == 1
        and any(isinstance(x, ast.Constant) and x.value is None for x in (node.left, *node.comparators))
    ):
        m.add(
            "banned-call",
            node,
            f"`{snippet(node)[:60]}`: `is`/`is not` compare object identity, which "
            "tells a library's cached result from a fresh one (a call counter); "
            "use `is None` or `==`",
        )


def formatting(m: ModuleFacts, node: ast.JoinedStr | ast.Set | ast.SetComp | ast.BinOp) -> None:
    """f-strings (outside error messages), set displays and comprehensions, and ``%`` whose
    left operand is a string or whose right operand is not a number by its form (``banned-call``)."""
    if (
        (isinstance(node, ast.JoinedStr) and not m.in_error_message(node))
        or isinstance(node, (ast.Set, ast.SetComp))
        or (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mod)
            and (
                (isinstance(node.left, ast.Constant) and isinstance(node.left.value, (str, bytes)))
                or not m.numeric_evident(node.right)
            )
        )
    ):
        what = {ast.JoinedStr: "f-strings", ast.Set: "set displays", ast.SetComp: "set comprehensions"}.get(
            type(node), "%-formatting"
        )
        hint = (
            "; `a % b` is the modulo only where b is a number by its form (a literal, x.shape[i], "
            "x.size(i), a GemmConfig field, a module-level numeric constant): write `n % 192`"
            if what == "%-formatting"
            else ""
        )
        m.add(
            "banned-call",
            node,
            f"{what} (`{snippet(node)[:60]}`) are not allowed: string conversion and "
            f"set order expose object addresses (a heap fingerprint){hint}",
        )


def str_format(m: ModuleFacts, node: ast.Call) -> None:
    """``str.format`` with attribute/index fields or a non-literal template, and ``format_map``."""
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "format_map"):
        tmpl = node.func.value
        if (
            node.func.attr == "format_map"
            or not (isinstance(tmpl, ast.Constant) and isinstance(tmpl.value, str))
            or re.search(r"\{[^{}]*[.\[][^{}]*\}", tmpl.value)
        ):
            m.add(
                "banned-call",
                node,
                f"`{snippet(node)}`: str.format with attribute/index fields (or a non-literal template) reads attributes by string; use an f-string",
            )

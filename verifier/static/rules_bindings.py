"""Rules on what names bind: names resolve through one module-wide table
(:class:`~coda_agent.verifier.static.facts.ModuleFacts`), so no binding in any scope may
change what a name means elsewhere; and def, parameter and declared names that could reach
a kernel's name may not look like profiler markers.
"""

from __future__ import annotations

import ast

from .facts import ModuleFacts, binds
from .lists import BANNED_BUILTINS, BUILTIN_NAMES, RESERVED_NAME_RE


def bindings(m: ModuleFacts) -> None:
    """Names are resolved through one module-wide table of imports, so a binding in any
    scope must not change what a name means elsewhere (a helper's
    `from math import pi as eval` would free the builtin `eval` in every function, and
    `from torch import float32 as swiglu_epi` would make the epilogue's `plan`/`gemm` aliases
    unchecked). Imports belong at module level (``banned-import``); no scope binds a
    banned builtin's name (``banned-call``); only the module-level defs bind the entry's
    and the epilogues' names (``name-redefined``)."""
    protected = m.epilogue_names | {m.spec.entry.function}
    top = set(map(id, m.tree.body))
    # names the module-level imports bind: a parameter or local named `torch`/`cute`
    # would be resolved as the import (`def f(torch): return torch.float()` passes as the
    # dtype `torch.float`: tests/verifier/corpus/import_name_shadow.py)
    imported = {name for n in m.tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for name in binds(n)}
    for node in ast.walk(m.tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            m.add(
                "banned-import",
                node,
                "imports belong at module level: an import inside a function "
                "rebinds the name for the whole module's checks",
            )
        # module-level defs too: `def isinstance(a, b)` rebinds a trusted name
        for name in binds(node):
            if name in BANNED_BUILTINS:
                m.add(
                    "banned-call",
                    node,
                    f"`{name}` is a builtin candidates may not use; binding that name "
                    "(import alias, assignment, parameter, def) is not allowed either",
                )
            elif name in BUILTIN_NAMES:
                # the checker trusts builtins by name (isinstance() in _not_a_value, next,
                # dict ...): a parameter named `isinstance` would hand library callables
                # around as values (tests/verifier/corpus/builtin_param_alias.py)
                m.add(
                    "banned-call",
                    node,
                    f"`{name}` is the name of a Python builtin: do not rebind it "
                    "(the checks read it as the builtin); choose another name",
                )
            elif name in imported and not isinstance(node, (ast.Import, ast.ImportFrom)):
                m.add(
                    "name-redefined",
                    node,
                    f"`{name}` names a module-level import: no other binding "
                    "of it, in any scope (the checks would read it as the import)",
                )
            elif name in m.alias_targets and node is not m.alias_targets[name]:
                # `DT = torch.float32` makes DT an alias; `DT = Scalar(...)` after it, or a
                # parameter named DT, would hold any value, and DT.to_params would go unjudged
                # as torch.float32.to_params (tests/verifier/corpus/alias_rebinding_gadget.py)
                m.add(
                    "name-redefined",
                    node,
                    f"`{name}` is an alias of `{m.aliases[name]}` (bound at "
                    f"line {m.alias_targets[name].lineno}): no other binding of it, in any scope",
                )
            elif (
                name in protected
                and (id(node) not in top or isinstance(node, ast.arg))
                and not (isinstance(node, ast.Name) and m.is_module_level_target(node))
            ):
                m.add(
                    "name-redefined",
                    node,
                    f"`{name}` names the entry or an epilogue: no other binding of it, in any scope",
                )


def reserved_names(m: ModuleFacts) -> None:
    """``reserved-name``: quack names an epilogue's kernel after its fn
    (``GemmMod_<name>_<digest>``); a launch count that skipped profiler events whose name
    *contains* ``Sync`` would never see a GEMM in a def named ``swiglu_Sync_epi``
    (tests/verifier/corpus/sync_named_kernel.py). The count drops exact names and prefixes
    only (``protocol.gpu_kernels``), which no kernel name matches; this rule is a second
    layer. Every def is checked: the name is the only thing that reaches the kernel's."""
    for node in ast.walk(m.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and RESERVED_NAME_RE.search(node.name):
            m.add(
                "reserved-name",
                node,
                f"`def {node.name}`: names containing sync/memcpy/memset/memory "
                "(any case) are reserved: kernels are named after epilogue fns and the launch count "
                "skips profiler events named like that",
            )
        # operand, output and op names may reach the kernel's name too: parameters, and
        # the strings of the decorator's declarations
        names = []
        if isinstance(node, ast.arg):
            names.append((node.arg, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                names += [
                    (c.value, c) for c in ast.walk(dec) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
        for name, where in names:
            if RESERVED_NAME_RE.search(name):
                m.add(
                    "reserved-name",
                    where,
                    f"`{name}`: operand, output and parameter names containing "
                    "sync/memcpy/memset/memory (any case) are reserved (they can reach a kernel's name, "
                    "which the launch count reads)",
                )

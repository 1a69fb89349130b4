"""Facts about one candidate module, gathered before any rule runs: what each name binds.

The static rules (``rules_*.py``) judge names by what they resolve to, so this is the
one place that says it: the import table (``aliases``: every name an import binds, and the
module-level aliases of import-rooted names), the module's own functions (module-level
``module_defs``, the epilogues, ``local_defs`` at any depth, the prepass fns), its custom op
classes (``class_names``), module-level data, numeric
constants (numbers by their form), each node's parent, and predicates about where a node
stands (a library call's argument, an annotation, an epilogue body, an error message).
The findings the rules report are collected here too (:meth:`ModuleFacts.add`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..spec import KernelSpec
from ..verdict import Finding
from . import surface
from .lists import PASS_THROUGH_CALLS, TORCH_DTYPES


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def inner_private(node: ast.AST) -> bool:
    while isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return True
        node = node.value
    return False


def snippet(node: ast.AST | None, limit: int = 80) -> str:
    if node is None:
        return ""
    try:
        s = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every parsed node
        s = type(node).__name__
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def looks_like_cast(node: ast.Call) -> bool:
    # `.float()` etc. cast whatever they are given (`.half(**{})` too); `.type()` without an
    # argument only names the type, `.type(x)`/`.type(dtype=x)`/`.type_as(other=x)` cast.
    f = node.func
    assert isinstance(f, ast.Attribute)
    if f.attr in ("type", "type_as"):
        return bool(node.args or node.keywords)
    return True


def is_device_attr(node: ast.AST) -> bool:
    """``<expr>.device``: the one ``.to()`` argument host code needs."""
    return isinstance(node, ast.Attribute) and node.attr == "device"


def is_device_like(node: ast.AST) -> bool:
    """A ``.to()`` argument that names a device, not a dtype: ``<expr>.device``, a string
    that is not a dtype name, ``torch.device(...)``/``<name>.device(...)``."""
    if is_device_attr(node):
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value not in TORCH_DTYPES
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device"


def literal_name(node: ast.AST) -> str | None:
    """``"name"`` or ``Op("name", ...)`` / ``Op(name="name")`` -> ``name``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call):
        if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            return node.args[0].value
        for k in node.keywords:
            if k.arg == "name" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str):
                return k.value.value
    return None


def store_targets(n: ast.AST) -> list[ast.AST]:
    """The targets a statement stores to or deletes (assign, augmented/annotated assign, del)."""
    if isinstance(n, (ast.Assign, ast.Delete)):
        return list(n.targets)
    if isinstance(n, (ast.AugAssign, ast.AnnAssign)):
        return [n.target]
    return []


def root_name(node: ast.AST | None) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def is_alias_expr(node: ast.AST) -> bool:
    """Expressions that may evaluate to (part of) the object they start from."""
    return isinstance(node, (ast.Name, ast.Subscript, ast.Attribute)) or (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "setdefault", "values", "items", "keys")
    )


def names_in_target(t: ast.AST) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        return [n for e in t.elts for n in names_in_target(e)]
    if isinstance(t, ast.Starred):
        return names_in_target(t.value)
    return []


def binds(node: ast.AST) -> list[str]:
    """The names one node binds in its scope: an import (its alias's first part), a stored or
    deleted Name, a parameter, a def or class. (Each node of ``ast.walk`` once: a Name inside a target
    is its own node.)"""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    return []


def bound_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n for t in node.targets for n in names_in_target(t)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return names_in_target(node.target)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def own_nodes(fn: ast.AST):
    """Nodes of a function body, not descending into nested functions/lambdas/classes."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(n))


@dataclass
class Epilogue:
    """One @gemm_epilogue-decorated function and its literal declarations."""

    fn: ast.FunctionDef
    outputs: list[str] = field(default_factory=list)
    sinks: list[str] = field(default_factory=list)
    literal: bool = True
    prepass_outs: list[str] | None = None  # the literal prepass_outs=, None when absent or not literal


class ModuleFacts:
    """What the rules know about one parsed module (see the module docstring)."""

    def __init__(self, spec: KernelSpec, tree: ast.Module):
        self.spec = spec
        self.tree = tree
        self.findings: list[Finding] = []
        self.allowed_torch = set(spec.entry.allowed_torch)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.epilogue_names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.decorator_list}
        self.local_defs = {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        } - self.epilogue_names  # the candidate's own functions, at any depth
        self.aliases: dict[str, str] = {}  # local name -> dotted module/object path
        self.alias_targets: dict[str, ast.Name] = {}  # assignment aliases -> the one Name that binds each
        self._import_table()
        # custom epilogue ops: module-level classes (rules_classes judges them and every use)
        self.class_names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        # module-level defs named by `prepass=` of a @gemm_epilogue(...) (rules_epilogue judges them)
        self.prepass_keywords: list[ast.keyword] = [
            k
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for d in n.decorator_list
            if isinstance(d, ast.Call) and self.is_gemm_epilogue(d.func)
            for k in d.keywords
            if k.arg == "prepass"
        ]
        self.prepass_names = {k.value.id for k in self.prepass_keywords if isinstance(k.value, ast.Name)}
        self.numeric_constants: set[str] = set()
        self._numeric_constant_names()
        self.module_data: set[str] = set()  # module-level names bound by assignment
        self.module_defs: set[str] = set()
        self._module_names()
        self.epilogues: list[Epilogue] = []  # filled by rules_epilogue.epilogue_contract

    def add(self, kind: str, node: ast.AST | int | None, message: str) -> None:
        """Report one finding of ``kind`` at ``node``'s line (or a line number, or none)."""
        line = node if isinstance(node, int) or node is None else getattr(node, "lineno", None)
        self.findings.append(Finding(kind=kind, message=message, line=line))

    # -- what names bind ------------------------------------------------------------
    def _import_table(self) -> None:
        """``aliases``: every name an import binds (any depth: imports elsewhere than at module
        level are reported by ``rules_bindings``) resolved to its dotted path, then the
        module-level assignments of an import-rooted name (``t = torch``, ``mm = torch.matmul``:
        later uses resolve like the original; ``alias_targets`` keeps the one Name that binds
        each). Module level only: an alias assigned inside a function (``c = cute``) would
        otherwise give every other function's ``c`` the import's meaning."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    continue  # relative imports bind nothing here (rules_imports reports them)
                mod = node.module or ""
                for a in node.names:
                    if a.name == "*":
                        continue
                    self.aliases[a.asname or a.name] = f"{mod}.{a.name}"
        for _ in range(2):
            for node in self.tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
                    q = self.qualname(node.value)
                    if q is None:
                        continue
                    for t in node.targets:
                        if isinstance(t, ast.Name) and t.id not in self.aliases:
                            self.aliases[t.id] = q
                            self.alias_targets[t.id] = t

    def _numeric_constant_names(self) -> None:
        """Set ``numeric_constants``: module-level names bound once, anywhere in the module,
        to a numeric literal or arithmetic of literals (``TILE_N = 192``): numbers by their
        form (``numeric_evident``)."""
        counts: dict[str, int] = {}
        for n in ast.walk(self.tree):
            for name in binds(n):
                counts[name] = counts.get(name, 0) + 1
        for _ in range(2):  # constants made of earlier constants (BLOCK = 2 * TILE)
            self.numeric_constants |= {
                node.targets[0].id
                for node in self.tree.body
                if isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and counts.get(node.targets[0].id) == 1
                and self.numeric_evident(node.value)
                and not any(isinstance(x, (ast.Attribute, ast.Call, ast.Subscript)) for x in ast.walk(node.value))
            }

    def _module_names(self) -> None:
        """``module_defs`` (module-level functions) and ``module_data`` (names module-level
        assignments bind, ``__all__`` aside)."""
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.module_defs.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in names_in_target(t):
                        if n != "__all__":
                            self.module_data.add(n)

    # -- where a node stands --------------------------------------------------------
    def qualname(self, node: ast.AST) -> str | None:
        """Dotted path of a Name/Attribute chain rooted at an imported name, else None."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def is_chain_top(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return not (isinstance(parent, ast.Attribute) and parent.value is node)

    def not_a_value(self, node: ast.AST) -> bool:
        """True for a name in an annotation, a decorator, a class's bases or the class argument
        of isinstance()."""
        child, up = node, self.parents.get(node)
        while up is not None:
            if isinstance(up, ast.arg) and up.annotation is child:
                return True
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                up.returns is child or child in up.decorator_list
            ):
                return True
            if isinstance(up, ast.ClassDef) and child in up.bases:
                return True  # a base class: rules_classes judges it
            if isinstance(up, ast.AnnAssign) and up.annotation is child:
                return True
            if (
                isinstance(up, ast.Call)
                and isinstance(up.func, ast.Name)
                and up.func.id in ("isinstance", "issubclass")
                and len(up.args) == 2
                and up.args[1] is child
            ):
                return True
            if isinstance(up, (ast.Tuple, ast.Subscript, ast.BinOp)):  # Optional[torch.Tensor], (A, B), A | B
                child, up = up, self.parents.get(up)
                continue
            return False
        return False

    def is_type_info(self, node: ast.AST) -> bool:
        """``torch.finfo(...)``/``torch.iinfo(...)``: their ``.max``/``.min`` are numbers."""
        return isinstance(node, ast.Call) and self.qualname(node.func) in ("torch.finfo", "torch.iinfo")

    def string_in_place(self, node: ast.Constant) -> bool:
        """True where a string constant cannot become a value the candidate holds: a
        docstring, a dict key, a subscript, a comparison, an error message (``raise``,
        ``assert``'s message), or (anywhere inside) a keyword value
        or an argument of a call to a cutlass/quack/torch callable, an epilogue mod or a custom
        op class, a decorator's arguments, or an op class's attribute value. The string may be inside tuples there (``outputs=("postact",)``)."""
        child, up = node, self.parents.get(node)
        while isinstance(up, ast.Tuple):
            child, up = up, self.parents.get(up)
        if isinstance(up, ast.JoinedStr) or (
            isinstance(up, ast.BinOp) and isinstance(up.op, ast.Mod) and up.left is child
        ):
            return True  # f-strings and %-formatting of a literal have their own finding
        if isinstance(up, ast.Expr):
            return isinstance(child, ast.Constant)  # a docstring or a bare string statement
        if isinstance(up, ast.Dict):
            return any(k is child for k in up.keys)
        if isinstance(up, ast.Subscript):
            return up.slice is child
        if isinstance(up, ast.Compare):
            return True
        if isinstance(up, ast.List):
            child, up = up, self.parents.get(up)
        if isinstance(up, ast.Assign) and up in self.tree.body and [snippet(t) for t in up.targets] == ["__all__"]:
            return True  # __all__ = ["entry"] (a list or tuple of names at module level)
        if isinstance(up, ast.Assign) and isinstance(self.parents.get(up), ast.ClassDef):
            return True  # a class attribute of an op class: rules_classes allows the base's literals only
        if self.in_error_message(node):
            return True  # an error message: no way back to a value (no try/except)
        while up is not None and not isinstance(up, ast.stmt):
            if isinstance(up, ast.keyword):
                call = self.parents.get(up)
                return isinstance(call, ast.Call) and self.is_library_call(call)
            if isinstance(up, ast.Call) and child is not up.func:
                return self.is_library_call(up) or (isinstance(up.func, ast.Attribute) and up.func.attr == "get")
            if not isinstance(up, (ast.Tuple, ast.Dict, ast.Call)):
                return False
            child, up = up, self.parents.get(up)
        return False

    def in_error_message(self, node: ast.AST) -> bool:
        """True inside ``raise ...`` or an ``assert``'s message: text that leaves with the
        exception and never comes back to candidate code (there is no try/except)."""
        stmt = self.parents.get(node)
        while stmt is not None and not isinstance(stmt, ast.stmt):
            stmt = self.parents.get(stmt)
        return isinstance(stmt, ast.Raise) or (
            isinstance(stmt, ast.Assert) and stmt.msg is not None and any(n is node for n in ast.walk(stmt.msg))
        )

    def is_library_call(self, call: ast.Call) -> bool:
        """A call of an import-rooted cutlass/quack/torch callable, or of an epilogue mod,
        that does not hand its argument back: ``cutlass.const_expr("_")`` is ``"_"`` (strings
        glued from it can become dunder names and format strings)."""
        q = self.qualname(call.func) or ""
        if q.rsplit(".", 1)[-1] in PASS_THROUGH_CALLS:
            return False
        return (
            q.split(".")[0] in ("cutlass", "quack", "torch")
            or self.is_epilogue_mod_call(call)
            or self.is_op_class_call(call)
        )

    def is_op_class_call(self, call: ast.Call) -> bool:
        """``Op("name", ...)`` for one of this module's custom op classes: quack's op
        constructor runs (the class may not define ``__init__``)."""
        return isinstance(call.func, ast.Name) and call.func.id in self.class_names

    def numeric_evident(self, e: ast.AST) -> bool:
        """True for an expression that is a number by its form: a numeric literal, a module-level
        numeric constant bound once, ``x.shape[i]``, ``x.size(i)``/``stride``/``numel``/``dim``,
        a GemmConfig field, ``len(...)``, and arithmetic of those."""
        if isinstance(e, ast.Constant):
            return isinstance(e.value, (int, float)) and not isinstance(e.value, bool)
        if isinstance(e, ast.UnaryOp):
            return self.numeric_evident(e.operand)
        if isinstance(e, ast.BinOp):
            return self.numeric_evident(e.left) and self.numeric_evident(e.right)
        if isinstance(e, ast.Name):
            return e.id in self.numeric_constants
        if isinstance(e, ast.Attribute):
            return (
                e.attr in surface.config_fields()
                or e.attr in ("ndim", "itemsize", "nbytes")
                or ((self.qualname(e) or "").split(".")[0] == "math")
            )
        if isinstance(e, ast.Subscript):
            return (
                isinstance(e.value, ast.Attribute)
                and e.value.attr == "shape"
                or (isinstance(e.value, ast.Call) and self.numeric_evident(e.value))
            )
        if isinstance(e, ast.Call):
            f = e.func
            return (isinstance(f, ast.Attribute) and f.attr in ("size", "stride", "numel", "dim", "element_size")) or (
                isinstance(f, ast.Name) and f.id == "len"
            )
        return False

    def is_module_level_target(self, node: ast.Name) -> bool:
        """True for a Name stored by a module-level statement (reported by the entry and
        epilogue checks as ``name-redefined`` already)."""
        p, top = self.parents.get(node), set(map(id, self.tree.body))
        while p is not None and id(p) not in top:
            if isinstance(
                p,
                (
                    ast.FunctionDef,
                    ast.AsyncFunctionDef,
                    ast.Lambda,
                    ast.ListComp,
                    ast.SetComp,
                    ast.DictComp,
                    ast.GeneratorExp,
                ),
            ):
                return False
            p = self.parents.get(p)
        return p is not None

    def in_epilogue_fn(self, node: ast.AST) -> bool:
        """True when ``node`` is inside an epilogue body, which quack traces on DSL values: a
        @gemm_epilogue-decorated function, a prepass fn (a module-level def named by
        ``prepass=``) or a method of a custom op class (its device hooks)."""
        p = self.parents.get(node)
        while p is not None:
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self.is_epilogue_body(p)
            p = self.parents.get(p)
        return False

    def is_epilogue_body(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """See :meth:`in_epilogue_fn`."""
        if any(self.is_gemm_epilogue(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list):
            return True
        if fn in self.tree.body and fn.name in self.prepass_names:
            return True
        return isinstance(self.parents.get(fn), ast.ClassDef)

    def is_epilogue_mod_call(self, node: ast.Call) -> bool:
        """``mod(...)`` or ``mod.gemm(...)`` for one of this module's epilogues."""
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "gemm":
            f = f.value
        return isinstance(f, ast.Name) and f.id in self.epilogue_names

    def is_gemm_epilogue(self, func: ast.AST) -> bool:
        # Must resolve to quack's decorator: a candidate's own `def gemm_epilogue` (which would
        # turn "epilogues" into plain torch math) does not count.
        q = self.qualname(func) or ""
        return q.startswith("quack.") and q.endswith(".gemm_epilogue")

    def is_dtype_expr(self, node: ast.AST) -> bool:
        q = self.qualname(node)
        return bool(q and q.startswith("torch.") and q.split(".")[1] in TORCH_DTYPES) or (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TORCH_DTYPES
        )

    def torch_allowed(self, parts: list[str]) -> bool:
        tail = ".".join(parts[1:])
        return parts[1] in self.allowed_torch or tail in self.allowed_torch

"""Rules on calls: what a call may hand the library, the value methods that do the op's
work or cast, where allocations live (``device=<input>.device``), the one ``.to`` host code
needs, and the ``@`` operator.
"""

from __future__ import annotations

import ast

from .facts import ModuleFacts, is_device_attr, is_device_like, looks_like_cast, snippet
from .lists import BANNED_KEYWORDS, CAST_METHODS, VALUE_MATH_METHODS, allowed_hint


def library_call_arguments(m: ModuleFacts, node: ast.Call) -> None:
    """``library-callback``: a lambda or one of the candidate's functions handed to a
    cutlass/quack callable or an epilogue mod; ``banned-call``: the keywords that install
    objects or state into the library, and ``out=`` of a torch function."""
    q = m.qualname(node.func) or ""
    lib_call = q.split(".")[0] in ("cutlass", "quack") or m.is_epilogue_mod_call(node)
    if lib_call and not m.is_gemm_epilogue(node.func):
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for sub in ast.walk(arg):  # also inside tuples/dicts (post_init_attrs={...: fn})
                if isinstance(sub, ast.Lambda) or (
                    isinstance(sub, ast.Name) and sub.id in m.module_defs and sub.id not in m.epilogue_names
                ):
                    what = "a lambda" if isinstance(sub, ast.Lambda) else f"your function `{sub.id}`"
                    m.add(
                        "library-callback",
                        node,
                        f"`{snippet(node)}` hands {what} to `{q or snippet(node.func)}`: library code may "
                        "introspect, evaluate or install it (cute.native_struct evaluates annotations); "
                        "call your functions yourself, where you name them",
                    )
                    break
    for k in node.keywords:
        if k.arg in BANNED_KEYWORDS:
            m.add("banned-call", node, f"`{k.arg}=` in `{snippet(node)}`: {BANNED_KEYWORDS[k.arg]}")
        elif k.arg == "out" and q.startswith("torch."):
            m.add(
                "banned-call",
                node,
                f"`out=` in `{snippet(node)}`: torch functions may not write into "
                "existing tensors (torch.empty(..., out=x) reshapes x); allocate outputs fresh",
            )


def matmul_operator(m: ModuleFacts, node: ast.BinOp | ast.AugAssign) -> None:
    """The ``@`` operator (``a @ b``, ``a @= b``) is torch math."""
    if isinstance(node.op, ast.MatMult):
        matmul_op(m, node)


def matmul_op(m: ModuleFacts, node: ast.AST) -> None:
    if "matmul" in m.allowed_torch or "@" in m.allowed_torch:
        return
    m.add(
        "torch-math",
        node,
        f"the `@` operator (`{snippet(node)}`) computes the GEMM outside the fused kernel; the GEMM must run inside the @gemm_epilogue mod",
    )


def check_call(m: ModuleFacts, node: ast.Call) -> None:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3 and "type" not in m.aliases:
        m.add("banned-call", node, "3-argument type() creates classes; not allowed")
        return
    q = m.qualname(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
    if q in ("torch.empty", "torch.empty_strided", "torch.empty_like") or (
        q is None and isinstance(func, ast.Attribute) and func.attr == "new_empty"
    ):
        check_alloc_device(m, node, q)
    elif q == "torch.Tensor":
        m.add(
            "host-escape",
            node,
            f"`{snippet(node)}`: calling the tensor class allocates uninitialised host "
            "memory; allocate with `torch.empty(..., device=<input>.device)`",
        )
    if any(k.arg is None for k in node.keywords):
        m.add(
            "banned-call",
            node,
            f"`{snippet(node)[:80]}`: `**` unpacking into a call hides what the callee "
            "is given (`x.to(**{{'dtype': ...}})` casts unseen, `run(**{{'tile_count_semaphore': ...}})` passes "
            "a banned keyword); pass arguments by name",
        )
    if not isinstance(func, ast.Attribute):
        return
    name = func.attr
    if q is not None:
        return  # module functions are checked by rules_imports.check_qualified
    if name == "view" and view_reinterprets(m, node):
        m.add(
            "precision-cast",
            node,
            f"`{snippet(node)}` may reinterpret a tensor's bits as another dtype "
            "(`.view(torch.int16)[..., 1::2].view(torch.bfloat16)` truncated fp32 to bf16 with no launch); "
            "give `.view` the shape itself (ints, a tuple or `x.shape`)",
        )
    if name in m.allowed_torch:
        return
    if name in VALUE_MATH_METHODS:
        m.add(
            "torch-math",
            node,
            f"`.{name}()` in `{snippet(node)}` does the op's work (or fills data) outside the fused kernel"
            + allowed_hint(m.spec),
        )
    elif name in CAST_METHODS and looks_like_cast(node):
        m.add(
            "precision-cast",
            node,
            f"`{snippet(node)}` casts a tensor's dtype; outputs and intermediates must keep the spec's dtypes (no precision games)",
        )
    elif name == "to":
        if (
            m.in_epilogue_fn(node)
            and node.args
            and not node.keywords
            and all((m.qualname(a) or "").startswith("cutlass.") for a in node.args)
        ):
            return  # a DSL conversion in an epilogue body (`g.to(cutlass.Float32)`), not a tensor cast
        check_to(m, node)


def view_reinterprets(m: ModuleFacts, node: ast.Call) -> bool:
    """``.view(X)`` whose one argument may be a dtype (a dtype name, a variable, a
    ``.dtype``, a starred value) or that has a ``dtype=``: a bit reinterpretation, not a
    reshape. Shapes are ints, tuples/lists, arithmetic, subscripts or ``x.shape``."""
    if any(k.arg in ("dtype", None) for k in node.keywords):
        return True
    if len(node.args) != 1:
        return False
    a = node.args[0]
    if isinstance(a, (ast.Name, ast.Starred)):
        return True
    if isinstance(a, ast.Attribute):
        return a.attr == "dtype" or m.is_dtype_expr(a)
    return isinstance(a, ast.Constant) and isinstance(a.value, str)


def check_alloc_device(m: ModuleFacts, node: ast.Call, q: str | None) -> None:
    """``torch.empty``/``empty_strided`` must say ``device=<tensor>.device``, and
    ``empty_like``/``new_empty`` may only repeat that: a host tensor is read without a
    CUDA sync the guard could see (its stale contents can keep state across calls), and
    host ops are not counted as launches."""
    dev = [k.value for k in node.keywords if k.arg == "device"]
    needs = q in ("torch.empty", "torch.empty_strided")
    if (needs and not dev) or any(not is_device_attr(d) for d in dev):
        m.add(
            "host-escape",
            node,
            f"`{snippet(node)}`: allocations take `device=<input>.device` (a tensor "
            "allocated elsewhere, e.g. on the host, is read without a sync the guard sees)",
        )


def check_to(m: ModuleFacts, node: ast.Call) -> None:
    """``.to()`` is allowed in one form only, ``.to(<expr>.device)`` (or ``device=``): what
    host code needs to keep a tensor on its inputs' device. A dtype, a tensor
    (``x.to(other)`` takes other's dtype) or a variable may cast (``precision-cast``); a
    device named any other way, or ``non_blocking``, may move data to the host without a
    synchronization the guard sees (``host-escape``: ``.to("cpu", non_blocking=True)``
    reads the allocator's poison)."""
    args = [*node.args, *(k.value for k in node.keywords if k.arg == "device")]
    other = [k.arg for k in node.keywords if k.arg not in ("device", None)]
    if len(args) == 1 and is_device_attr(args[0]) and not other:
        return
    if other == ["dtype"] or "dtype" in other or any(not is_device_like(a) for a in args):
        m.add(
            "precision-cast",
            node,
            f"`{snippet(node)}` may cast a tensor's dtype (`.to(<dtype>)`, `.to(<tensor>)`); "
            "outputs and intermediates must keep the spec's dtypes (no precision games). "
            "`.to(<tensor>.device)` is the only `.to` host code needs",
        )
    else:
        m.add(
            "host-escape",
            node,
            f"`{snippet(node)}` moves a tensor to a device named other than by an input's "
            "`.device` (or with non_blocking/copy): host code keeps tensors where the inputs are; "
            "`.to(<tensor>.device)` is the only `.to` host code needs",
        )

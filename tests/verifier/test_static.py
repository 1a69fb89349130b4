"""Stage 1 (static): every rule of the candidate contract, one small module per rule.

Each test starts from a module that passes (:data:`GOOD`) and changes one thing, so a
failure names the rule that regressed. The corpus (test_corpus_cpu.py) covers the
realistic, whole-file cheats.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.static import KINDS, check_static

ROOT = Path(__file__).resolve().parents[2]
BWD = load_spec(ROOT / "kernel_specs" / "swiglu_bwd").spec
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd").spec

HEADER = '''\
"""candidate"""
import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack
'''

EPI = """
@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}
"""

ENTRY = """
def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    BODY
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact
"""

GOOD = HEADER + EPI + ENTRY.replace("    BODY\n", "")


def module(*, header: str = "", epi: str = EPI, body: str = "", extra: str = "", entry: str | None = None) -> str:
    """A bwd candidate with ``header`` lines after the imports, ``body`` lines at the top of
    the entry (indented for you) and ``extra`` module-level code before the entry."""
    body_s = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n" if body else ""
    entry_s = entry if entry is not None else ENTRY.replace("    BODY\n", body_s)
    return HEADER + textwrap.dedent(header) + epi + textwrap.dedent(extra) + entry_s


def kinds(src: str, spec=BWD) -> list[str]:
    return [f.kind for f in check_static(spec, src).findings]


def line_of(src: str, needle: str) -> int:
    for i, ln in enumerate(src.splitlines(), 1):
        if needle in ln:
            return i
    raise AssertionError(f"{needle!r} not in source")


def assert_flags(src: str, kind: str, needle: str | None = None, spec=BWD) -> None:
    """``src`` fails with a ``kind`` finding (on the line containing ``needle``)."""
    res = check_static(spec, src)
    assert res.status == "fail", src
    hits = [f for f in res.findings if f.kind == kind]
    assert hits, f"no {kind!r} finding; got {[(f.kind, f.line, f.message) for f in res.findings]}"
    if needle is not None:
        want = line_of(src, needle)
        assert want in [f.line for f in hits], f"{kind} not on line {want}: {[(f.line, f.message) for f in hits]}"


# --------------------------------------------------------------------------- baseline


def test_good_module_passes():
    res = check_static(BWD, GOOD)
    assert res.stage == "static"
    assert res.status == "pass", [f.model_dump() for f in res.findings]
    assert res.summary == "ok"
    assert res.findings == []
    assert res.metrics["epilogues"] == ["dswiglu_epi"]


def test_allowed_imports_and_epilogue_math_pass():
    src = module(
        header="""
        from __future__ import annotations
        import functools
        import math
        import operator
        import typing
        import cutlass
        import cutlass.cute as cute
        from cutlass import Float32
        from quack import activation
        from quack.gemm_config import GemmConfig
        from quack.epilogue.ops import ColVecReduce, TileStore
        """,
        epi="""
@gemm_epilogue(outputs=(TileStore("postact"),), reduces={"zdz": ColVecReduce("zdz")}, mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    s = 1.0 / (1.0 + cute.math.exp(-gate))
    dgate, dup, postact = activation.dswiglu(gate, up, acc * Float32(math.sqrt(1.0)))
    return {"D": pack(dgate, dup), "postact": postact * s / s, "zdz": gate * dgate + up * dup}
""",
        body="scale = lambda t: t\nn = operator.add(m, 1)",
    )
    res = check_static(BWD, src)
    assert res.status == "pass", [(f.kind, f.line, f.message) for f in res.findings]


def test_forward_good_module_passes():
    src = """
import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    preact = torch.empty(x.shape[0], w1.shape[0], dtype=x.dtype, device=x.device)
    postact = torch.empty(x.shape[0], w1.shape[0] // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact
"""
    assert check_static(FWD, src).status == "pass"


def test_kinds_are_documented():
    # every kind a test below expects is in the published table
    for k in (
        "banned-import",
        "banned-call",
        "banned-attribute",
        "try-except",
        "module-state-mutation",
        "torch-math",
        "entry-signature",
        "unknown-return-key",
        "missing-declared-key",
    ):
        assert k in KINDS


# --------------------------------------------------------------------------- parse / structure


def test_syntax_error_is_a_finding_with_line():
    src = GOOD.replace("i = w_down.shape[1]", "i = w_down.shape[1")
    res = check_static(BWD, src, "cand.py")
    assert res.status == "fail" and res.summary == "1 violation(s)"
    (f,) = res.findings
    assert f.kind == "syntax-error"
    assert f.line is not None and f.line >= line_of(src, "w_down.shape[1")
    assert "cand.py" in f.message


@pytest.mark.parametrize(
    "tail",
    [
        "k = " + " + ".join(["m"] * 3000),  # a flat chain of binary operators
        "k = " + "-" * 5000 + "1",  # unary operators
        "k = m" + ".a" * 5000,  # attribute accesses
    ],
)
def test_a_module_nested_too_deeply_is_a_finding_not_a_verifier_error(tail):
    """ast.parse raises RecursionError (not SyntaxError) on a tree deeper than its limit;
    check_static reports it as a finding, not as the verifier's failure."""
    res = check_static(BWD, GOOD + "\nm = 1\n" + tail + "\n", "cand.py")
    assert res.status == "fail" and [f.kind for f in res.findings] == ["syntax-error"]
    assert "cand.py: the module is nested too deeply" in res.findings[0].message


def test_a_null_byte_syntax_error_has_no_line_none():
    res = check_static(BWD, GOOD + "\nx = 1\x00\n", "cand.py")
    assert res.status == "fail" and res.findings[0].kind == "syntax-error"
    assert ":None:" not in res.findings[0].message and res.findings[0].message.startswith("cand.py")


def test_module_level_call_and_statements():
    src = module(
        extra="""
print("loading")
for _k in range(3):
    pass
if __name__ == "__main__":
    pass
"""
    )
    assert_flags(src, "module-level-call", 'print("loading")')
    assert_flags(src, "module-level-statement", "for _k in range(3)")
    assert_flags(src, "module-level-statement", 'if __name__ == "__main__"')


def test_module_level_assignments_and_docstring_are_fine():
    src = module(
        extra='''
"""a note"""
TILE = 128
_TABLE = ((1, 2), (3, 4))
__all__ = ["swiglu_bwd"]
'''
    )
    assert check_static(BWD, src).status == "pass"


@pytest.mark.parametrize(
    "stmt,kind",
    [
        ("try:\n    pass\nexcept Exception:\n    pass", "try-except"),
        ("try:\n    pass\nfinally:\n    pass", "try-except"),
        ("with torch.no_grad():\n    pass", "with-statement"),
        ("class Box:\n    pass", "class-definition"),
        ("global TILE", "global-nonlocal"),
    ],
)
def test_banned_statements(stmt, kind):
    src = module(body=stmt)
    assert_flags(src, kind, stmt.splitlines()[0])


def test_nonlocal_and_async():
    src = module(
        extra="""
def _outer():
    n = 0
    def inner():
        nonlocal n
        n += 1
    return inner


async def _later():
    return 1
"""
    )
    assert_flags(src, "global-nonlocal", "nonlocal n")
    assert_flags(src, "async", "async def _later")


def test_lambda_is_allowed():
    assert check_static(BWD, module(body="f = lambda t: t\nf(dout)")).status == "pass"


# --------------------------------------------------------------------------- imports


@pytest.mark.parametrize(
    "imp",
    [
        "import os",
        "import sys",
        "import gc",
        "import inspect",
        "import ctypes",
        "import triton",
        "import numpy as np",
        "import quack",
        "from quack import gemm_interface",
        "from quack.gemm_interface import gemm",
        "import torch.nn.functional as F",
        "from torch.utils import cpp_extension",
        "import importlib",
        "import threading",
    ],
)
def test_banned_imports(imp):
    assert_flags(module(header=imp + "\n"), "banned-import", imp)


def test_star_and_relative_imports():
    assert_flags(module(header="from quack.epilogue.library import *\n"), "banned-import", "import *")
    # the library's ready-made mods are the baseline, not something a candidate may call
    assert_flags(module(header="from quack.epilogue.library import dswiglu_mod\n"), "banned-import")
    assert_flags(module(header="from . import helpers\n"), "banned-import", "from . import helpers")


def test_function_level_import_is_checked():
    assert_flags(module(body="import os"), "banned-import", "import os")


def test_torch_submodule_alias_is_resolved():
    src = module(header="import torch.nn.functional as F\n", body="y = F.silu(dout)")
    assert_flags(src, "banned-import", "import torch.nn.functional")
    assert_flags(src, "torch-math", "F.silu(dout)")


def test_from_torch_import_is_checked_like_attribute():
    src = module(header="from torch import matmul as mm\n", body="y = mm(dout, w_down)")
    assert_flags(src, "torch-math", "from torch import matmul")
    assert_flags(src, "torch-math", "y = mm(dout, w_down)")


# --------------------------------------------------------------------------- builtins / reflection


@pytest.mark.parametrize(
    "call",
    [
        'exec("x = 1")',
        'eval("1")',
        'compile("1", "f", "eval")',
        'open("/etc/passwd")',
        '__import__("os")',
        'getattr(torch, "matmul")',
        'setattr(torch, "x", 1)',
        'delattr(torch, "x")',
        "globals()",
        "locals()",
        "vars(torch)",
        "id(dout)",
        "breakpoint()",
        "input()",
        "hash(dout)",
    ],
)
def test_banned_builtins(call):
    assert_flags(module(body=f"_ = {call}"), "banned-call", call)


def test_banned_builtin_referenced_without_call():
    assert_flags(module(body="g = getattr\ng(torch, 'mm')"), "banned-call", "g = getattr")


def test_three_argument_type():
    assert_flags(module(body='T = type("T", (), {})'), "banned-call", 'type("T"')


@pytest.mark.parametrize("expr", ["dout.__class__", "torch.__dict__", "swiglu_bwd.__globals__", "dout.__dict__"])
def test_dunder_attributes(expr):
    assert_flags(module(body=f"_ = {expr}"), "banned-attribute", expr)


@pytest.mark.parametrize(
    "expr",
    [
        "torch.ops.aten.mm(dout, w_down)",
        "torch._C._get_tracing_state()",
        "torch.library.Library",
        "dswiglu_epi._plan_cache",
        "torch.backends.cuda.matmul",
        "torch.manual_seed(0)",
        "torch.cuda.memory_allocated()",
    ],
)
def test_banned_attributes(expr):
    assert_flags(module(body=f"_ = {expr}"), "banned-attribute", expr)


def test_private_chain_reported_once():
    res = check_static(BWD, module(body="_ = torch._C._foo._bar"))
    assert [f.kind for f in res.findings] == ["banned-attribute"]


@pytest.mark.parametrize("expr", ["frame.f_back", "frame.f_globals", "gen.gi_frame", "tb.tb_frame"])
def test_introspection_attributes(expr):
    assert_flags(module(body=f"_ = {expr}"), "introspection", expr)


@pytest.mark.parametrize(
    "expr",
    [
        "operator.attrgetter('matmul')(torch)",
        "operator.methodcaller('sum')(dout)",
        "operator.setitem(d, 1, 2)",
    ],
)
def test_operator_indirection(expr):
    assert_flags(module(header="import operator\n", body=f"_ = {expr}"), "banned-call", expr)


def test_operator_matmul_is_torch_math():
    assert_flags(
        module(header="import operator\n", body="_ = operator.matmul(dout, w_down)"), "torch-math", "operator.matmul"
    )


# --------------------------------------------------------------------------- streams / sync


@pytest.mark.parametrize(
    "expr",
    [
        "torch.cuda.Stream()",
        "torch.cuda.Event(enable_timing=True)",
        "torch.cuda.synchronize()",
        "torch.cuda.current_stream()",
        "torch.cuda.CUDAGraph()",
        "torch.cuda.graph",
        "dpreact.record_stream(s)",
        "torch.Stream()",
        "torch.accelerator.synchronize()",
    ],
)
def test_streams_events_sync(expr):
    assert_flags(module(body=f"_ = {expr}"), "stream-or-sync", expr)


# --------------------------------------------------------------------------- torch math / api


@pytest.mark.parametrize(
    "fn",
    [
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "einsum",
        "tensordot",
        "dot",
        "mv",
        "inner",
        "outer",
        "sigmoid",
        "silu",
        "relu",
        "tanh",
        "softmax",
        "log_softmax",
        "logsumexp",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "pow",
        "sum",
        "mean",
        "amax",
        "max",
        "min",
        "norm",
        "var",
        "where",
        "compile",
        "stack",
        "zeros",
        "ones",
        "full",
    ],
)
def test_torch_math_functions(fn):
    assert_flags(module(body=f"_ = torch.{fn}(dout)"), "torch-math", f"torch.{fn}(")


@pytest.mark.parametrize(
    "expr",
    [
        "torch.nn.functional.silu(dout)",
        "torch.nn.Linear(4, 4)",
        "torch.special.expit(dout)",
        "torch.linalg.norm(dout)",
        "torch.Tensor.sum(dout)",
    ],
)
def test_torch_math_namespaces(expr):
    assert_flags(module(body=f"_ = {expr}"), "torch-math", expr)


@pytest.mark.parametrize(
    "meth",
    [
        "matmul(w_down)",
        "mm(w_down)",
        "sum()",
        "mean(0)",
        "exp()",
        "sigmoid()",
        "max()",
        "amax(-1)",
        "pow(2)",
        "rsqrt()",
        "copy_(preact)",
        "fill_(0)",
        "zero_()",
        "clone()",
        "add_(1)",
    ],
)
def test_tensor_math_methods(meth):
    assert_flags(module(body=f"_ = dout.{meth}"), "torch-math", f"dout.{meth}")


def test_matmul_operator():
    assert_flags(module(body="_ = dout @ w_down"), "torch-math", "dout @ w_down")
    assert_flags(module(body="x = dout\nx @= w_down"), "torch-math", "x @= w_down")


@pytest.mark.parametrize(
    "expr",
    [
        "dout.float()",
        "dout.half()",
        "dout.bfloat16()",
        "dout.double()",
        "dout.to(torch.float32)",
        "dout.to(dtype=torch.float16)",
        "dout.to(dout.device, torch.float8_e4m3fn)",
        "dout.type(torch.float16)",
    ],
)
def test_precision_casts(expr):
    assert_flags(module(body=f"_ = {expr}"), "precision-cast", expr)


def test_to_device_is_not_a_cast():
    for expr in ("dout.to(preact.device)", "dout.to(device=preact.device)"):
        assert check_static(BWD, module(body=f"_ = {expr}")).status == "pass", expr


@pytest.mark.parametrize(
    "expr",
    [
        # `.to(<empty tensor of the dtype>)` casts without naming a dtype
        "dout.to(torch.empty(0, dtype=torch.float32, device=dout.device))",
        "dout.to(preact)",
        "dout.to(f32)",
        "dout.to(dtype=f32)",
        'dout.to("float32")',
        "dout.to(preact.device, f32)",
        "dout.to(*(f32,))",
        # casts through other methods and keyword forms
        "dout.half(**{})",
        "dout.float(memory_format=torch.preserve_format)",
        "dout.type(dtype=f32)",
        "dout.type_as(other=preact)",
    ],
)
def test_to_anything_but_a_device_is_a_cast(expr):
    assert_flags(module(body=f"f32 = torch.float32\n_ = {expr}"), "precision-cast", expr)


@pytest.mark.parametrize("expr", ["c = dout.to", "c = dout.float", "_ = list(map(dout.to, (f32,)))"])
def test_a_reference_to_a_cast_method_is_a_cast(expr):
    assert_flags(module(body=f"f32 = torch.float32\n{expr}"), "precision-cast", expr)


@pytest.mark.parametrize(
    "expr",
    [
        # an async copy to the host reads the allocator's poison unseen by the guard
        'dout.to("cpu", non_blocking=True)',
        'dout.to("cpu")',
        'dout.to(torch.device("cpu"))',
        'dout.to(device=torch.device("cpu"))',
        "dout.to(preact.device, non_blocking=True)",
        'dout.to("cuda")',
    ],
)
def test_to_another_device_is_a_host_escape(expr):
    assert_flags(module(body=f"_ = {expr}"), "host-escape", expr)


def test_keyword_unpacking_into_a_method_is_banned():
    assert_flags(module(body='_ = dout.view(**{"dtype": torch.float16})'), "banned-call", "dout.view")
    assert_flags(module(body='_ = dout.to(**{"dtype": torch.float16})'), "banned-call", "dout.to")


@pytest.mark.parametrize(
    "meth", ["nanmean(-1)", "median()", "quantile(0.5)", "new_zeros(1)", "new_ones(1)", "new_full((1,), 2.0)"]
)
def test_reducing_and_new_tensor_methods_are_torch_math(meth):
    assert_flags(module(body=f"_ = dout.{meth}"), "torch-math", f"dout.{meth}")


def test_operand_names_like_profiler_markers_are_reserved():
    src = module(
        epi=EPI.replace('outputs=("postact",)', 'outputs=("postact",), ops={"memsync": ColVecLoad("memsync")}').replace(
            "def dswiglu_epi(acc, c):", "def dswiglu_epi(acc, c, memsync):"
        ),
        header="from quack.epilogue.ops import ColVecLoad\n",
    )
    assert_flags(src, "reserved-name", '"memsync"')


@pytest.mark.parametrize("name", ["swiglu_Sync_epi", "memcpy_epi", "my_memset", "inMemory"])
def test_defs_named_like_profiler_markers_are_reserved(name):
    """quack names a kernel after its epilogue fn, and the launch count skips events named
    like copies and sync markers: `swiglu_Sync_epi` could hide a second GEMM
    (tests/verifier/corpus/sync_named_kernel.py)."""
    src = module(
        epi=EPI.replace("def dswiglu_epi", f"def {name}").replace("    return {", "    return {"),
        entry=ENTRY.replace("dswiglu_epi(", f"{name}(").replace("    BODY\n", ""),
    )
    assert_flags(src, "reserved-name", f"def {name}")


def test_entry_must_use_an_epilogue():
    """An entry that never names its epilogue computes the op some other way; the epilogue
    is then dead code that only satisfies the contract."""
    unused = ENTRY.replace(
        '    BODY\n    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)\n', ""
    )
    assert "dswiglu_epi" not in unused
    assert_flags(module(entry=unused), "no-epilogue-call", "def swiglu_bwd")
    # through a helper (transitively) it counts, and so does a quack library epilogue
    helper = module(
        extra="\ndef _run(a, b, c, out):\n    return dswiglu_epi(a, b, c, out=out, tuned=False)\n",
        entry=unused.replace(
            "    return dpreact",
            '    _run(dout, w_down, preact, {"D": dpreact, "postact": postact})\n    return dpreact',
        ),
    )
    assert "no-epilogue-call" not in kinds(helper)
    lib = module(
        header="from quack.epilogue.library import identity_epi\n",
        entry=unused.replace("    return dpreact", "    identity_epi(dout, w_down, tuned=False)\n    return dpreact"),
    )
    assert "no-epilogue-call" not in kinds(lib)
    # a helper that is defined but never called by the entry does not count
    dead = module(
        extra="\ndef _run(a, b, c, out):\n    return dswiglu_epi(a, b, c, out=out, tuned=False)\n", entry=unused
    )
    assert_flags(dead, "no-epilogue-call", "def swiglu_bwd")


@pytest.mark.parametrize("expr", ["dout.data_ptr()", "dout.untyped_storage()", "dout.storage()"])
def test_pointer_access(expr):
    assert_flags(module(body=f"_ = {expr}"), "data-ptr", expr)


def test_other_torch_functions_are_not_allowed():
    assert_flags(module(body="_ = torch.nonzero(dout)"), "torch-api", "torch.nonzero")


def test_allocation_views_and_dtypes_are_allowed():
    body = """
a = torch.empty_like(dout)
b = torch.empty_strided((4, 4), (4, 1), dtype=torch.bfloat16, device=dout.device)
g, u = preact[:, 0::2], preact[:, 1::2]
v = preact.view(m, i, 2).permute(2, 0, 1).reshape(-1)
w = w_down.T.contiguous()
t = torch.narrow(dout, 0, 0, 1)
ok = dout.dtype == torch.bfloat16 and dout.is_contiguous() and dout.ndim == 2
"""
    assert check_static(BWD, module(body=body)).status == "pass"


def test_allowed_torch_lifts_the_ban():
    entry = BWD.entry.model_copy(update={"allowed_torch": ["rsqrt", "sum"]})
    spec = BWD.model_copy(update={"entry": entry})
    src = module(body="r = torch.rsqrt(dout)\ns = dout.sum(-1)")
    assert check_static(spec, src).status == "pass"
    assert "torch-math" in kinds(src)  # the stock spec allows neither


@pytest.mark.parametrize("method", ["repeat", "repeat_interleave", "tile"])
def test_allowed_torch_lifts_the_ban_on_copying_methods_too(method):
    """A spec that lists ``repeat`` lets host code call ``t.repeat(...)``; without it the
    call is torch-math (a copy made outside the fused kernel), not an unknown attribute."""
    entry = BWD.entry.model_copy(update={"allowed_torch": [method]})
    spec = BWD.model_copy(update={"entry": entry})
    src = module(body=f"r = dout.{method}(2)")
    assert check_static(spec, src).status == "pass"
    assert kinds(src) == ["torch-math"]


# --------------------------------------------------------------------------- attribute writes / state


def test_attribute_writes():
    src = module(
        extra="""
torch.cuda.Event = None
""",
        body="dswiglu_epi.fn = None\ndout.data = preact",
    )
    assert_flags(src, "attribute-write", "torch.cuda.Event = None")
    assert_flags(src, "attribute-write", "dswiglu_epi.fn = None")
    assert_flags(src, "attribute-write", "dout.data = preact")


@pytest.mark.parametrize(
    "stmt",
    [
        "_CACHE[m] = dpreact",
        "_COUNT[0] += 1",
        "_LOG.append(m)",
        "_CACHE.update({m: 1})",
        "_CACHE.setdefault(m, dpreact)",
        "_CACHE.clear()",
        "del _CACHE[m]",
        "_CACHE.pop(m, None)",
        "_BUF.copy_(dout)",
        "dict.update(_CACHE, {})",
        "_CACHE[m], x = 1, 2",
    ],
)
def test_module_state_mutation(stmt):
    src = module(extra="\n_CACHE = {}\n_COUNT = [0]\n_LOG = []\n_BUF = None\n", body=stmt)
    assert_flags(src, "module-state-mutation", stmt)


def test_module_state_mutation_through_alias():
    src = module(extra="\n_CACHE = {}\n", body="c = _CACHE\nc[m] = dpreact")
    assert_flags(src, "module-state-mutation", "c[m] = dpreact")
    src = module(extra="\n_STATE = [[0]]\n", body="inner = _STATE[0]\ninner.append(1)")
    assert_flags(src, "module-state-mutation", "inner.append(1)")


def test_module_state_mutation_through_default_parameter():
    src = module(
        extra="""
_CACHE = {}


def _remember(key, value, store=_CACHE):
    store[key] = value
"""
    )
    assert_flags(src, "module-state-mutation", "store[key] = value")


def test_closure_state_mutation():
    src = module(
        extra="""
def _make():
    seen = []

    def record(x):
        seen.append(x)
        return x

    return record


_record = _make()
"""
    )
    assert_flags(src, "module-state-mutation", "seen.append(x)")


def test_container_updates_are_rejected_even_on_locals():
    """Deny by default: ownership analysis is defeated by aliasing
    (`[_CACHE][0][0] = v`), so item stores and mutating calls are rejected on any receiver;
    containers are built whole; `x += y` is rejected in host code too (in place on lists)."""
    body = """
outs = {}
outs["D"] = dpreact
outs.update(postact=postact)
lst = []
lst.append(m)
counter = 0
counter += 1
"""
    ks = kinds(module(body=body))
    assert ks.count("subscript-store") == 1 and ks.count("container-mutation") == 2, ks
    assert ks.count("augmented-assignment") == 1, ks
    fine = 'outs = {"D": dpreact, "postact": postact}\nlst = [m]\ncounter = 0\ncounter = counter + 1'
    assert check_static(BWD, module(body=fine)).status == "pass"


@pytest.mark.parametrize(
    "extra",
    [
        "_CACHE = [[0]]\n_P = [0 for torch.Tensor.detach in [print]]\n",
        "_CACHE = [[0]]\ndef _h(x):\n    for torch.Tensor.detach in [x]:\n        pass\n",
        "_CACHE = [[0]]\ndef _h(x):\n    [_CACHE][0][0] = x\n",
        "_CACHE = [[0]]\ndef _h(x):\n    for a in [_CACHE]:\n        a[0] = x\n",
        "_CACHE = [[0]]\ndef _h(x):\n    a = _CACHE if 1 else 0\n    a[0] = x\n",
        "_CACHE = [[0]]\ndef _h(x):\n    [_CACHE][0].append(x)\n",
        "_HOG = torch.empty(1 << 40, dtype=torch.uint8, device='cuda')\n",
        "_HOG = [torch.empty(8) for _ in range(2)]\n",
        "def _h(x, _hog=torch.empty(8)):\n    return x\n",
        # match class patterns read dunders; method references; iterators/generators;
        # import-time helpers and decorators; cutlass APIs that patch the class they are given
        "O = 0\ndef _h(x):\n    match x:\n        case O(__globals__=G):\n            return G['__builtins__']\n",
        "_C = []\ndef _h(x):\n    app = list.append\n    app(_C, x)\n",
        "import functools\n_C = []\n_P = functools.partial(list.append, _C)\n",
        "_IT = iter(range(10))\n",
        "def _gen():\n    x = yield 1\n",
        "def _h(x, c=[].copy()):\n    c += [x]\n",
        "def _mk():\n    return torch.empty(1 << 40, device='cuda')\n_BUF = _mk()\n",
        "import functools\n@functools.partial(print)\ndef _h(x):\n    return x\n",
        "import cutlass.cute as cute2\n_S = cute2.struct\n",
        "def _h(x):\n    return torch.Tensor.mro()\n",
        "def _h(x):\n    fmt = str.format\n    return fmt('{0}', x)\n",
        # compiler options write files; aliases + augmented assignment; annotations and
        # decorator arguments run at import; a home-made gemm_epilogue; torch.Tensor.<in-place>
        "import cutlass.cute as cute2\ndef _h(x):\n    return cute2.compile\n",
        "_SEEN = []\ndef _note(seen, item):\n    seen += [item]\n",
        "_L = (1,)\ndef _h(x):\n    c = _L or _L\n    c += (x,)\n",
        "_D = {}\n",
        "def _mk():\n    return 1\ndef _h(x: _mk()):\n    return x\n",
        "def _mk():\n    return 1\n_Y: _mk() = 1\n",
        "def _h(x):\n    return torch.Tensor.addmm_\n",
        # cute.native_struct(fn) runs typing.get_type_hints -> eval of a string annotation
        'import cutlass.cute as cute2\n_ANN = \'open("/tmp/x", "w") and int\'\ndef _probe(x: _ANN):\n    return x\n'
        "def _h(x):\n    return cute2.native_struct(_probe)\n",
        "_ANN = 'int'\ndef _probe(x: _ANN):\n    return x\n",
        "import cutlass.cute as cute2\ndef _probe(x):\n    return x\ndef _h(x):\n    return cute2.make_fragment_like(_probe)\n",
        # tensor -> numpy -> file (a .pth in a site folder runs code in every later python)
        "def _h(x):\n    x.new_tensor([105, 109], dtype=torch.uint8).cpu().numpy().tofile('/tmp/x.pth')\n",
        "def _h(x):\n    x.detach().numpy().dump('/tmp/x.pkl')\n",
        "def _h(x):\n    return x.cpu().tolist()\n",
        # storage classes mmap files; .new wraps bytes; .fn runs an epilogue body eagerly
        "def _h(x):\n    b = torch.empty(0, dtype=torch.uint8)\n    return b.new(b.storage_type().from_file('/tmp/x', True, 8))\n",
        "def _h(x):\n    return x.new([1, 2])\n",
        "def _h(x):\n    return torch.ByteStorage\n",
        # out= marks an input in place; host reads of values; quack setattr hooks
        "def _h(x):\n    return torch.empty((x.numel(),), dtype=x.dtype, device=x.device, out=x)\n",
        "def _h(x):\n    return x.item() == 7.0\n",
        "def _h(x):\n    return dswiglu_epi.gemm(x, x, post_init_attrs=(('hook', lambda s: s),))\n",
        # object addresses through repr/str/format/f-strings/%-formatting/set order; print floods
        "def _h(x):\n    r = repr(iter(()))\n    return int(r[r.rfind('0x'):-1], 16)\n",
        "def _h(x):\n    return f'{x!r}'\n",
        "def _h(x):\n    return '%r' % (x,)\n",
        "def _h(x):\n    a, b = iter(()), iter(())\n    return list({a, b})[0] is a\n",
        "def _h(x):\n    print(x)\n",
    ],
)
def test_static_escape_gadgets_are_rejected(extra):
    """Each line gets past a static stage that does not refuse it: a method patched
    through a for or comprehension target, state kept through aliases, method references,
    iterators or generators, code run at import time, attributes read by a match pattern."""
    ks = kinds(module(extra=extra))
    assert set(ks) & {
        "attribute-write",
        "subscript-store",
        "container-mutation",
        "import-time-call",
        "match-statement",
        "generator",
        "mutating-attribute",
        "banned-call",
        "introspection",
        "banned-attribute",
        "mutable-default",
        "module-state-mutation",
        "foreign-object",
        "augmented-assignment",
        "module-level-container",
        "string-annotation",
        "library-callback",
        "host-escape",
    }, ks


@pytest.mark.parametrize(
    "use",
    [
        "import cutlass\ndef _h(x):\n    return cutlass.inttoptr\n",
        "from cutlass import inttoptr\n",
        "import cutlass.cute as cute2\ndef _h(x):\n    return cute2.make_ptr\n",
        "from cutlass.cute import recast_ptr\n",
    ],
)
def test_pointer_fabrication_is_banned(use):
    """cutlass.inttoptr / cute.make_ptr / cute.recast_ptr are refused: in an epilogue they
    reach device memory no operand names."""
    src = module(extra=use)
    res = check_static(BWD, src, "cand.py")
    msgs = [f.message for f in res.findings if f.kind == "banned-call"]
    assert any("makes a pointer from an integer or recasts one" in m for m in msgs), res.findings


@pytest.mark.parametrize(
    "body",
    [
        "cu = cutlass.cute\n    f = cu.make_ptr",
        "c = cutlass\n    f = c.inttoptr",
        "cu = cutlass.cute\n    f = cu.compile",
        "c = cutlass\n    t = c.torch.torch.empty(3)",
        "p = cutlass.Pointer",
    ],
)
def test_a_module_bound_inside_a_function_is_refused(body):
    """Aliases are resolved at module level only, so a module bound to a local name
    (`cu = cutlass.cute`) is refused: otherwise every `cu.<anything>` would go unjudged
    (pointer makers, the DSL compiler, torch through cutlass.torch)."""
    src = module(header="import cutlass\nimport cutlass.cute\n", extra=f"def _h(x):\n    {body}\n    return x\n")
    ks = kinds(src)
    assert "banned-attribute" in ks or "banned-call" in ks, ks


def test_a_denied_object_is_refused_under_another_name(monkeypatch):
    """The pointer makers and compiler entry points are refused by identity too, not only by
    their last name component (a re-export under another name)."""
    import cutlass
    import cutlass.cute

    from coda_agent.verifier.static import surface

    monkeypatch.setattr(cutlass.cute, "sneaky_ptr_s15", cutlass.cute.make_ptr, raising=False)
    monkeypatch.setattr(cutlass.cute, "sneaky_jit_s15", cutlass.cute.jit, raising=False)  # a bound method
    for path in ("cutlass.cute.sneaky_ptr_s15", "cutlass.cute.sneaky_jit_s15"):
        kind, msg, is_module = surface.judge(path)
        assert kind == "banned-call" and "under another name" in msg and not is_module
    assert surface.judge("cutlass.cute.math.exp") is None  # what epilogues use stays allowed


def test_home_made_gemm_epilogue_is_not_an_epilogue():
    """A candidate's own `def gemm_epilogue` would make its "epilogues" plain torch math."""
    src = GOOD.replace(
        "from quack.epilogue import gemm_epilogue, pack, unpack",
        "from quack.epilogue import pack, unpack\n\n\ndef gemm_epilogue(**kw):\n    return lambda f: f\n",
    )
    ks = kinds(src)
    assert "import-time-call" in ks or "no-epilogue" in ks, ks


def test_mutable_default_and_lru_cache():
    src = module(
        header="import functools\n",
        extra="""
def _helper(x, seen={}):
    return x


@functools.lru_cache(maxsize=None)
def _shapes(m):
    return m
""",
    )
    assert_flags(src, "mutable-default", "seen={}")
    assert_flags(src, "call-cache", "functools.lru_cache")


# --------------------------------------------------------------------------- entry point


def test_entry_missing():
    src = HEADER + EPI + "\n\ndef swiglu_backward(dout, w_down, preact):\n    return dout, dout\n"
    res = check_static(BWD, src)
    assert "entry-missing" in [f.kind for f in res.findings]


@pytest.mark.parametrize(
    "sig",
    [
        "dout, preact, w_down",
        "dout, w_down",
        "dout, w_down, preact, extra=None",
        "*args",
        "dout, w_down, preact, *rest",
        "dout, w_down, preact, **kw",
        "dout, w_down, preact, *, cache=None",
        "grad_out, w_down, preact",
    ],
)
def test_entry_signature(sig):
    src = module(entry=f"\n\ndef swiglu_bwd({sig}):\n    return None\n")
    assert_flags(src, "entry-signature", "def swiglu_bwd(")


def test_entry_redefined():
    src = GOOD + "\n\nswiglu_bwd = dswiglu_epi\n"
    assert_flags(src, "name-redefined", "swiglu_bwd = dswiglu_epi")


# --------------------------------------------------------------------------- @gemm_epilogue


def test_no_epilogue():
    src = HEADER + ENTRY.replace("    BODY\n", "").replace("dswiglu_epi(", "_run(")
    src += "\n\ndef _run(*a, **k):\n    return None\n"
    assert "no-epilogue" in kinds(src)


def test_unknown_return_key_with_hint():
    src = module(epi=EPI.replace('{"D": pack', '{"Dd": pack'))
    assert_flags(src, "unknown-return-key", '"Dd"')
    f = next(f for f in check_static(BWD, src).findings if f.kind == "unknown-return-key")
    assert "silently" in f.message and "raw accumulator" in f.message and "'D'" in f.message


def test_missing_declared_output():
    src = module(epi=EPI.replace(', "postact": postact}', "}"))
    assert_flags(src, "missing-declared-key", 'return {"D": pack(dgate, dup)}')
    f = next(f for f in check_static(BWD, src).findings if f.kind == "missing-declared-key")
    assert "KeyError" in f.message and "'postact'" in f.message


def test_missing_declared_reduce_and_outs():
    epi = """
from quack.epilogue.ops import ColVecReduce, OnlineLSEReduce


@gemm_epilogue(outputs=("postact",), reduces={"zdz": ColVecReduce("zdz")}, outs={"lse": OnlineLSEReduce("lse")}, mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}
"""
    res = check_static(BWD, module(epi=epi))
    missing = sorted(
        f.message.split("declares ")[1].split(" ")[0] for f in res.findings if f.kind == "missing-declared-key"
    )
    assert missing == ["'lse'", "'zdz'"]


def test_every_return_is_checked():
    epi = """
@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    if 1 > 2:
        return {"D": pack(dgate, dup)}
    return {"D": pack(dgate, dup), "postact": postact}
"""
    src = module(epi=epi)
    assert_flags(src, "missing-declared-key", 'return {"D": pack(dgate, dup)}')


@pytest.mark.parametrize(
    "ret,kind",
    [
        ("return pack(dgate, dup)", "epilogue-return"),
        ("return dict(D=pack(dgate, dup), postact=postact)", "epilogue-return"),
        ('return {**{"D": acc}, "postact": postact}', "epilogue-return"),
        ('return {"D": acc, "postact": postact, "D": acc}', "duplicate-return-key"),
    ],
)
def test_return_must_be_a_dict_literal(ret, kind):
    src = module(epi=EPI.replace('return {"D": pack(dgate, dup), "postact": postact}', ret))
    assert_flags(src, kind, ret.split("(")[0] if kind == "epilogue-return" else '"D": acc, "postact"')


def test_epilogue_first_parameter_must_be_acc():
    src = module(
        epi=EPI.replace("def dswiglu_epi(acc, c)", "def dswiglu_epi(x, c)").replace(
            "dswiglu(gate, up, acc)", "dswiglu(gate, up, x)"
        )
    )
    assert_flags(src, "epilogue-signature", "def dswiglu_epi(x, c)")


def test_non_literal_declarations():
    src = module(
        extra="",
        epi="""
OUTS = ("postact",)


@gemm_epilogue(outputs=OUTS, mode=MODE)
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}
""",
    )
    assert_flags(src, "non-literal-declaration", "@gemm_epilogue(outputs=OUTS")
    # with a non-literal declaration the return keys are not second-guessed
    assert "unknown-return-key" not in kinds(src)


def test_misspelt_mode_is_named_as_such():
    """A literal mode quack lacks is reported as such, not as a non-literal declaration."""
    src = module(epi=EPI.replace('mode="packed_cd_b16x2"', 'mode="packed_cd_b16x2s"'))
    assert_flags(src, "unknown-epilogue-mode", 'mode="packed_cd_b16x2s"')
    assert "non-literal-declaration" not in kinds(src)


def test_declared_name_mismatch():
    epi = EPI.replace(
        '@gemm_epilogue(outputs=("postact",),',
        '@gemm_epilogue(outputs=("postact",), reduces={"zdz": ColVecReduce("sq")},',
    )
    epi = epi.replace('"postact": postact}', '"postact": postact, "zdz": gate}')
    src = module(header="from quack.epilogue.ops import ColVecReduce\n", epi=epi)
    assert_flags(src, "declared-name-mismatch", 'ColVecReduce("sq")')


def test_tilestore_and_positional_outputs_are_read():
    epi = EPI.replace('@gemm_epilogue(outputs=("postact",),', '@gemm_epilogue((TileStore("postact"),),')
    src = module(header="from quack.epilogue.ops import TileStore\n", epi=epi)
    assert check_static(BWD, src).status == "pass"


def test_decorator_forms():
    bare = module(epi=EPI.replace('@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")', "@gemm_epilogue"))
    assert_flags(bare, "epilogue-decorator", "@gemm_epilogue")
    call_form = module(
        extra="""
def _fn(acc):
    return {"D": acc}


identity = gemm_epilogue()(_fn)
"""
    )
    assert_flags(call_form, "epilogue-decorator", "identity = gemm_epilogue()(_fn)")
    # quack.epilogue.frontend imports sys/inspect for itself: not an allowed module (surface.py)
    internal = module(
        header="import quack.epilogue.frontend as fe\n", epi=EPI.replace("@gemm_epilogue(", "@fe.gemm_epilogue(")
    )
    assert "banned-import" in [f.kind for f in check_static(BWD, internal).findings]
    attr_form = module(header="import quack.epilogue as fe\n", epi=EPI.replace("@gemm_epilogue(", "@fe.gemm_epilogue("))
    assert check_static(BWD, attr_form).status == "pass"
    assert check_static(BWD, attr_form.replace('"D": pack', '"DD": pack')).findings[0].kind == "unknown-return-key"


def test_epilogue_in_factory_is_flagged():
    src = module(
        extra="""
def _factory(fn):
    @gemm_epilogue(outputs=("postact",))
    def inner(acc):
        return {"D": acc, "postact": fn(acc)}
    return inner
"""
    )
    assert_flags(src, "epilogue-decorator", "def inner(acc)")


# --------------------------------------------------------------------------- reporting


def test_every_violation_is_reported_sorted_with_lines():
    src = module(header="import os\n", body="_ = torch.matmul(dout, w_down)\n_ = getattr(torch, 'x')")
    src = src.replace('"D": pack', '"Dd": pack')
    res = check_static(BWD, src)
    got = {f.kind for f in res.findings}
    assert {"banned-import", "torch-math", "banned-call", "unknown-return-key"} <= got
    assert res.summary == f"{len(res.findings)} violation(s)"
    assert res.metrics["violations"] == len(res.findings)
    lines = [f.line for f in res.findings]
    assert all(isinstance(x, int) for x in lines) and lines == sorted(lines)
    assert len({(f.kind, f.line, f.message) for f in res.findings}) == len(res.findings)


def test_deterministic():
    src = module(header="import os\nimport gc\n", body="_ = dout.sum()\n_ = dout.float()")
    a, b = check_static(BWD, src), check_static(BWD, src)
    assert a.findings == b.findings and a.summary == b.summary


# --------------------------------------------------------------------------- escapes through allowed modules


def test_stdlib_reached_through_an_allowed_module():
    src = module(
        header="import quack.epilogue.frontend as fe\n", body='_ = fe.sys.modules["os"]\n_ = fe.inspect.stack()'
    )
    assert_flags(src, "banned-attribute", "fe.sys.modules")
    assert_flags(src, "banned-attribute", "fe.inspect.stack()")
    assert_flags(module(header="from quack.epilogue.frontend import sys\n"), "banned-import", "import sys")


def test_reflective_attributes():
    src = module(header="import quack.epilogue.frontend as fe\n", body="_ = fe.importlib_like.import_module('os')")
    assert_flags(src, "banned-call", "import_module")


def test_module_aliases_by_assignment_are_resolved():
    src = module(extra="\nT = torch\n", body="_ = T.nonzero(dout)\nmm = torch.matmul\n_ = mm(dout, w_down)")
    assert_flags(src, "torch-api", "T.nonzero(dout)")
    assert_flags(src, "torch-math", "mm = torch.matmul")


def test_torch_module_as_value():
    src = module(extra="\n\ndef _use(mod, x):\n    return mod.nonzero(x)\n", body="_ = _use(torch, dout)")
    assert_flags(src, "banned-attribute", "_use(torch, dout)")


def test_imported_module_state_mutation():
    src = module(header="import quack.epilogue.frontend as fe\n", body="fe.TORCH_OP_EPI_MODS.clear()")
    assert_flags(src, "module-state-mutation", "fe.TORCH_OP_EPI_MODS.clear()")
    src = module(header="import quack.epilogue.frontend as fe\n", extra='\nfe.TORCH_OP_EPI_MODS["x"] = None\n')
    assert_flags(src, "module-state-mutation", 'fe.TORCH_OP_EPI_MODS["x"] = None')


@pytest.mark.parametrize(
    "body,needle",
    [
        ("preact[:] = 0", "preact[:] = 0"),
        ("g = preact[:, 0::2]\ng[:] = 1", "g[:] = 1"),
        ("dout[0, 0] += 1", "dout[0, 0] += 1"),
    ],
)
def test_input_mutation_by_subscript(body, needle):
    assert_flags(module(body=body), "input-mutation", needle)


def test_metadata_of_inputs_is_not_an_alias():
    body = "shape = list(dout.shape)\nshape[0] = 1\nouts = [dpreact]\nouts[0] = postact"
    ks = kinds(module(body=body))
    assert "input-mutation" not in ks and set(ks) == {"subscript-store"}, ks


@pytest.mark.parametrize(
    "body,kind,needle",
    [
        # a GEMM as a broadcast product accumulated with .index_add, and a
        # launch-free fp32 -> bf16 truncation through bit views
        ("_ = preact.index_add(0, preact, dout)", "torch-math", "preact.index_add"),
        ("_ = preact.scatter_add(0, preact, dout)", "torch-math", "preact.scatter_add"),
        ("_ = dout.view(torch.int16)", "precision-cast", "dout.view"),
        ("d = torch.int16\n_ = dout.view(d)", "precision-cast", "dout.view(d)"),
        ("_ = dout.view(preact.dtype)", "precision-cast", "dout.view"),
        ("_ = dout.view(dtype=torch.int16)", "precision-cast", "dout.view"),
        # ... and a host tensor of stale heap memory, read without a CUDA sync
        ("_ = torch.empty(125, dtype=torch.int64)", "host-escape", "torch.empty(125"),
        ('_ = torch.empty(4, device="cpu")', "host-escape", "torch.empty(4"),
        ('_ = torch.empty_like(dout, device="cpu")', "host-escape", "torch.empty_like"),
        ('_ = dout.new_empty(4, device="cpu")', "host-escape", "dout.new_empty"),
        ("_ = torch.Tensor(5)", "host-escape", "torch.Tensor(5)"),
    ],
)
def test_scatter_math_bit_view_casts_and_host_tensors_are_flagged(body, kind, needle):
    assert_flags(module(body=body), kind, needle)


def test_aliased_empty_needs_a_device():
    assert_flags(module(header="from torch import empty\n", body="_ = empty(4)"), "host-escape", "empty(4)")


def test_shapes_views_and_device_allocations_still_pass():
    body = """
    a = dout.view(-1)
    b = dout.view(dout.shape)
    c = dout.view(m, -1)
    d = dout.view((m, 2 * i))
    e = torch.empty(m, dtype=preact.dtype, device=dout.device)
    f = torch.empty_like(dout)
    g = dout.new_empty(4)
    """
    assert check_static(BWD, module(body=body)).status == "pass"


MODEL_WRITTEN = sorted((ROOT / "benchmarks" / "results" / "runs").glob("*/attempt-*/candidate.py"))


@pytest.mark.parametrize("path", MODEL_WRITTEN, ids=lambda p: f"{p.parents[1].name}/{p.parent.name}")
def test_every_model_written_catalogue_candidate_passes_static(path):
    """No false positives on honest code: every answer a fresh model wrote for the catalogue
    (the agent runs kept under benchmarks/results/runs/) passes every static rule added
    since. The run folder's name ends in the spec's name."""
    spec = path.parents[1].name.split("-", 1)[1]
    res = check_static(load_spec(ROOT / "kernel_specs" / spec).spec, path.read_text(), str(path))
    assert res.status == "pass", [(f.kind, f.line, f.message[:120]) for f in res.findings]


def test_model_written_candidates_are_there():
    assert len(MODEL_WRITTEN) >= 17


def test_a_module_level_def_may_not_rebind_a_builtin():
    """`_bindings` checks module-level defs too, not only nested ones: a module-level
    `def isinstance(a, b): return b` would make the value-use rule (which trusts the name
    isinstance) hand `torch.empty` out as a value, allocating without device=."""
    src = textwrap.dedent("""
        import torch
        from quack.activation import sigmoid
        from quack.epilogue import gemm_epilogue, pack, unpack


        @gemm_epilogue(outputs=("postact",), mode="acc_pair")
        def swiglu_epi(acc):
            g, u = unpack(acc)
            return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


        def isinstance(a, b):
            return b


        def swiglu_fwd(x, w1):
            alloc = isinstance(x, torch.empty)
            host = alloc(1 << 20, dtype=torch.uint8)
            res = swiglu_epi(x, w1.T, tuned=False)
            return res["D"], res["postact"]
    """)
    res = check_static(FWD, src)
    assert res.status == "fail"
    assert [(f.kind, f.line) for f in res.findings if f.kind == "banned-call"] == [("banned-call", 13)]


# --- value attributes are an allow-list, strings stay in place ----------------------------


@pytest.mark.parametrize(
    "body,needle",
    [
        ("op = functools.partial(torch.empty, 4).func", ".func"),  # a partial's function back
        ("n = dout.names", ".names"),  # named-tensor names are strings
        ("n = dout.shape.count(1)", ".count("),
        ("k = dout.grad_fn", ".grad_fn"),  # autograd graph objects
        ("h = dout.register_hook", ".register_hook"),
    ],
)
def test_attributes_of_values_are_an_allow_list(body, needle):
    assert_flags(module(header="import functools\n", body=body), "value-attribute", needle)


def test_allowed_value_attributes_and_config_fields_pass():
    src = module(
        header="from quack.gemm_config import GemmConfig\n",
        extra="CFG = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1)\n",
        body="""
t = CFG.tile_n + CFG.tile_m + dout.size(0) + dout.stride(-1) + dout.numel() + dout.dim()
v = dout.view(-1, dout.shape[-1]).T.contiguous().unsqueeze(0).squeeze(0).reshape(dout.shape)
""",
    )
    assert check_static(BWD, src).status == "pass", [(f.kind, f.message) for f in check_static(BWD, src).findings]


def test_methods_reached_through_library_classes_are_refused():
    src = module(
        header="from quack.epilogue.ops import Scalar\n", body='p = Scalar.to_params(Scalar("numpy"), 0, dout)'
    )
    assert_flags(src, "banned-attribute", "Scalar.to_params")
    assert_flags(
        module(header="import typing\n", body="typing.Iterable.register(KeyError)"),
        "banned-attribute",
        "typing.Iterable.register",
    )


@pytest.mark.parametrize(
    "code,needle",
    [
        ('MODE = "acc_pair"', "MODE ="),  # bound to a name
        ('_T = (("a", 1),)', "_T ="),
        ('def _name(s):\n    return s\n\n\n_X = _name("abc")', '_name("abc")'),  # passed to your own function
        ('_Y = "_" + "_globals__"', "_Y ="),  # built at run time
    ],
)
def test_strings_stay_where_they_cannot_become_values(code, needle):
    assert_flags(module(extra=code + "\n"), "string-value", needle)


def test_strings_in_place_pass():
    src = module(
        extra='__all__ = ["swiglu_bwd"]\n',
        body='''
"""a note"""
same = "D" == "D"
''',
    )
    assert check_static(BWD, src).status == "pass", [(f.kind, f.message) for f in check_static(BWD, src).findings]


@pytest.mark.parametrize(
    "extra,body,kind,needle",
    [
        # an assignment alias rebound at module level or shadowed by a parameter could hold any
        # value, and its attributes would be judged as the alias's
        ("DT = torch.float32\nDT = torch.empty\n", "", "name-redefined", "DT = torch.empty"),
        ("DT = torch.float32\n\n\ndef _get(DT, obj):\n    return obj\n", "", "name-redefined", "def _get(DT"),
        ("DT = torch.float32\n", "for DT in (dout,):\n    pass", "name-redefined", "for DT in"),
        # below torch.<x> (a dtype, class or function) attributes are a value's
        ("", "p = torch.float32.to_params", "value-attribute", "torch.float32.to_params"),
        ("", 'ok = hasattr(dout, "shape")', "banned-call", "hasattr"),
        ("", "g = dswiglu_epi.gemm.whatever", "value-attribute", ".whatever"),
        ("", "s = dout.grad_fn_graph.shape", "value-attribute", ".grad_fn_graph"),
    ],
)
def test_rebound_aliases_and_value_attributes_are_refused(extra, body, kind, needle):
    assert_flags(module(extra=extra, body=body), kind, needle)


def test_error_messages_and_dict_reads_keep_their_strings():
    src = module(
        body="""
assert dout.dim() == 2, "dout must be 2-D"
if dout.shape[0] == 0:
    raise ValueError("empty dout")
"""
    )
    assert check_static(BWD, src).status == "pass", [(f.kind, f.message) for f in check_static(BWD, src).findings]


@pytest.mark.parametrize(
    "header,body,kind,needle",
    [
        # a metaclass call defines a class, with run-time dunders
        ("import cutlass\n", 'C = cutlass.NumericMeta("Zed", (int,), {})', "banned-call", "NumericMeta"),
        # an epilogue mod built outside @gemm_epilogue, where no epilogue check sees it
        ("from quack.epilogue import EpiMod\n", "", "banned-call", "import EpiMod"),
        # typing names as values: typing.Optional[s] is a ForwardRef library code evaluates
        ("import typing\n", "t = typing.Optional[int]", "banned-attribute", "typing.Optional[int]"),
        # a nested def handed to a library call is a library-callback (not only module-level defs)
        (
            "import functools\n",
            "def inner(v):\n    return v\np = functools.partial(inner, 1)",
            "library-callback",
            "functools.partial(inner",
        ),
        # %-formatting with a run-time format string: the right operand must be a number by its form
        ("", "k = dout.shape[0]\nr = k % k", "banned-call", "r = k % k"),
        # const_expr hands its argument back: a string given to it is a value
        ("import cutlass\n", 'u = cutlass.const_expr("_")', "string-value", "const_expr"),
    ],
)
def test_metaclasses_typing_values_and_callbacks_are_refused(header, body, kind, needle):
    assert_flags(module(header=header, body=body), kind, needle)


def test_numbers_by_their_form_pass_modulo_and_messages_may_format():
    src = module(
        header="from quack.gemm_config import GemmConfig\n",
        extra="TILE = 192\nCFG = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1)\n",
        body="""
a = dout.shape[0] % 8 + dout.size(1) % TILE + dout.shape[1] % CFG.tile_n + len(dout.shape) % 2
if a < 0:
    raise ValueError(f"bad shapes {dout.shape} and {w_down.shape}")
assert dout.dim() == 2, f"dout must be 2-D, got {dout.dim()}"
""",
    )
    assert check_static(BWD, src).status == "pass", [(f.kind, f.message) for f in check_static(BWD, src).findings]


def test_typing_in_annotations_passes():
    src = module(
        header="import typing\n",
        extra="""
def _rows(t: typing.Optional[torch.Tensor]) -> typing.Tuple[int, int]:
    return t.shape[0], t.shape[1]
""",
        body="m2, i2 = _rows(dout)",
    )
    assert check_static(BWD, src).status == "pass", [(f.kind, f.message) for f in check_static(BWD, src).findings]

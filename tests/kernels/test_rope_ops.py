"""coda_agent.kernels QKV + RoPE family: qkv_rope, deferred_rmsnorm_qkv_rope (CODA item 5) and
rope_bwd_op (item 10).

On the CPU the specs' PyTorch functions stand in for the kernels (``baseline`` in float32,
``reference`` in float64 for gradcheck); the plain torch implementation the ops are
checked against rotates with complex multiplication (Meta's apply_rotary_emb), independent
of the glue's and the specs' pair arithmetic. On an H200 the real kernels run (``gpu``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from glue_helpers import MODES, check_against_torch, check_on_gpu, compiled_for, reference_module, use_standins

import coda_agent.kernels as K

HQ, HKV, HD = 2, 1, 8  # CPU shapes: 2 query heads, 1 key/value head of 8 columns
CONSTS = {"n_q_heads": HQ, "n_kv_heads": HKV, "head_dim": HD}
GPU_CONSTS = {"n_q_heads": 4, "n_kv_heads": 2, "head_dim": 64}


def _sd(t):
    return torch.promote_types(t.dtype, torch.float32)


def llama3_inv_freq(head_dim, device="cpu"):
    return (1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float().to(device)


# --------------------------------------------------------------------------- plain torch implementations


def torch_rope(qkv, positions, inv_freq, *, n_q_heads, n_kv_heads, head_dim):
    """Interleaved RoPE of the query/key heads by complex multiplication; V unchanged."""
    sd = _sd(qkv)
    cd = torch.complex128 if sd == torch.float64 else torch.complex64
    m, n_rot = qkv.shape[0], (n_q_heads + n_kv_heads) * head_dim
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    rot = torch.polar(torch.ones_like(theta), theta).to(cd)[:, None, :]
    z = torch.view_as_complex(qkv[:, :n_rot].to(sd).reshape(m, n_q_heads + n_kv_heads, head_dim // 2, 2).contiguous())
    out = torch.view_as_real(z * rot).reshape(m, n_rot).to(qkv.dtype)
    return torch.cat((out, qkv[:, n_rot:]), dim=1)


def torch_qkv_rope(x, w_qkv, positions, inv_freq, **consts):
    return torch_rope(x @ w_qkv.T, positions, inv_freq, **consts)


def torch_deferred_qkv_rope(a, rstd, w_qkv, positions, inv_freq, **consts):
    h = (a.to(_sd(a)) * rstd.to(_sd(a))[:, None]).to(a.dtype)
    return torch_rope(h @ w_qkv.T, positions, inv_freq, **consts)


def torch_rope_bwd(g, w, positions, inv_freq, **consts):
    """The VJP of torch_rope at the upstream gradient g @ w^T (rope is linear)."""
    up = g @ w.T
    with torch.enable_grad():
        z = torch.zeros_like(up, requires_grad=True)
        (d,) = torch.autograd.grad(torch_rope(z, positions, inv_freq, **consts), z, up)
    return d


# --------------------------------------------------------------------------- inputs


def _n(consts):
    return (consts["n_q_heads"] + 2 * consts["n_kv_heads"]) * consts["head_dim"]


def qkv_inputs(device, dtype, consts=CONSTS, M=10, K=12, S=4096, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device).to(dtype)
    w = (torch.randn(_n(consts), K, generator=g, device=device) / K**0.5).to(dtype)
    pos = torch.randint(0, S, (M,), generator=g, device=device)
    return [x, w, pos, llama3_inv_freq(consts["head_dim"], device)]


def deferred_inputs(device, dtype, consts=CONSTS, M=10, K=12, S=4096, seed=0):
    x, w, pos, f = qkv_inputs(device, dtype, consts, M, K, S, seed)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    rstd = (torch.rand(M, generator=g, device=device) * 1.5 + 0.5).to(torch.promote_types(dtype, torch.float32))
    return [x, rstd, w, pos, f]


@dataclass
class Case:
    op: Callable
    torch_fn: Callable
    make: Callable
    diff: tuple
    names: tuple
    kernel: str


CASES = {
    "qkv_rope": Case(K.qkv_rope, torch_qkv_rope, qkv_inputs, (0, 1), ("qkv", "dx", "dw_qkv"), "gemm_rope"),
    "deferred_rmsnorm_qkv_rope": Case(
        K.deferred_rmsnorm_qkv_rope,
        torch_deferred_qkv_rope,
        deferred_inputs,
        (0, 1, 2),
        ("qkv", "da", "drstd", "dw_qkv"),
        "gemm_rmsnorm_rope",
    ),
}


# --------------------------------------------------------------------------- stand-ins


def standins(kind: str) -> dict:
    """The specs' ``baseline`` (float32) or ``reference`` (exact in float64) as kernel entries,
    with the keyword-only constants the specs' functions take (HQ, HKV)."""
    fwd = getattr(reference_module("gemm_rope"), kind)
    dfw = getattr(reference_module("gemm_rmsnorm_rope"), kind)
    bwd = getattr(reference_module("rope_bwd"), kind)

    def gemm_rope(x, w_qkv, positions, inv_freq, *, HQ, HKV):
        return fwd(x=x, w_qkv=w_qkv, positions=positions, inv_freq=inv_freq, HQ=HQ, HKV=HKV)["qkv"]

    def gemm_rmsnorm_rope(a, rstd, w_qkv, positions, inv_freq, *, HQ, HKV):
        return (dfw(a=a, rstd=rstd, w_qkv=w_qkv, positions=positions, inv_freq=inv_freq, HQ=HQ, HKV=HKV)["qkv"],)

    def rope_bwd(g, w, positions, inv_freq, *, HQ, HKV):
        return bwd(g=g, w=w, positions=positions, inv_freq=inv_freq, HQ=HQ, HKV=HKV)["dqkv"]

    return {"gemm_rope": gemm_rope, "gemm_rmsnorm_rope": gemm_rmsnorm_rope, "rope_bwd": rope_bwd}


@pytest.fixture
def baseline_kernels(monkeypatch):
    return use_standins(monkeypatch, standins("baseline"))


# --------------------------------------------------------------------------- CPU tests


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_cpu(name, baseline_kernels):
    case = CASES[name]
    check_against_torch(
        functools.partial(case.op, **CONSTS),
        functools.partial(case.torch_fn, **CONSTS),
        case.make("cpu", torch.float32),
        case.diff,
        rtol=1e-4,
        names=case.names,
    )
    assert baseline_kernels[case.kernel] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_float64_cpu(name, monkeypatch):
    """torch.autograd.gradcheck of the hand-written backward (R^T + GEMM grads), float64."""
    use_standins(monkeypatch, standins("reference"))
    case = CASES[name]
    args = case.make("cpu", torch.float64, M=5, K=6)
    fixed = {i: a for i, a in enumerate(args) if i not in case.diff}
    diff = tuple(args[i].requires_grad_() for i in case.diff)

    def fn(*d):
        it = iter(d)
        return case.op(*[fixed[i] if i in fixed else next(it) for i in range(len(args))], **CONSTS)

    assert torch.autograd.gradcheck(fn, diff, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_rope_bwd_op_cpu(baseline_kernels):
    g, w, pos, f = qkv_inputs("cpu", torch.float32)
    got = K.rope_bwd_op(g, w, pos, f, **CONSTS)
    want = torch_rope_bwd(g.double(), w.double(), pos, f, **CONSTS)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert baseline_kernels["rope_bwd"] == 1


def test_rope_bwd_is_the_adjoint_of_the_forward_rotation():
    """The glue's R^T (used in both backwards) is the transpose of its forward rotation:
    <R(u), v> = <u, R^T(v)> for random u, v (float64)."""
    from coda_agent.kernels._rope import rope_rotate

    m, n_rot = 7, (HQ + HKV) * HD
    u, v = torch.randn(m, _n(CONSTS), dtype=torch.float64), torch.randn(m, _n(CONSTS), dtype=torch.float64)
    pos, f = torch.randint(0, 100000, (m,)), llama3_inv_freq(HD)
    lhs = (rope_rotate(u, pos, f, n_rot) * v).sum()
    rhs = (u * rope_rotate(v, pos, f, n_rot, inverse=True)).sum()
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rope_rotate(u, pos, f, n_rot), torch_rope(u, pos, f, **CONSTS), rtol=1e-12, atol=1e-12)


def _rope_rotate_by_cat(t, positions, inv_freq, n_rot, inverse=False):
    """The glue's rotation in its concatenating form (rotated heads concatenated with the
    value heads), kept as the reference: rope_rotate must not change a bit of it."""
    acc = torch.promote_types(t.dtype, torch.float32)
    half = inv_freq.shape[0]
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().to(acc)[:, None, :], theta.sin().to(acc)[:, None, :]
    sin = -sin if inverse else sin
    pairs = t[:, :n_rot].to(acc).unflatten(1, (n_rot // (2 * half), half, 2))
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).flatten(1)
    return torch.cat((rotated.to(t.dtype), t[:, n_rot:]), dim=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_rotate_matches_the_concatenating_form_bitwise(dtype, inverse):
    """Both forms of the glue's rotation (eager: rotate Q/K and concatenate; traced: one
    pointwise expression, value heads chosen by torch.where) give the bits of the
    concatenating form, in bf16 and fp32, value heads passed through untouched."""
    from coda_agent.kernels._rope import rope_rotate

    n_rot = (HQ + HKV) * HD
    t = torch.randn(9, _n(CONSTS)).to(dtype)
    pos, f = torch.randint(0, 100000, (9,)), llama3_inv_freq(HD)
    want = _rope_rotate_by_cat(t, pos, f, n_rot, inverse)
    got = rope_rotate(t, pos, f, n_rot, inverse=inverse)
    assert got.dtype == dtype and torch.equal(got, want)
    assert torch.equal(got[:, n_rot:], t[:, n_rot:])
    assert not torch.equal(got[:, :n_rot], t[:, :n_rot])
    compiling = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True  # the where-form that torch.compile traces
    try:
        traced_form = rope_rotate(t, pos, f, n_rot, inverse=inverse)
    finally:
        torch.compiler.is_compiling = compiling
    assert torch.equal(traced_form, want)


def test_rope_rotate_refuses_partial_heads_and_out_of_range_n_rot():
    from coda_agent.kernels._rope import rope_rotate

    t, pos, f = torch.randn(3, _n(CONSTS)), torch.arange(3), llama3_inv_freq(HD)
    with pytest.raises(ValueError, match=f"multiples of head_dim = 2 \\* len\\(inv_freq\\) = {HD} > 0"):
        rope_rotate(t, pos, f, HD + 2)
    with pytest.raises(ValueError, match="multiples of head_dim"):
        rope_rotate(t[:, :-2], pos, f, HD)
    for n_rot in (-HD, _n(CONSTS) + HD):  # whole heads, but not within [0, N]
        with pytest.raises(ValueError, match="with 0 <= n_rot <= N"):
            rope_rotate(t, pos, f, n_rot)
    with pytest.raises(ValueError, match="head_dim = 2 \\* len\\(inv_freq\\) = 0 > 0"):
        rope_rotate(t, pos, f[:0], 0)
    assert torch.equal(rope_rotate(t, pos, f, 0), t)  # nothing rotated


@pytest.mark.slow
def test_rope_cos_sin_is_an_opaque_custom_op_under_compile():
    """The angle table is a custom op: opcheck passes, its values are float64 cos/sin, and the
    graph torch.compile traces from the rotation calls it once and evaluates no cos/sin of its
    own, as a function or a method (traced, Inductor inlined float64 sin/cos into the
    per-element kernel: 0.51 against 0.22 ms at llama3-8b)."""
    from coda_agent.kernels._rope import _rope_cos_sin as rope_cos_sin
    from coda_agent.kernels._rope import rope_rotate

    pos, f = torch.randint(0, 100000, (5,)), llama3_inv_freq(HD)
    for dtype in (torch.float32, torch.float64):
        torch.library.opcheck(rope_cos_sin, (pos, f, dtype))
    c, s = rope_cos_sin(pos, f, torch.float64)
    theta = pos.double()[:, None] * f.double()[None, :]
    assert c.shape == (5, HD // 2) and torch.equal(c, theta.cos()) and torch.equal(s, theta.sin())

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    t = torch.randn(5, _n(CONSTS))
    out = torch.compile(
        lambda t: rope_rotate(t, pos, f, (HQ + HKV) * HD, inverse=True), backend=capture, fullgraph=True
    )(t)
    torch.testing.assert_close(out, rope_rotate(t, pos, f, (HQ + HKV) * HD, inverse=True), rtol=0, atol=0)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]
    assert targets.count("coda_agent.rope_cos_sin.default") == 1, targets
    assert not [
        x for x in targets if "cos" in x.split(".")[-1] or "sin" in x.split(".")[-1] if "rope_cos_sin" not in x
    ], targets


@pytest.mark.parametrize("emulate_torch_211", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_op_backward_traces_the_single_pass_rotation(baseline_kernels, monkeypatch, emulate_torch_211, name):
    """The op's registered backward is traced by AOTAutograd, outside Dynamo. torch 2.13 keeps
    is_compiling() up for the whole compile; torch 2.11 (the H200's) does not, and the glue
    then traced the concatenating form (two kernels). _traced() also sees the proxy mode:
    the backward graph has the torch.where form and no cat, with either torch."""
    import contextlib

    from torch._dynamo.backends.common import aot_autograd

    if emulate_torch_211:
        if not hasattr(torch.compiler, "_compile_session_context"):
            pytest.skip("this torch already behaves as 2.11")
        monkeypatch.setattr(torch.compiler, "_compile_session_context", contextlib.nullcontext)
    graphs = []
    backend = aot_autograd(
        fw_compiler=lambda gm, ex: gm.forward, bw_compiler=lambda gm, ex: (graphs.append(gm), gm.forward)[1]
    )
    torch._dynamo.reset()
    case = CASES[name]
    args = case.make("cpu", torch.float32)
    diff = [args[i].requires_grad_() for i in case.diff]
    op = functools.partial(case.op, **CONSTS)
    out = torch.compile(op, fullgraph=True, backend=backend)(*args)
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, diff, dy)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]
    assert graphs and any("where" in t for t in targets) and not any("cat" in t for t in targets), targets
    want = torch.autograd.grad(op(*args), diff, dy)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=False))  # the same bits as eager


def test_double_backward_through_the_glue_with_a_trainable_inv_freq(monkeypatch):
    """inv_freq that requires grad (a user's learnable frequencies) must not break a second
    backward: the angle table is built from inv_freq.detach() (the ops document no gradient
    for inv_freq), so the custom op needs no autograd formula."""
    use_standins(monkeypatch, standins("reference"))
    x, w, pos, f = qkv_inputs("cpu", torch.float64)
    x.requires_grad_(), w.requires_grad_()
    f = f.double().requires_grad_()
    out = K.qkv_rope(x, w, pos, f, **CONSTS)
    (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    gx.pow(2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("signature", ["HQ,HKV", "HQ,HKV,HD", "**kwargs", "bare-or-tuple"])
def test_kernel_constants_are_passed_as_the_entry_declares(signature, monkeypatch):
    """The specs' keyword-only constants: run_kernel passes those the entry declares (the
    glue offers HQ, HKV and HD); a single output may come back bare or as a 1-tuple."""
    base = reference_module("gemm_rope").baseline
    got_consts = {}

    def run(x, w, p, f, consts):
        got_consts.update(consts)
        return base(x=x, w_qkv=w, positions=p, inv_freq=f, HQ=consts["HQ"], HKV=consts["HKV"])["qkv"]

    entries = {
        "HQ,HKV": lambda x, w, p, f, *, HQ, HKV: run(x, w, p, f, {"HQ": HQ, "HKV": HKV}),
        "HQ,HKV,HD": lambda x, w, p, f, *, HQ, HKV, HD: run(x, w, p, f, {"HQ": HQ, "HKV": HKV, "HD": HD}),
        "**kwargs": lambda x, w, p, f, **kw: run(x, w, p, f, kw),
        "bare-or-tuple": lambda x, w, p, f, *, HQ, HKV: (run(x, w, p, f, {"HQ": HQ, "HKV": HKV}),),
    }
    use_standins(monkeypatch, {"gemm_rope": entries[signature]})
    args = qkv_inputs("cpu", torch.float32)
    out = K.qkv_rope(*args, **CONSTS)
    want = {
        "HQ,HKV": {"HQ": HQ, "HKV": HKV},
        "**kwargs": {"HQ": HQ, "HKV": HKV, "HD": HD},
        "HQ,HKV,HD": {"HQ": HQ, "HKV": HKV, "HD": HD},
        "bare-or-tuple": {"HQ": HQ, "HKV": HKV},
    }[signature]
    assert got_consts == want
    torch.testing.assert_close(out, torch_qkv_rope(*args, **CONSTS), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_opcheck_cpu(baseline_kernels):
    from coda_agent.kernels import _rope

    x, w, pos, f = qkv_inputs("cpu", torch.float32)
    a, rstd, w2, pos2, f2 = deferred_inputs("cpu", torch.float32)
    torch.library.opcheck(K.gemm_rope_op, (x, w, pos, f), CONSTS)
    torch.library.opcheck(K.gemm_rmsnorm_rope_op, (a, rstd, w2, pos2, f2), CONSTS)
    torch.library.opcheck(K.rope_bwd_op, (x, w, pos, f), CONSTS)
    c = (HQ, HKV, HD)
    torch.library.opcheck(_rope._qkv_rope, (x.clone().requires_grad_(), w.clone().requires_grad_(), pos, f, *c))
    torch.library.opcheck(
        _rope._deferred_qkv_rope,
        (a.clone().requires_grad_(), rstd.clone().requires_grad_(), w2.clone().requires_grad_(), pos2, f2, *c),
    )


@pytest.mark.parametrize("name", list(CASES))
def test_under_torch_compile_cpu(name, baseline_kernels):
    torch._dynamo.reset()
    case = CASES[name]
    compiled = torch.compile(functools.partial(case.op, **CONSTS), fullgraph=True, backend="aot_eager")
    check_against_torch(
        compiled,
        functools.partial(case.torch_fn, **CONSTS),
        case.make("cpu", torch.float32),
        case.diff,
        rtol=1e-4,
        names=case.names,
    )


def test_rope_bwd_op_under_torch_compile_cpu(baseline_kernels):
    torch._dynamo.reset()
    g, w, pos, f = qkv_inputs("cpu", torch.float32)
    compiled = torch.compile(functools.partial(K.rope_bwd_op, **CONSTS), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(
        compiled(g, w, pos, f).double(), torch_rope_bwd(g.double(), w.double(), pos, f, **CONSTS), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("name", [*CASES, "rope_bwd_op"])
def test_cpu_tensors_are_refused_clearly(name, monkeypatch):
    monkeypatch.setattr(K, "_check_layout", lambda *a, **kw: None)  # checked first; this test is the device's
    op, make = (K.rope_bwd_op, qkv_inputs) if name == "rope_bwd_op" else (CASES[name].op, CASES[name].make)
    with pytest.raises(ValueError, match=f"{name}: the fused kernels need all tensors on one CUDA"):
        op(*make("cpu", torch.float32), **CONSTS)


@pytest.mark.parametrize("name", [*CASES, "rope_bwd_op"])
def test_bad_arguments_are_refused(name, baseline_kernels):
    op, make = (K.rope_bwd_op, qkv_inputs) if name == "rope_bwd_op" else (CASES[name].op, CASES[name].make)
    args = make("cpu", torch.float32)
    with pytest.raises(ValueError, match="even head_dim"):
        op(*args, **{**CONSTS, "head_dim": HD - 1})
    with pytest.raises(ValueError, match=r"\(\(n_q_heads \+ 2 \* n_kv_heads\) \* head_dim = 48, K\)"):
        op(*args, **{**CONSTS, "n_kv_heads": HKV + 1})
    bad = list(args)
    bad[-1] = llama3_inv_freq(2 * HD)
    with pytest.raises(ValueError, match="inv_freq must be"):
        op(*bad, **CONSTS)
    bad = list(args)
    bad[-2] = bad[-2][:-1]
    with pytest.raises(ValueError, match="positions must be"):
        op(*bad, **CONSTS)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_pytorch_on_gpu(name, mode):
    """The accepted kernels in training: outputs and gradients match PyTorch (bf16 budget)."""
    case = CASES[name]
    if case.kernel not in K.accepted():
        pytest.skip(f"{case.kernel} not accepted yet")
    torch._dynamo.reset()
    op = functools.partial(case.op, **GPU_CONSTS)
    args = case.make("cuda", torch.bfloat16, GPU_CONSTS, M=333, K=264, S=8192)
    fn = compiled_for(mode, op, args, case.diff)
    check_on_gpu(fn, functools.partial(case.torch_fn, **GPU_CONSTS), args, case.diff, case.names)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_rope_bwd_op_on_gpu(compiled):
    if "rope_bwd" not in K.accepted():
        pytest.skip("rope_bwd not accepted yet")
    torch._dynamo.reset()
    op = functools.partial(K.rope_bwd_op, **GPU_CONSTS)
    fn = torch.compile(op, fullgraph=True) if compiled else op
    g, w, pos, f = qkv_inputs("cuda", torch.bfloat16, GPU_CONSTS, M=333, K=264, S=8192)
    got = fn(g, w, pos, f).float()
    ref = torch_rope_bwd(g.float(), w.float(), pos, f, **GPU_CONSTS)
    low = torch_rope_bwd(g, w, pos, f, **GPU_CONSTS).float()
    err, budget = (got - ref).abs().max().item(), 2 * (low - ref).abs().max().item() + 1e-6
    assert err <= budget, f"dqkv: max err {err:.3e} > allowed {budget:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_on_gpu(name, compiled):
    """The forward kernel alone, no gradients: qkv."""
    case = CASES[name]
    if case.kernel not in K.accepted():
        pytest.skip(f"{case.kernel} not accepted yet")
    torch._dynamo.reset()
    op = functools.partial(case.op, **GPU_CONSTS)
    fn = torch.compile(op, fullgraph=True) if compiled else op
    args = case.make("cuda", torch.bfloat16, GPU_CONSTS, M=333, K=264, S=8192)
    check_on_gpu(fn, functools.partial(case.torch_fn, **GPU_CONSTS), args, (), case.names[:1])

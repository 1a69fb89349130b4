"""coda_agent.kernels RMSNorm family: residual_rmsnorm, rmsnorm_linear, deferred_rmsnorm_linear,
deferred_rmsnorm_swiglu (CODA items 2, 3, 4) and rms_bwd_op (item 8).

On the CPU the specs' PyTorch functions stand in for the kernels (``baseline`` in float32;
``reference`` -- written for float64 too -- for gradcheck; for rms_bwd also the spec's
epilogue formula, which, unlike its baseline, reads the precomputed ``zdz``), so the tests
check the ops' wiring: saved tensors, hand-written backward formulas, fake impls,
torch.compile. On an H200 the real accepted kernels run (``gpu`` marker).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from glue_helpers import MODES, check_against_torch, check_on_gpu, compiled_for, entry, reference_module, use_standins

import coda_agent.kernels as K
from coda_agent.kernels import _rmsnorm

EPS = 1e-6


def _sd(t):
    return torch.promote_types(t.dtype, torch.float32)


# --------------------------------------------------------------------------- plain torch implementations


def torch_residual_rmsnorm(x, w_o, residual, gamma, eps=EPS):
    y = x @ w_o.T + residual
    return y, y * gamma, torch.rsqrt(y.to(_sd(y)).pow(2).mean(dim=-1) + eps)


def torch_rmsnorm_linear(h, gamma, w, eps=EPS):
    rstd = torch.rsqrt(h.to(_sd(h)).pow(2).mean(dim=-1) + eps)
    return ((h.to(rstd.dtype) * rstd[:, None]).to(h.dtype) * gamma) @ w.T


def torch_deferred_linear(a, rstd, w):
    return (a.to(_sd(a)) * rstd.to(_sd(a))[:, None]).to(a.dtype) @ w.T


def torch_deferred_swiglu(normed_w, rstd, w1):
    pre = torch_deferred_linear(normed_w, rstd, w1)
    return pre, F.silu(pre[:, 0::2]) * pre[:, 1::2]


def torch_deferred_swiglu_mlp(normed_w, rstd, w1, w_down):
    return torch_deferred_swiglu(normed_w, rstd, w1)[1] @ w_down.T


# --------------------------------------------------------------------------- inputs


def _gen(device, seed):
    return torch.Generator(device=device).manual_seed(seed)


def _randn(g, *shape, std=1.0, device="cpu"):
    return torch.randn(*shape, generator=g, device=device) * std


def _uniform(g, *shape, low, high, device="cpu"):
    return torch.rand(*shape, generator=g, device=device) * (high - low) + low


def residual_inputs(device, dtype, M=24, K=20, N=28, seed=0):
    g = _gen(device, seed)
    return [
        _randn(g, M, K, device=device).to(dtype),
        _randn(g, N, K, std=K**-0.5, device=device).to(dtype),
        _randn(g, M, N, device=device).to(dtype),
        _uniform(g, N, low=0.5, high=1.5, device=device).to(dtype),
    ]


def rmsnorm_linear_inputs(device, dtype, M=24, K=20, N=28, seed=0):
    g = _gen(device, seed)
    return [
        _randn(g, M, K, std=2.0, device=device).to(dtype),
        _uniform(g, K, low=0.5, high=1.5, device=device).to(dtype),
        _randn(g, N, K, std=K**-0.5, device=device).to(dtype),
    ]


def deferred_inputs(device, dtype, M=24, K=20, N=28, seed=0):
    g = _gen(device, seed)
    return [
        _randn(g, M, K, device=device).to(dtype),
        _uniform(g, M, low=0.5, high=2.0, device=device).to(torch.promote_types(dtype, torch.float32)),
        _randn(g, N, K, std=K**-0.5, device=device).to(dtype),
    ]


def deferred_mlp_inputs(device, dtype, M=24, K=20, N=28, seed=0):
    """normed_w (M, K), rstd (M,), w1 (N = 2I, K), w_down (K, I)."""
    a, rstd, w1 = deferred_inputs(device, dtype, M=M, K=K, N=N, seed=seed)
    g = _gen(device, seed + 7)
    return [a, rstd, w1, _randn(g, K, N // 2, std=(N // 2) ** -0.5, device=device).to(dtype)]


@dataclass
class Case:
    op: Callable
    torch_fn: Callable
    make: Callable
    diff: tuple
    names: tuple
    kernels: tuple  # accepted kernels it needs (forward, backward)


CASES = {
    "residual_rmsnorm": Case(
        K.residual_rmsnorm,
        torch_residual_rmsnorm,
        residual_inputs,
        (0, 1, 2, 3),
        ("resid_out", "normed_w", "rstd", "dx", "dw_o", "dresidual", "dgamma"),
        ("gemm_residual_partial_rms",),
    ),
    "rmsnorm_linear": Case(
        K.rmsnorm_linear,
        torch_rmsnorm_linear,
        rmsnorm_linear_inputs,
        (0, 1, 2),
        ("out", "dh", "dgamma", "dw"),
        ("gemm_rmsnorm",),
    ),
    "deferred_rmsnorm_linear": Case(
        K.deferred_rmsnorm_linear,
        torch_deferred_linear,
        deferred_inputs,
        (0, 1, 2),
        ("out", "da", "drstd", "dw"),
        ("gemm_rmsnorm",),
    ),
    "deferred_rmsnorm_swiglu": Case(
        K.deferred_rmsnorm_swiglu,
        torch_deferred_swiglu,
        deferred_inputs,
        (0, 1, 2),
        ("preact", "postact", "dnormed_w", "drstd", "dw1"),
        ("gemm_rmsnorm_swiglu",),
    ),
    "deferred_rmsnorm_swiglu_mlp": Case(
        K.deferred_rmsnorm_swiglu_mlp,
        torch_deferred_swiglu_mlp,
        deferred_mlp_inputs,
        (0, 1, 2, 3),
        ("out", "dnormed_w", "drstd", "dw1", "dw_down"),
        ("gemm_rmsnorm_swiglu", "swiglu_bwd"),
    ),
}


# --------------------------------------------------------------------------- stand-ins


def rms_bwd_spec_math(dy, w, h, gamma, rstd, zdz, dresid):
    """rms_bwd from its spec's epilogue formula (reads the precomputed zdz, as the kernel does):
    dh = (acc * gamma - xhat * zdz) * rstd + dresid, dgamma = sum_m acc * xhat, acc = dy @ w."""
    sd = _sd(h)
    acc = dy.to(sd) @ w.to(sd)
    r = rstd.to(sd)[:, None]
    xhat = h.to(sd) * r
    dh = (acc * gamma.to(sd) - xhat * zdz.to(sd)[:, None]) * r + dresid.to(sd)
    return dh.to(h.dtype), (acc * xhat).sum(dim=0)


def standins(kind: str, rms_bwd: str = "baseline") -> dict:
    """kind: "baseline" (the specs' unfused PyTorch code, float32) or "reference" (the specs'
    standard definitions, exact in float64). rms_bwd: "baseline" (recomputes the correction
    itself, ignores zdz) or "spec_math" (uses zdz)."""
    res = reference_module("gemm_residual_partial_rms")
    rms = reference_module("gemm_rmsnorm")
    swi = reference_module("gemm_rmsnorm_swiglu")
    bwd = reference_module("rms_bwd")
    sbw = reference_module("swiglu_bwd")
    return {
        # the swiglu_bwd spec's reference gives postact only (its gradients come from autograd);
        # its baseline computes dpreact by formula, exact to rounding in float64 too
        "swiglu_bwd": entry(sbw.baseline, ["dout", "w_down", "preact"], ["dpreact", "postact"]),
        "gemm_residual_partial_rms": entry(
            getattr(res, kind), ["x", "w_o", "residual", "gamma"], ["resid_out", "normed_w", "rstd"]
        ),
        "gemm_rmsnorm": entry(getattr(rms, kind), ["a", "rstd", "w"], ["out"]),
        "gemm_rmsnorm_swiglu": entry(getattr(swi, kind), ["normed_w", "rstd", "w1"], ["preact", "postact"]),
        "rms_bwd": rms_bwd_spec_math
        if rms_bwd == "spec_math"
        else entry(bwd.baseline, ["dy", "w", "h", "gamma", "rstd", "zdz", "dresid"], ["dh", "dgamma"]),
    }


@pytest.fixture
def baseline_kernels(monkeypatch):
    return use_standins(monkeypatch, standins("baseline"))


# --------------------------------------------------------------------------- CPU tests


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_cpu(name, baseline_kernels):
    case = CASES[name]
    check_against_torch(case.op, case.torch_fn, case.make("cpu", torch.float32), case.diff, rtol=1e-4, names=case.names)
    for k in case.kernels:  # the op really went through its kernels
        assert baseline_kernels[k] == 1, (k, baseline_kernels)


def rms_bwd_inputs(device, dtype, M=24, D=16, N=32, seed=0):
    """dy, w, h, gamma, rstd, zdz, dresid as the rms_bwd spec derives them (rstd, zdz fp32)."""
    h, gamma, w = rmsnorm_linear_inputs(device, dtype, M=M, K=D, N=N, seed=seed)
    g = _gen(device, seed + 1)
    dy, dresid = _randn(g, M, N, device=device).to(dtype), _randn(g, M, D, device=device).to(dtype)
    ref = reference_module("rms_bwd")
    rstd = ref.saved_rstd(h=h)
    return [dy, w, h, gamma, rstd, ref.saved_zdz(dy=dy, w=w, h=h, gamma=gamma, rstd=rstd), dresid]


def test_rms_bwd_op_is_the_spec_reference_cpu(monkeypatch):
    """rms_bwd_op hands its arguments to the kernel entry in the spec's order: with the
    spec's epilogue formula as the kernel, dh and dgamma are the reference's (float64)."""
    use_standins(monkeypatch, standins("reference", rms_bwd="spec_math"))
    args = rms_bwd_inputs("cpu", torch.float64)
    dh, dgamma = K.rms_bwd_op(*args)
    want = reference_module("rms_bwd").reference(
        **dict(zip(("dy", "w", "h", "gamma", "rstd", "zdz", "dresid"), args, strict=False))
    )
    torch.testing.assert_close(dh, want["dh"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dgamma, want["dgamma"], rtol=1e-10, atol=1e-12)


def test_rmsnorm_linear_does_not_run_rms_bwd_cpu(baseline_kernels):
    """rmsnorm_linear's backward is plain torch (measured faster than zdz in torch + rms_bwd)."""
    h, gamma, w = (t.requires_grad_() for t in rmsnorm_linear_inputs("cpu", torch.float32))
    K.rmsnorm_linear(h, gamma, w).sum().backward()
    assert baseline_kernels["gemm_rmsnorm"] == 1 and baseline_kernels["rms_bwd"] == 0
    assert h.grad is not None and gamma.grad is not None and w.grad is not None


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_float64_cpu(name, monkeypatch):
    """torch.autograd.gradcheck of the hand-written backward formulas (float64 stand-ins:
    the specs' standard definitions; rms_bwd from its spec formula with zdz)."""
    use_standins(monkeypatch, standins("reference", rms_bwd="spec_math"))
    case = CASES[name]
    args = [a.requires_grad_() for a in case.make("cpu", torch.float64, M=5, K=6, N=8)]
    assert torch.autograd.gradcheck(case.op, tuple(args), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.slow
def test_opcheck_cpu(baseline_kernels):
    from coda_agent.kernels import _rmsnorm

    x, w_o, residual, gamma = residual_inputs("cpu", torch.float32)
    a, rstd, w = deferred_inputs("cpu", torch.float32)
    h, g2, w2 = rmsnorm_linear_inputs("cpu", torch.float32)
    torch.library.opcheck(K.gemm_residual_partial_rms_op, (x, w_o, residual, gamma))
    torch.library.opcheck(K.gemm_rmsnorm_op, (a, rstd, w))
    torch.library.opcheck(K.gemm_rmsnorm_swiglu_op, (a, rstd, w))
    dy = torch.randn(h.shape[0], w2.shape[0])
    zdz = torch.randn(h.shape[0])
    torch.library.opcheck(K.rms_bwd_op, (dy, w2, h, g2, torch.rand(h.shape[0]) + 0.5, zdz, torch.randn_like(h)))
    rg = lambda *ts: tuple(t.detach().clone().requires_grad_() for t in ts)  # noqa: E731
    torch.library.opcheck(_rmsnorm._residual_rmsnorm, rg(x, w_o, residual, gamma))
    torch.library.opcheck(_rmsnorm._deferred_rmsnorm_linear, rg(a, rstd, w))
    torch.library.opcheck(_rmsnorm._deferred_rmsnorm_swiglu, rg(a, rstd, w))
    a4, rstd4, w14, wd4 = deferred_mlp_inputs("cpu", torch.float32)
    torch.library.opcheck(_rmsnorm._deferred_rmsnorm_swiglu_mlp, rg(a4, rstd4, w14, wd4))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_under_torch_compile_cpu(name, baseline_kernels):
    torch._dynamo.reset()
    case = CASES[name]
    compiled = torch.compile(case.op, fullgraph=True, backend="aot_eager")
    check_against_torch(
        compiled, case.torch_fn, case.make("cpu", torch.float32), case.diff, rtol=1e-4, names=case.names
    )


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_tensors_are_refused_clearly(name, monkeypatch):
    monkeypatch.setattr(K, "_check_layout", lambda *a, **kw: None)  # checked first; this test is the device's
    case = CASES[name]
    with pytest.raises(ValueError, match=f"{name}: the fused kernels need all tensors on one CUDA"):
        case.op(*case.make("cpu", torch.float32))


def test_bad_shapes_are_refused(baseline_kernels):
    x, w_o, residual, gamma = residual_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="residual_rmsnorm: x .* must share K"):
        K.residual_rmsnorm(x, w_o[:, :-1], residual, gamma)
    with pytest.raises(ValueError, match="residual_rmsnorm: residual must be"):
        K.residual_rmsnorm(x, w_o, residual, gamma[:-1])
    h, g, w = rmsnorm_linear_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="rmsnorm_linear: need h"):
        K.rmsnorm_linear(h, g[:-1], w)
    a, rstd, w = deferred_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="deferred_rmsnorm_linear: need a"):
        K.deferred_rmsnorm_linear(a, rstd[:-1], w)
    with pytest.raises(ValueError, match="deferred_rmsnorm_swiglu: w1 needs an even"):
        K.deferred_rmsnorm_swiglu(a, rstd, w[:-1])
    a4, rstd4, w14, wd4 = deferred_mlp_inputs("cpu", torch.float32)
    for bad in ((a4[0], rstd4, w14, wd4), (a4, rstd4, w14, wd4[:, :-1]), (a4, rstd4, w14[:-1], wd4)):
        with pytest.raises(ValueError, match=r"deferred_rmsnorm_swiglu_mlp: need w1 \(2I, D\) and w_down"):
            K.deferred_rmsnorm_swiglu_mlp(*bad)  # (a 1-D normed_w was an IndexError)


# --------------------------------------------------------------------------- eps


def small_rows(name, device, dtype, **kw):
    """The case's inputs with the normalized rows' mean square near 1e-6, where eps = 1e-5
    vs 1e-6 moves rstd by ~2x (with unit-scale rows the difference is below any tolerance)."""
    args = CASES[name].make(device, dtype, **kw)
    if name == "residual_rmsnorm":  # y = x @ w_o^T + residual
        return [args[0] * 1e-3, args[1], args[2] * 1e-3, args[3]]
    return [args[0] * 5e-4, *args[1:]]  # h


@pytest.mark.parametrize("eps", [1e-5, 0.0, 3e-4])
@pytest.mark.parametrize("name", ["residual_rmsnorm", "rmsnorm_linear"])
def test_eps_cpu(name, eps, baseline_kernels):
    """eps reaches the statistics: outputs and all gradients match the standard definition
    with that eps (residual_rmsnorm: through the re-finalized rstd of a 1e-6 kernel), eager
    and under torch.compile."""
    case = CASES[name]
    args = small_rows(name, "cpu", torch.float32)
    rstd_of = (lambda o: o[2]) if name == "residual_rmsnorm" else (lambda o: o)
    changed = rstd_of(case.torch_fn(*args, eps=eps)) / rstd_of(case.torch_fn(*args))
    assert (changed - 1).abs().max() > 0.05  # the inputs make eps matter
    torch._dynamo.reset()
    compiled = torch.compile(partial(case.op, eps=eps), fullgraph=True, backend="aot_eager")
    for fn in (partial(case.op, eps=eps), compiled):
        check_against_torch(fn, partial(case.torch_fn, eps=eps), args, case.diff, rtol=1e-4, names=case.names)
    assert baseline_kernels[case.kernels[0]] == 2


def test_with_eps_is_exact_in_fp32():
    """Re-finalizing a 1e-6 rstd for eps equals finalizing the mean square directly in fp32:
    relative error ~1e-7 * (ms + 1e-6) / (ms + eps), so ~1e-7 for any eps >= 1e-6, from
    mean squares of 0 up to 1e4; an all-zero row at eps = 0 gives a huge rstd, never NaN."""
    ms = torch.cat([torch.zeros(1), torch.logspace(-9, 4, 200)])
    for eps in (1e-5, 1e-6, 1e-3, 1e-7, 0.0):
        got = _rmsnorm._with_eps(torch.rsqrt(ms + 1e-6), eps).double()
        want = torch.rsqrt(ms.double() + eps)
        rel = ((got - want) / want).abs()
        bound = 3e-7 * torch.clamp((ms.double() + 1e-6) / (ms.double() + eps), min=1.0)
        finite = want.isfinite()
        assert (rel[finite] <= bound[finite]).all(), (eps, (rel / bound)[finite].max())
        assert (got[~finite] >= 1e6).all(), (eps, got[~finite])  # inf directly; never NaN


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf"), "1e-5", True, torch.tensor(1e-5), 10**400])
def test_bad_eps_is_refused(eps, baseline_kernels):
    with pytest.raises(ValueError, match=r"residual_rmsnorm: eps must be a finite real number >= 0"):
        K.residual_rmsnorm(*residual_inputs("cpu", torch.float32), eps=eps)
    with pytest.raises(ValueError, match=r"rmsnorm_linear: eps must be a finite real number >= 0"):
        K.rmsnorm_linear(*rmsnorm_linear_inputs("cpu", torch.float32), eps=eps)


def test_numpy_and_int_eps_are_accepted(baseline_kernels):
    """A config's eps may be a NumPy scalar or 0 (np.float32 is not refused as "not a finite
    Python number")."""
    np = pytest.importorskip("numpy")
    args = small_rows("rmsnorm_linear", "cpu", torch.float32)
    want = K.rmsnorm_linear(*args, eps=1e-5)
    assert torch.allclose(K.rmsnorm_linear(*args, eps=np.float32(1e-5)), want, rtol=1e-6)
    assert torch.equal(K.rmsnorm_linear(*args, eps=0), K.rmsnorm_linear(*args, eps=0.0))


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_pytorch_on_gpu(name, mode):
    """The accepted kernels in training: outputs and gradients match PyTorch (bf16 budget)."""
    case = CASES[name]
    missing = set(case.kernels) - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")
    torch._dynamo.reset()
    args = case.make("cuda", torch.bfloat16, M=333, K=264, N=656)  # N = 2I: I too keeps 16-byte rows
    fn = compiled_for(mode, case.op, args, case.diff)
    check_on_gpu(fn, case.torch_fn, args, case.diff, case.names)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_on_gpu(name, compiled):
    """The forward kernel alone (runs before the backward kernel is accepted): outputs."""
    case = CASES[name]
    if case.kernels[0] not in K.accepted():
        pytest.skip(f"{case.kernels[0]} not accepted yet")
    torch._dynamo.reset()
    fn = torch.compile(case.op, fullgraph=True) if compiled else case.op
    args = case.make("cuda", torch.bfloat16, M=333, K=264, N=656)  # N = 2I: I too keeps 16-byte rows
    check_on_gpu(fn, case.torch_fn, args, (), case.names[: len(case.names) - len(case.diff)])


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_rms_bwd_op_on_gpu(compiled):
    """The rms_bwd kernel op alone: dh and dgamma against the spec's reference in fp32, error
    budget from the same reference in bf16 (saved rstd and zdz derived as the spec does)."""
    if "rms_bwd" not in K.accepted():
        pytest.skip("rms_bwd not accepted yet")
    torch._dynamo.reset()
    ref = reference_module("rms_bwd")
    fn = torch.compile(K.rms_bwd_op, fullgraph=True) if compiled else K.rms_bwd_op

    def torch_fn(*a):
        out = ref.reference(**dict(zip(("dy", "w", "h", "gamma", "rstd", "zdz", "dresid"), a, strict=False)))
        return out["dh"], out["dgamma"]

    check_on_gpu(fn, torch_fn, rms_bwd_inputs("cuda", torch.bfloat16, M=333, D=264, N=656), (), ("dh", "dgamma"))


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
@pytest.mark.parametrize("name", ["residual_rmsnorm", "rmsnorm_linear"])
def test_eps_on_gpu(name, compiled):
    """eps = 1e-5 (Llama-3) through the real kernels, on rows whose mean square makes it
    matter: outputs and gradients against the standard definition with that eps."""
    case = CASES[name]
    if case.kernels[0] not in K.accepted():
        pytest.skip(f"{case.kernels[0]} not accepted yet")
    torch._dynamo.reset()
    op = partial(case.op, eps=1e-5)
    fn = torch.compile(op, fullgraph=True) if compiled else op
    check_on_gpu(
        fn,
        partial(case.torch_fn, eps=1e-5),
        small_rows(name, "cuda", torch.bfloat16, M=333, K=264, N=656),
        case.diff,
        case.names,
    )

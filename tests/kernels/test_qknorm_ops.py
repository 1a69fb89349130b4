"""coda_agent.kernels QK-norm family: deferred_rmsnorm_qknorm_rope (Qwen3's QKV projection,
per-head RMSNorm of q and k, RoPE) and gemm_qknorm_rope_bwd_op.

On the CPU the specs' PyTorch functions stand in for the kernels (``reference`` in float64,
``baseline`` in float32; the forward's qkv_pre pair-split as the spec stores it, which the
op interleaves for its backward); the plain torch implementation the op is checked against
normalizes each head as Qwen3RMSNorm does and rotates by complex multiplication
(``test_rope_ops.torch_rope``), independent of the glue's pair arithmetic. On an H200 the
real kernels run (``gpu``; skipped until the kernels are accepted).
"""

from __future__ import annotations

import pytest
import torch
from glue_helpers import check_against_torch, check_on_gpu, reference_module, use_standins
from test_rope_ops import torch_rope

import coda_agent.kernels as K
from coda_agent.kernels import _qknorm
from coda_agent.kernels._hf_layout import rope_row_permutation

HQ, HKV, HD = 2, 1, 128  # the kernels' head width; CPU: 2 query heads, 1 key/value head
CONSTS = {"n_q_heads": HQ, "n_kv_heads": HKV, "head_dim": HD}
GPU_CONSTS = {"n_q_heads": 8, "n_kv_heads": 2, "head_dim": HD}
EPS = 1e-6


def _sd(t):
    return torch.promote_types(t.dtype, torch.float32)


def qwen3_inv_freq(head_dim, device="cpu"):
    return (1.0 / 1000000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float().to(device)


def torch_qknorm_rope(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, *, n_q_heads, n_kv_heads, head_dim):
    """Deferred input norm, projection, Qwen3RMSNorm per query / key head (weights in the
    interleaved order), complex-multiplication RoPE; value heads unchanged."""
    sd = _sd(a)
    p = (a.to(sd) * rstd.to(sd)[:, None]).to(a.dtype) @ w_qkv.T
    m, nqk = p.shape[0], (n_q_heads + n_kv_heads) * head_dim
    heads = p[:, :nqk].reshape(m, n_q_heads + n_kv_heads, head_dim).to(sd)
    normed = (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + EPS)).to(p.dtype)
    w = torch.cat((q_norm_w.expand(n_q_heads, head_dim), k_norm_w.expand(n_kv_heads, head_dim))).to(p.dtype)
    z = torch.cat(((normed * w).reshape(m, nqk), p[:, nqk:]), dim=1)
    return torch_rope(z, positions, inv_freq, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)


def inputs(device, dtype, consts=CONSTS, M=10, K=16, S=40960, seed=0):
    """a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w (norm weights around 1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = (consts["n_q_heads"] + 2 * consts["n_kv_heads"]) * consts["head_dim"]
    a = torch.randn(M, K, generator=g, device=device).to(dtype)
    rstd = (torch.rand(M, generator=g, device=device) * 1.5 + 0.5).to(_sd(a))
    w = (torch.randn(n, K, generator=g, device=device) / K**0.5).to(dtype)
    pos = torch.randint(0, S, (M,), generator=g, device=device)
    qw, kw = ((torch.rand(consts["head_dim"], generator=g, device=device) + 0.5).to(dtype) for _ in range(2))
    return [a, rstd, w, pos, qwen3_inv_freq(consts["head_dim"], device), qw, kw]


def standins(kind: str) -> dict:
    """The forward spec's ``reference`` (float64-exact) or ``baseline`` as kernel entries; the
    backward spec's ``baseline`` (its formula in fp32) for both: its ``reference`` takes
    the gradient with torch.autograd, which does not record inside a custom op."""
    fwd = getattr(reference_module("gemm_qknorm_rope"), kind)
    bwd = reference_module("gemm_qknorm_rope_bwd").baseline

    def gemm_qknorm_rope(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, *, HQ, HKV, eps):
        r = fwd(
            y=None, gamma=None, a=a, rstd=rstd, w_qkv=w_qkv, positions=positions, inv_freq=inv_freq,
            q_norm_w=q_norm_w, k_norm_w=k_norm_w, HQ=HQ, HKV=HKV, eps=eps,
        )  # fmt: skip
        return r["qkv"], r["qkv_pre"], r["rstd_heads"]

    def gemm_qknorm_rope_bwd(g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, corr, *, HQ, HKV):
        r = bwd(
            g=g, w=w, qkv_pre=qkv_pre, rstd_heads=rstd_heads, positions=positions, inv_freq=inv_freq,
            q_norm_w=q_norm_w, k_norm_w=k_norm_w, corr=corr, HQ=HQ, HKV=HKV,
        )  # fmt: skip
        return r["dqkv_pre"], r["dq_norm_w"], r["dk_norm_w"]

    return {"gemm_qknorm_rope": gemm_qknorm_rope, "gemm_qknorm_rope_bwd": gemm_qknorm_rope_bwd}


def rms_standin(kind: str) -> dict:
    """gemm_rmsnorm (the fallback path's projection) from its spec."""
    rms = getattr(reference_module("gemm_rmsnorm"), kind)
    return {"gemm_rmsnorm": lambda a, rstd, w: (rms(a=a, rstd=rstd, w=w)["out"],)}


def op(fused):
    def run(a, rstd, w, pos, f, qw, kw):
        return K.deferred_rmsnorm_qknorm_rope(a, rstd, w, pos, f, qw, kw, **CONSTS, eps=EPS, fused=fused)

    return run


NAMES = ("qkv", "da", "drstd", "dw_qkv", "dq_norm_w", "dk_norm_w")
DIFF = (0, 1, 2, 5, 6)


# --------------------------------------------------------------------------- CPU tests


def test_interleave_head_weight_is_the_row_permutation_cpu():
    w = torch.arange(8.0, requires_grad=True)
    got = _qknorm.interleave_head_weight(w)
    assert torch.equal(got, w.detach()[rope_row_permutation(8)])
    got.backward(torch.arange(8.0))  # the gradient goes back to HF's order
    assert torch.equal(w.grad, torch.argsort(rope_row_permutation(8)).float())


@pytest.mark.parametrize("fused", [True, False])
def test_matches_torch_float64_cpu(fused, monkeypatch):
    """Both paths, exact stand-ins in float64: output and the gradients of a, rstd, w_qkv and
    both norm weights equal autograd through the plain torch implementation."""
    calls = use_standins(monkeypatch, {**standins("reference"), **rms_standin("reference")})
    check_against_torch(
        op(fused),
        lambda *x: torch_qknorm_rope(*x, **CONSTS),
        inputs("cpu", torch.float64),
        DIFF,
        rtol=1e-6,
        names=NAMES,
    )
    assert calls["gemm_qknorm_rope"] == (1 if fused else 0)
    assert calls["gemm_rmsnorm"] == (0 if fused else 1)
    assert calls["gemm_qknorm_rope_bwd"] == 0  # dqkv arrives materialized: the torch backward


@pytest.mark.parametrize("fused", [True, False])
def test_bf16_with_layout_checks_cpu(fused, monkeypatch):
    """bf16 inputs, the baseline stand-ins, dtype and layout checks on: both paths within
    bf16 rounding of the float64 torch implementation, and of each other."""
    use_standins(monkeypatch, {**standins("baseline"), **rms_standin("baseline")}, check_layout=True)
    check_against_torch(
        op(fused),
        lambda *x: torch_qknorm_rope(*x, **CONSTS),
        inputs("cpu", torch.bfloat16),
        DIFF,
        rtol=2e-2,
        names=NAMES,
    )


def test_bwd_op_is_the_vjp_float64_cpu(monkeypatch):
    """gemm_qknorm_rope_bwd_op (the spec's baseline standing in) and the glue's torch backward both give
    the VJP of the per-head norm + RoPE at the upstream g @ w^T, with the correction
    (1/HD) sum dqkv * qkv computed as a producing kernel would emit it."""
    use_standins(monkeypatch, standins("reference"))
    g0 = torch.Generator().manual_seed(3)
    a, rstd, w_qkv, pos, f, qw, kw = inputs("cpu", torch.float64)
    m, n = a.shape[0], w_qkv.shape[0]
    p = torch.randn(m, n, generator=g0, dtype=torch.float64)
    g = torch.randn(m, 24, generator=g0, dtype=torch.float64)
    w = torch.randn(n, 24, generator=g0, dtype=torch.float64) / 24**0.5
    dqkv = g @ w.T
    rstd_heads = torch.rsqrt(p.unflatten(1, (-1, HD)).pow(2).mean(-1) + EPS)
    with torch.enable_grad():
        leaves = [t.clone().requires_grad_() for t in (p, qw, kw)]
        qkv = _qknorm.qknorm_rope_torch(*leaves[:1], pos, f, *leaves[1:], n_q_heads=HQ, n_kv_heads=HKV, eps=EPS)
        want = torch.autograd.grad(qkv, leaves, dqkv)
    corr = (dqkv * qkv.detach()).unflatten(1, (-1, HD)).mean(-1)
    got = K.gemm_qknorm_rope_bwd_op(g, w, p, rstd_heads, pos, f, qw, kw, corr, **CONSTS)
    glue = _qknorm.qknorm_rope_grads(dqkv, p, rstd_heads, pos, f, qw, kw, HQ, HKV)
    for name, x, y, z in zip(("dqkv_pre", "dq_norm_w", "dk_norm_w"), got, glue, want, strict=True):
        # the kernel's stand-in computes in fp32 (the spec's baseline), the glue in float64
        torch.testing.assert_close(x.double(), z, rtol=1e-5, atol=1e-5, msg=lambda s, name=name: f"{name}: {s}")
        torch.testing.assert_close(y.double(), z, rtol=1e-9, atol=1e-9, msg=lambda s, name=name: f"glue {name}: {s}")
    assert want[0][:, (HQ + HKV) * HD :].equal(dqkv[:, (HQ + HKV) * HD :])  # value heads pass through


def test_interleave_pairs_inverts_the_pair_split_cpu():
    p = torch.arange(24.0).reshape(2, 12)
    split = torch.cat((p[:, 0::2], p[:, 1::2]), dim=1)
    assert torch.equal(_qknorm.interleave_pairs(split), p)
    assert _qknorm.interleave_pairs(split).is_contiguous()


def test_backward_from_the_pair_split_forward_float64_cpu(monkeypatch):
    """The forward kernel (the spec's reference standing in) returns qkv_pre pair-split; the
    op's backward interleaves it and equals autograd through the standard computation. Fed
    the split layout as it is, the backward would be wrong: the check is not vacuous."""
    use_standins(monkeypatch, standins("reference"))
    args = inputs("cpu", torch.float64)
    a, rstd, w_qkv = args[:3]
    _, qkv_pre, _ = K.gemm_qknorm_rope_op(*args, **CONSTS, eps=EPS)
    p = (a * rstd[:, None]) @ w_qkv.T
    n = w_qkv.shape[0]
    assert torch.equal(qkv_pre[:, : n // 2], p[:, 0::2]) and torch.equal(qkv_pre[:, n // 2 :], p[:, 1::2])

    def grads():
        xs = [t.detach().clone().requires_grad_() if i in DIFF else t for i, t in enumerate(args)]
        out = op(True)(*xs)
        up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        return torch.autograd.grad(out, [xs[i] for i in DIFF], up), out, up

    got, out, up = grads()
    xs = [t.detach().clone().requires_grad_() if i in DIFF else t for i, t in enumerate(args)]
    want_out = torch_qknorm_rope(*xs, **CONSTS)
    want = torch.autograd.grad(want_out, [xs[i] for i in DIFF], up)
    # test_matches_torch_float64_cpu's tolerance: the saved rstd_heads is float32 (the spec's dtype)
    torch.testing.assert_close(out, want_out.detach(), rtol=1e-6, atol=1e-6)
    for name, x, y in zip(NAMES[1:], got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6, msg=lambda s, name=name: f"{name}: {s}")
    monkeypatch.setattr(_qknorm, "interleave_pairs", lambda split: split)
    wrong, _, _ = grads()
    assert not torch.allclose(wrong[0], want[0], rtol=1e-3, atol=1e-3)  # da


def test_kernel_ready_and_refusals_cpu(monkeypatch):
    monkeypatch.setattr(K, "accepted", lambda: ["gemm_qknorm_rope"])
    assert K.qknorm_kernel_ready(128, 1e-6)
    assert not K.qknorm_kernel_ready(64, 1e-6) and not K.qknorm_kernel_ready(128, 1e-5)
    monkeypatch.setattr(K, "accepted", lambda: [])
    assert not K.qknorm_kernel_ready(128, 1e-6)
    use_standins(monkeypatch, standins("reference"))
    args = inputs("cpu", torch.float64)
    with pytest.raises(ValueError, match=r"verified for head_dim = 128 and eps = 1e-06, got 128 and 1e-05"):
        K.deferred_rmsnorm_qknorm_rope(*args, **CONSTS, eps=1e-5, fused=True)
    with pytest.raises(ValueError, match=r"q_norm_w must be \(head_dim,\) = \(128,\), got \(64,\)"):
        K.deferred_rmsnorm_qknorm_rope(*args[:5], args[5][:64], args[6], **CONSTS, fused=True)


def test_off_cuda_raises_naming_the_op_cpu():
    args = inputs("cpu", torch.bfloat16)
    with pytest.raises(
        ValueError, match="deferred_rmsnorm_qknorm_rope: the fused kernels need all tensors on one CUDA"
    ):
        K.deferred_rmsnorm_qknorm_rope(*args, **CONSTS, fused=False)


# --------------------------------------------------------------------------- GPU


def _need(*names):
    missing = set(names) - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_on_gpu(fused):
    """The real kernels (bf16, M = 1000, K = 1024, 8 / 2 heads of 128) against the fp32 torch
    implementation: output and every gradient within twice the bf16 torch code's error."""
    _need("gemm_qknorm_rope" if fused else "gemm_rmsnorm")

    def run(a, rstd, w, pos, f, qw, kw):
        return K.deferred_rmsnorm_qknorm_rope(a, rstd, w, pos, f, qw, kw, **GPU_CONSTS, fused=fused)

    args = inputs("cuda", torch.bfloat16, GPU_CONSTS, M=1000, K=1024)
    check_on_gpu(run, lambda *x: torch_qknorm_rope(*x, **GPU_CONSTS), args, DIFF, NAMES)


@pytest.mark.gpu
def test_bwd_op_on_gpu():
    """gemm_qknorm_rope_bwd_op against the fp32 VJP (torch) from the same bf16 inputs."""
    _need("gemm_qknorm_rope_bwd")
    a, rstd, w_qkv, pos, f, qw, kw = inputs("cuda", torch.bfloat16, GPU_CONSTS, M=1000, K=1024)
    gen = torch.Generator(device="cuda").manual_seed(5)
    m, n = a.shape[0], w_qkv.shape[0]
    p = torch.randn(m, n, generator=gen, device="cuda").to(torch.bfloat16)
    g = torch.randn(m, 512, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, 512, generator=gen, device="cuda") / 512**0.5).to(torch.bfloat16)
    rstd_heads = torch.rsqrt(p.float().unflatten(1, (-1, HD)).pow(2).mean(-1) + EPS)
    consts = dict(n_q_heads=GPU_CONSTS["n_q_heads"], n_kv_heads=GPU_CONSTS["n_kv_heads"])

    def vjp(dtype):
        dqkv = (g.to(dtype) @ w.to(dtype).T).to(dtype)
        with torch.enable_grad():
            leaves = [t.to(dtype).requires_grad_() for t in (p, qw, kw)]
            qkv = _qknorm.qknorm_rope_torch(leaves[0], pos, f, *leaves[1:], **consts, eps=EPS)
            grads = torch.autograd.grad(qkv, leaves, dqkv)
        return grads, (dqkv.float() * qkv.detach().float()).unflatten(1, (-1, HD)).mean(-1)

    ref, corr = vjp(torch.float32)
    low, _ = vjp(torch.bfloat16)
    got = K.gemm_qknorm_rope_bwd_op(g, w, p, rstd_heads, pos, f, qw, kw, corr, **GPU_CONSTS)
    for name, x, r, b in zip(("dqkv_pre", "dq_norm_w", "dk_norm_w"), got, ref, low, strict=True):
        err = (x.float() - r.float()).abs().max().item()
        budget = 2 * (b.float() - r.float()).abs().max().item() + 1e-6
        assert err <= budget, f"{name}: max err {err:.3e} > allowed {budget:.3e}"

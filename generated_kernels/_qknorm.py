"""QK-norm QKV projection family (Qwen3, OLMo-2 style per-head RMSNorm of q and k before RoPE).

Public ops: ``deferred_rmsnorm_qknorm_rope`` (autograd), ``gemm_qknorm_rope_bwd_op`` (the
gemm_qknorm_rope_bwd kernel as a plain custom op); kernel wrapper ``gemm_qknorm_rope_op``;
``qknorm_kernel_ready`` (whether the forward kernel serves a model's head_dim and eps);
``interleave_pairs`` (the forward kernel's saved qkv_pre -> the backward's layout).
See the package docstring for the math. ``load`` / ``accepted`` / ``_check_device`` /
``_check_layout`` are looked up through the package at call time.

Layout: every query / key head is in the kernels' interleaved RoPE order (pairs (2j, 2j+1)),
and so are the per-head norm weights: ``q_norm_w[i]`` weighs column i of every query head.
A Hugging Face model's weights in ``rotate_half`` order become that order with
:func:`interleave_head_weight` (the row permutation ``pack_qkv`` applies to q and k).

qkv_pre, the projection p the backward needs, has two layouts: the forward kernel stores it
pair-split (columns [0, N/2) hold p[:, 0::2], [N/2, N) hold p[:, 1::2]; in quack's
acc_pair mode only D is stored full width, every other output one value per pair), the
backward (the gemm_qknorm_rope_bwd kernel and :func:`qknorm_rope_grads`) reads p itself,
interleaved. :func:`interleave_pairs` maps the first to the second.
"""

from __future__ import annotations

import torch

from ._registry import _expect, _pkg, _stat_dtype, run_kernel
from ._rmsnorm import deferred_linear_grads
from ._rope import _check_rope, _consts, rope_rotate

FWD_KERNEL = "gemm_qknorm_rope"
BWD_KERNEL = "gemm_qknorm_rope_bwd"
KERNEL_HEAD_DIM = 128
"""The head width the QK-norm kernels are verified for (the specs' fixed HD)."""
KERNEL_EPS = 1e-6
"""The per-head RMSNorm epsilon the forward kernel is verified with (the spec's float
constant; a kernel may compile it in, so another eps takes the torch path)."""


def qknorm_kernel_ready(head_dim: int, eps: float) -> bool:
    """True when the gemm_qknorm_rope kernel is accepted and verified for ``head_dim`` and
    ``eps`` (:data:`KERNEL_HEAD_DIM`, :data:`KERNEL_EPS`). Reads the kernel folder: call it
    once (``apply_coda`` does, at patch time), not inside a compiled region."""
    return head_dim == KERNEL_HEAD_DIM and float(eps) == KERNEL_EPS and FWD_KERNEL in _pkg.accepted()


def interleave_head_weight(w: torch.Tensor) -> torch.Tensor:
    """A per-head weight (HD,) in Hugging Face's ``rotate_half`` order -> the kernels'
    interleaved order: element 2j is ``w[j]``, 2j+1 is ``w[j + HD/2]`` (``rope_row_permutation``).
    Differentiable (a reshape of a transposed view; its gradient is the inverse gather)."""
    hd = w.shape[0]
    return w.view(2, hd // 2).t().reshape(hd)


def interleave_pairs(split: torch.Tensor) -> torch.Tensor:
    """The gemm_qknorm_rope kernel's pair-split qkv_pre (M, N) -> p (M, N) interleaved, in
    split's dtype: column 2j is ``split[:, j]``, column 2j+1 is ``split[:, N/2 + j]`` (N the
    whole projection width, even). A copy (contiguous); differentiable."""
    return torch.stack(split.chunk(2, -1), -1).flatten(-2)


def _check_head_weights(op: str, q_norm_w, k_norm_w, head_dim: int) -> None:
    for name, t in (("q_norm_w", q_norm_w), ("k_norm_w", k_norm_w)):
        _expect(
            tuple(t.shape) == (head_dim,),
            op,
            lambda name=name, t=t: f"{name} must be (head_dim,) = ({head_dim},), got {tuple(t.shape)}",
        )
    _pkg._check_layout(op, q_norm_w=(q_norm_w, torch.bfloat16), k_norm_w=(k_norm_w, torch.bfloat16))
    _pkg._check_device(op, q_norm_w=q_norm_w, k_norm_w=k_norm_w)


# --------------------------------------------------------------------------- torch pieces


def qknorm_rope_torch(qkv_pre, positions, inv_freq, q_norm_w, k_norm_w, *, n_q_heads: int, n_kv_heads: int, eps):
    """The per-head RMSNorm + RoPE in PyTorch (autograd): qkv_pre (M, (HQ + 2 HKV) HD), each
    query head Qwen3RMSNorm'ed (statistics in fp32 or wider, rounded to qkv_pre's dtype,
    times q_norm_w), each key head with k_norm_w, both rotated by :func:`rope_rotate`
    (interleaved pairs), the value heads unchanged. Returns qkv in qkv_pre's dtype."""
    hd = 2 * inv_freq.shape[0]
    m, nqk = qkv_pre.shape[0], (n_q_heads + n_kv_heads) * hd
    heads = qkv_pre[:, :nqk].unflatten(1, (n_q_heads + n_kv_heads, hd))
    hf = heads.to(_stat_dtype(qkv_pre))
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(qkv_pre.dtype)
    weight = torch.cat((q_norm_w.expand(n_q_heads, hd), k_norm_w.expand(n_kv_heads, hd))).to(qkv_pre.dtype)
    z = torch.cat(((normed * weight).reshape(m, nqk), qkv_pre[:, nqk:]), dim=1)
    return rope_rotate(z, positions, inv_freq, nqk)


def qknorm_rope_grads(dqkv, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, n_q_heads, n_kv_heads):
    """The backward of the per-head RMSNorm + RoPE from a materialized gradient ``dqkv``
    (M, N): (dqkv_pre in qkv_pre's dtype, dq_norm_w, dk_norm_w in the weights' dtype).
    ``qkv_pre`` is p (M, N) interleaved (:func:`interleave_pairs` of the forward kernel's
    pair-split one), rstd_heads (M, HQ + 2 HKV) its per-head rstd.

    Per query/key head (r its saved rstd, n = p * r, v the norm weight): dz = R^T dqkv,
    dp = r * (v * dz - n * mean(v * dz * n)), dv = sum over rows and heads of dz * n; value
    heads pass dqkv through. fp32 (or wider) math from float64 angles, one rounding: the
    gemm_qknorm_rope_bwd spec's formula with the correction computed here."""
    hd = 2 * inv_freq.shape[0]
    nh = n_q_heads + n_kv_heads
    nqk = nh * hd
    sd = _stat_dtype(qkv_pre)
    dz = rope_rotate(dqkv[:, :nqk].to(sd), positions, inv_freq, nqk, inverse=True).unflatten(1, (nh, hd))
    r = rstd_heads[:, :nh, None].to(sd)
    n = qkv_pre[:, :nqk].to(sd).unflatten(1, (nh, hd)) * r
    v = torch.cat((q_norm_w.to(sd).expand(n_q_heads, hd), k_norm_w.to(sd).expand(n_kv_heads, hd)))
    vdz = v * dz
    dp = r * (vdz - n * (vdz * n).mean(-1, keepdim=True))
    dv = (dz * n).sum(0)  # (heads, HD)
    dqkv_pre = torch.cat((dp.flatten(1).to(qkv_pre.dtype), dqkv[:, nqk:].to(qkv_pre.dtype)), dim=1)
    return dqkv_pre, dv[:n_q_heads].sum(0).to(q_norm_w.dtype), dv[n_q_heads:].sum(0).to(k_norm_w.dtype)


# --------------------------------------------------------------------------- kernel ops


@torch.library.custom_op("coda_agent::gemm_qknorm_rope", mutates_args=())
def gemm_qknorm_rope_op(
    a: torch.Tensor,
    rstd: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_norm_w: torch.Tensor,
    k_norm_w: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused QKV GEMM + deferred rstd + per-head RMSNorm + RoPE. a (M, K) bf16, rstd (M,)
    fp32, w_qkv ((HQ+2HKV)*HD, K) bf16, positions (M,) int64, inv_freq (HD/2,) fp32,
    q_norm_w / k_norm_w (HD,) bf16 (interleaved order) -> qkv, qkv_pre (M, (HQ+2HKV)*HD)
    bf16, rstd_heads (M, HQ+2HKV) fp32. qkv_pre is the spec's pair-split p (even columns,
    then odd ones): :func:`interleave_pairs` of it is what :func:`gemm_qknorm_rope_bwd_op`
    and :func:`qknorm_rope_grads` take."""
    qkv, qkv_pre, rstd_heads = run_kernel(
        FWD_KERNEL,
        a,
        rstd,
        w_qkv,
        positions,
        inv_freq,
        q_norm_w,
        k_norm_w,
        eps=eps,
        **_consts(n_q_heads, n_kv_heads, head_dim),
    )
    return qkv, qkv_pre, rstd_heads


@gemm_qknorm_rope_op.register_fake
def _(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, *, n_q_heads, n_kv_heads, head_dim, eps):
    m, n = a.shape[0], w_qkv.shape[0]  # qkv_pre pair-split: (M, N) as p
    return a.new_empty((m, n)), a.new_empty((m, n)), rstd.new_empty((m, n // head_dim))


@torch.library.custom_op("coda_agent::gemm_qknorm_rope_bwd", mutates_args=())
def gemm_qknorm_rope_bwd_op(
    g: torch.Tensor,
    w: torch.Tensor,
    qkv_pre: torch.Tensor,
    rstd_heads: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_norm_w: torch.Tensor,
    k_norm_w: torch.Tensor,
    corr: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm + RoPE backward fused into the GEMM producing the gradient, no autograd.

    ``dqkv = g @ w^T`` is the gradient of gemm_qknorm_rope's qkv; the kernel applies R^T and
    the per-head RMSNorm backward in its epilogue (:func:`qknorm_rope_grads`'s formula with
    the correction ``corr`` given). Use it where the GEMM that produces that gradient is
    your own (an attention backward, which emits ``corr`` for free: (1/HD) sum over each
    head of dqkv * qkv).

    Args:
        g: (M, K) bf16, the producing GEMM's A operand, contiguous.
        w: ((n_q_heads + 2 * n_kv_heads) * head_dim, K) bf16, its B operand (nn.Linear layout).
        qkv_pre: (M, N) bf16, the forward's p interleaved (:func:`interleave_pairs` of
            gemm_qknorm_rope's pair-split qkv_pre), and rstd_heads:
            (M, n_q_heads + 2 * n_kv_heads) fp32, saved by gemm_qknorm_rope's forward.
        positions: (M,) int64; inv_freq: (head_dim / 2,) fp32 (the forward's).
        q_norm_w, k_norm_w: (head_dim,) bf16 in the interleaved order.
        corr: (M, n_q_heads + 2 * n_kv_heads) fp32 per-(row, head) correction.
        n_q_heads, n_kv_heads, head_dim: keyword-only ints (head_dim 128).
    Returns:
        (dqkv_pre (M, N) bf16, dq_norm_w (head_dim,) fp32, dk_norm_w (head_dim,) fp32).
    Raises:
        ValueError: inconsistent shapes or head counts, a wrong dtype, a non-contiguous
            tensor, rows not a multiple of 16 bytes, or tensors not on one CUDA device.
        ModuleNotFoundError: when gemm_qknorm_rope_bwd is not accepted yet.
    A ``torch.library`` custom op (``coda_agent::gemm_qknorm_rope_bwd``).
    """
    op = "gemm_qknorm_rope_bwd_op"
    _check_rope(op, g, w, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, names=("g", "w"))
    _check_head_weights(op, q_norm_w, k_norm_w, head_dim)
    heads = n_q_heads + 2 * n_kv_heads
    for name, t, shape in (
        ("qkv_pre", qkv_pre, (g.shape[0], w.shape[0])),
        ("rstd_heads", rstd_heads, (g.shape[0], heads)),
        ("corr", corr, (g.shape[0], heads)),
    ):
        _expect(
            tuple(t.shape) == shape,
            op,
            lambda name=name, t=t, shape=shape: f"{name} must be {shape}, got {tuple(t.shape)}",
        )
    _pkg._check_layout(op, qkv_pre=(qkv_pre, torch.bfloat16))
    _pkg._check_device(op, g=g, qkv_pre=qkv_pre, rstd_heads=rstd_heads, corr=corr)
    dqkv_pre, dqw, dkw = run_kernel(
        BWD_KERNEL,
        g,
        w,
        qkv_pre,
        rstd_heads.contiguous(),
        positions,
        inv_freq,
        q_norm_w,
        k_norm_w,
        corr.contiguous(),
        **_consts(n_q_heads, n_kv_heads, head_dim),
    )
    return dqkv_pre, dqw, dkw


@gemm_qknorm_rope_bwd_op.register_fake
def _(g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, corr, *, n_q_heads, n_kv_heads, head_dim):
    f32 = torch.float32
    return (
        g.new_empty((g.shape[0], w.shape[0])),
        g.new_empty((head_dim,), dtype=f32),
        g.new_empty((head_dim,), dtype=f32),
    )


# --------------------------------------------------------------------------- deferred_rmsnorm_qknorm_rope


@torch.library.custom_op("coda_agent::deferred_rmsnorm_qknorm_rope", mutates_args=())
def _deferred_qknorm_rope(
    a: torch.Tensor,
    rstd: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_norm_w: torch.Tensor,
    k_norm_w: torch.Tensor,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv, qkv_pre, rstd_heads = run_kernel(
        FWD_KERNEL, a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w,
        eps=eps, **_consts(n_q_heads, n_kv_heads, head_dim),
    )  # fmt: skip
    return qkv, qkv_pre, rstd_heads


@_deferred_qknorm_rope.register_fake
def _(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, n_q_heads, n_kv_heads, head_dim, eps):
    m, n = a.shape[0], w_qkv.shape[0]  # qkv_pre pair-split: (M, N) as p
    return a.new_empty((m, n)), a.new_empty((m, n)), rstd.new_empty((m, n // head_dim))


def _deferred_qknorm_rope_setup(ctx, inputs, output):
    a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, n_q_heads, n_kv_heads, head_dim, eps = inputs
    _, qkv_pre, rstd_heads = output
    ctx.heads = (n_q_heads, n_kv_heads)
    ctx.save_for_backward(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, qkv_pre, rstd_heads)


def _deferred_qknorm_rope_backward(ctx, dqkv, _dqkv_pre, _drstd_heads):
    # qkv_pre and rstd_heads are saved for this backward, not outputs of the public op: their
    # gradients are zeros and ignored. qkv_pre is saved as the kernel stores it (pair-split)
    # and interleaved here, so a forward without a backward (inference) never pays the copy.
    a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, split, rstd_heads = ctx.saved_tensors
    qkv_pre = interleave_pairs(split)
    dpre, dqw, dkw = qknorm_rope_grads(dqkv, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, *ctx.heads)
    da, drstd, dw = deferred_linear_grads(dpre, a, rstd, w_qkv, ctx.needs_input_grad)
    need_qw, need_kw = ctx.needs_input_grad[5:7]
    return da, drstd, dw, None, None, dqw if need_qw else None, dkw if need_kw else None, None, None, None, None


_deferred_qknorm_rope.register_autograd(_deferred_qknorm_rope_backward, setup_context=_deferred_qknorm_rope_setup)


def deferred_rmsnorm_qknorm_rope(
    a: torch.Tensor,
    rstd: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_norm_w: torch.Tensor,
    k_norm_w: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float = KERNEL_EPS,
    fused: bool | None = None,
) -> torch.Tensor:
    """QKV projection of a QK-norm model on a deferred RMSNorm:
    ``RoPE(HeadRMSNorm((a * rstd[:, None]) @ w_qkv^T))``.

    Columns as in :func:`qkv_rope` (HQ query, HKV key, HKV value heads of ``head_dim``).
    Each query head is RMS-normalized over its columns (``rsqrt(mean(p^2) + eps)``, fp32)
    and weighted by ``q_norm_w``, each key head likewise with ``k_norm_w`` (Qwen3's
    q_norm / k_norm), then both are rotated (interleaved pairs); value heads pass through.

    Args:
        a: (M, K) bf16 (``normed_w`` of residual_rmsnorm, or x * gamma), contiguous.
        rstd: (M,) fp32 row scale of the deferred input norm.
        w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim: as in :func:`qkv_rope`.
        q_norm_w, k_norm_w: (head_dim,) bf16 per-head norm weights in the interleaved order
            (:func:`interleave_head_weight` of a Hugging Face weight).
        eps: the per-head norm's epsilon.
        fused: True: the gemm_qknorm_rope kernel (ModuleNotFoundError when it is not
            accepted); False: the ``gemm_rmsnorm`` kernel for the projection, the per-head
            norm and the rotation in PyTorch (:func:`qknorm_rope_torch`); None:
            :func:`qknorm_kernel_ready` decides (a file lookup per call: pass a bool under
            ``torch.compile``).
    Returns:
        qkv (M, (n_q_heads + 2 * n_kv_heads) * head_dim) bf16.
    Raises:
        ValueError: inconsistent shapes / head counts, a wrong dtype (bf16; positions int64;
            inv_freq and rstd fp32), a non-contiguous tensor, rows not a multiple of 16
            bytes, tensors not on one CUDA device, or ``fused=True`` with a head_dim or eps
            the kernel is not verified for.
    Backward (fused path): plain torch from the saved qkv_pre (the kernel's pair-split
    layout, interleaved by :func:`interleave_pairs`) and per-head rstd
    (:func:`qknorm_rope_grads`: R^T, the per-head norm backward, the norm weights'
    gradients), then ``da``, ``drstd``, ``dw`` as :func:`deferred_rmsnorm_linear`'s. The
    gemm_qknorm_rope_bwd kernel fuses into the GEMM that *produces* dqkv (an attention
    backward): here dqkv arrives materialized, so it is :func:`gemm_qknorm_rope_bwd_op`,
    for callers that own that GEMM. Works under ``torch.compile``.
    """
    op = "deferred_rmsnorm_qknorm_rope"
    _check_rope(op, a, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, rstd=rstd, names=("a", "w_qkv"))
    _check_head_weights(op, q_norm_w, k_norm_w, head_dim)
    if fused is None:
        fused = qknorm_kernel_ready(head_dim, eps)
    if not fused:
        p = _pkg.deferred_rmsnorm_linear(a, rstd, w_qkv)
        return qknorm_rope_torch(
            p, positions, inv_freq, q_norm_w, k_norm_w, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, eps=eps
        )
    _expect(
        head_dim == KERNEL_HEAD_DIM and float(eps) == KERNEL_EPS,
        op,
        lambda: (
            f"fused=True: the gemm_qknorm_rope kernel is verified for head_dim = {KERNEL_HEAD_DIM} and "
            f"eps = {KERNEL_EPS}, got {head_dim} and {eps}; pass fused=False"
        ),
    )
    qkv, _, _ = _deferred_qknorm_rope(
        a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, n_q_heads, n_kv_heads, head_dim, float(eps)
    )
    return qkv

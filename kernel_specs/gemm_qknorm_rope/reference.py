"""QKV projection of a QK-norm model (Qwen3, OLMo-2, Gemma-3): deferred input RMSNorm,
projection, per-head RMSNorm of every query and key head, RoPE; from the standard
definition, in Hugging Face Qwen3's order.

Standard order (transformers' Qwen3DecoderLayer / Qwen3Attention): h =
input_layernorm(y) = RMSNorm(y) * gamma (normalized in fp32, rounded to the activation
dtype, times the weight); qkv_pre = h @ W_qkv^T; each query head is q_norm(q) (Qwen3RMSNorm
over its HD = 128 columns: fp32 rsqrt(mean(q^2) + eps), rounded, times q_norm_w), each key
head k_norm(k) likewise with k_norm_w; then RoPE; the value heads pass through.

The RoPE pairs are Meta's interleaved (2j, 2j+1), the pairs quack's acc_pair mode hands an
epilogue. Hugging Face rotates (j, j + HD/2) (rotate_half); permuting each query and key
head's rows of W_qkv by [0, HD/2, 1, HD/2 + 1, ...] (coda_agent.kernels.hf's
rope_row_permutation), and q_norm_w, k_norm_w by the same permutation, makes this op equal
to HF's up to that permutation of each head's columns, which attention scores q . k do not
see (the per-head norm is invariant under it). The rotation runs in fp32 from float64
angles and is rounded once (Meta's apply_rotary_emb, as gemm_rmsnorm_rope's reference).

The input norm is deferred: the projection's input is h = RMSNorm(y) * gamma = a * rstd[:, None]
with a = y * gamma (rounded to bf16 by the GEMM that wrote it, gemm_residual_partial_rms)
and rstd = rsqrt(mean(y^2) + eps). The reference-only inputs y and gamma are the residual
stream and the norm weight; a and rstd are derived from them, so the row scale is that
row's own (an outlier or near-zero row of y has the rstd it implies). The reference
computes h from a and rstd as stored (in fp32, rounded to the activation dtype, as
nn.RMSNorm's output is): the rounding of a belongs to the kernel before this one, and
the kernel scales its fp32 accumulator by rstd instead (rstd * (a @ W^T) = h @ W^T).

qkv_pre, the projection saved for the backward, is stored pair-split (:func:`pair_split`):
the even columns of p, then the odd ones, over the whole projection width. In quack's
acc_pair mode D is the only full-width store and every other output is one value per
pair (half width), so a kernel writes p as two such outputs into the halves of one
buffer. The backward (gemm_qknorm_rope_bwd) reads p interleaved: coda_agent.kernels
interleave_pairs restores that order from the stored one.
"""

import torch
import torch.nn.functional as F

ROPE_THETA = 1000000.0
"""Qwen3's RoPE base (rope_theta of the released Qwen3 configs)."""


def _acc(t):
    return torch.promote_types(t.dtype, torch.float32)


def qwen3_inv_freq(*, dims, **_earlier):
    """inv_freq (HD/2,) float32: 1 / 1e6^(2j/HD) for rotation pair j (Qwen3's default RoPE).
    A ``derived`` input: from the shape binding alone."""
    hd = dims["HD"]
    return (1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float()


def deferred_a(*, y, gamma, **_earlier):
    """a = y * gamma (M, K) in y's dtype: the input norm's weight applied, its row scale
    deferred (gemm_residual_partial_rms's normed_w). A ``derived`` input."""
    return (y.to(_acc(y)) * gamma.to(_acc(y))).to(y.dtype)


def row_rstd(*, y, eps, **_earlier):
    """rstd (M,) float32: rsqrt(mean(y^2) + eps) over each row (the input norm's row scale).
    A ``derived`` input."""
    yf = y.to(_acc(y))
    return torch.rsqrt(yf.pow(2).mean(-1) + eps).float()


def rmsnorm(x, weight, eps):
    """Qwen3RMSNorm over the last dim: x normalized in fp32 (or wider), rounded to x's
    dtype, times weight (in x's dtype)."""
    xf = x.to(_acc(x))
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight.to(x.dtype) * normed


def rope(x, positions, inv_freq):
    """Interleaved RoPE of x (M, H, HD): pair (2j, 2j+1) of every head turned by
    positions[m] * inv_freq[j]; fp32 (or wider) rotation from float64 angles, rounded once
    to x's dtype."""
    acc = _acc(x)
    theta = positions.double()[:, None] * inv_freq.double()[None, :]  # (M, HD/2)
    cos, sin = theta.cos().to(acc)[:, None, :], theta.sin().to(acc)[:, None, :]
    pairs = x.to(acc).unflatten(-1, (-1, 2))
    u, v = pairs[..., 0], pairs[..., 1]
    return torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(-2).to(x.dtype)


def pair_split(p):
    """(M, N) -> (M, N): the even columns of p, then the odd ones (columns [0, N/2) hold
    p[:, 0::2], columns [N/2, N) hold p[:, 1::2]); qkv_pre's stored layout."""
    return torch.cat((p[:, 0::2], p[:, 1::2]), dim=1)


def head_rstd(qkv_pre, hd, eps):
    """(M, N/HD) float32: rsqrt(mean(head^2) + eps) of every HD-wide head of qkv_pre
    (interleaved: p itself, not its stored pair-split form)."""
    heads = qkv_pre.to(_acc(qkv_pre)).unflatten(1, (-1, hd))
    return torch.rsqrt(heads.pow(2).mean(-1) + eps).float()


def qknorm_rope(qkv_pre, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps):
    """(M, (HQ+2*HKV)*HD) in qkv_pre's dtype: per-head RMSNorm of the query heads (q_norm_w)
    and key heads (k_norm_w), RoPE of both, value heads unchanged. Differentiable (the
    backward spec takes its gradient)."""
    hd = 2 * inv_freq.shape[0]
    m = qkv_pre.shape[0]
    q = qkv_pre[:, : HQ * hd].reshape(m, HQ, hd)
    k = qkv_pre[:, HQ * hd : (HQ + HKV) * hd].reshape(m, HKV, hd)
    q = rope(rmsnorm(q, q_norm_w, eps), positions, inv_freq)
    k = rope(rmsnorm(k, k_norm_w, eps), positions, inv_freq)
    return torch.cat((q.flatten(1), k.flatten(1), qkv_pre[:, (HQ + HKV) * hd :]), dim=1)


def reference(*, y, gamma, a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps):
    """qkv, qkv_pre (M, (HQ+2*HKV)*HD) in the activations' dtype and rstd_heads
    (M, HQ+2*HKV) float32: the normalized input h = a * rstd (= RMSNorm(y) * gamma, y and
    gamma only through a and rstd), projected, normalized per head, rotated; qkv_pre is
    the projection pair-split (:func:`pair_split`)."""
    h = (a.to(_acc(a)) * rstd.to(_acc(a))[:, None]).to(a.dtype)
    qkv_pre = h @ w_qkv.T
    hd = 2 * inv_freq.shape[0]
    return {
        "qkv": qknorm_rope(qkv_pre, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps),
        "qkv_pre": pair_split(qkv_pre),
        "rstd_heads": head_rstd(qkv_pre, hd, eps),
    }


def baseline(*, y, gamma, a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps):
    """The unfused PyTorch code the kernel replaces, from the deferred inputs as the fused
    layer has them: the row scale in fp32, the cuBLAS GEMM, Qwen3RMSNorm per head, the
    rotation in fp32 with a cos/sin table of the positions, the per-head rstd again for
    the backward, the projection pair-split for the backward as the kernel stores it."""
    h = (a.float() * rstd[:, None]).to(a.dtype)
    qkv_pre = F.linear(h, w_qkv)
    hd = 2 * inv_freq.shape[0]
    return {
        "qkv": qknorm_rope(qkv_pre, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps),
        "qkv_pre": pair_split(qkv_pre),
        "rstd_heads": head_rstd(qkv_pre, hd, eps),
    }


def bare_gemm(*, y, gamma, a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return a @ w_qkv.T

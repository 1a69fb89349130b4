"""Backward of the per-head RMSNorm + RoPE of a QK-norm QKV projection (gemm_qknorm_rope),
fused into the epilogue of the GEMM that produces the gradient of its output; from the
standard definition, by torch.autograd.

The forward maps p = qkv_pre (the projection, every head HD = 128 wide) to qkv: each query
head RMS-normalized over its columns, times q_norm_w, rotated by RoPE (interleaved pairs),
each key head likewise with k_norm_w, the value heads unchanged (gemm_qknorm_rope's
``qknorm_rope``, imported here by value: the same code). Its backward maps the gradient of
qkv to the gradient of p and of the two norm weights. The gradient of qkv is the output of
the GEMM the kernel is fused into, dqkv = g @ w^T (in the attention backward: dQ = dS @ K
and dK = dS^T @ Q), as in rope_bwd.

Per query/key head, with n = p * r (r = the head's rstd), z = w * n and qkv = R z:
  dz = R^T dqkv,  dp = r * (w * dz - n * mean(w * dz * n)),  dw = sum over rows and heads of dz * n.
The mean is a per-(row, head) dot product; by R's orthogonality mean(w * dz * n) =
(1/HD) sum dqkv * qkv, which the kernel producing g emits for free (the attention backward
holds dS and S: sum_j dQ[m, j] Q[m, j] = sum_k dS[m, k] S[m, k]): the input ``corr``, as
rms_bwd's zdz. ``rstd_heads`` is the forward's per-head rstd. The reference ignores both
(they are consistent with p, see the derived-input functions) and differentiates the
forward.
"""

import torch
import torch.nn.functional as F

ROPE_THETA = 1000000.0
"""Qwen3's RoPE base."""
EPS = 1e-6
"""Qwen3's rms_norm_eps (the forward spec's eps)."""


def _acc(t):
    return torch.promote_types(t.dtype, torch.float32)


def qwen3_inv_freq(*, dims, **_earlier):
    """inv_freq (HD/2,) float32: 1 / 1e6^(2j/HD) (Qwen3's default RoPE). A ``derived`` input."""
    hd = dims["HD"]
    return (1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float()


def rmsnorm(x, weight, eps):
    """Qwen3RMSNorm over the last dim: normalized in fp32 (or wider), rounded to x's dtype,
    times weight."""
    xf = x.to(_acc(x))
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight.to(x.dtype) * normed


def rope(x, positions, inv_freq):
    """Interleaved RoPE of x (M, H, HD): fp32 (or wider) rotation from float64 angles,
    rounded once to x's dtype."""
    acc = _acc(x)
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().to(acc)[:, None, :], theta.sin().to(acc)[:, None, :]
    pairs = x.to(acc).unflatten(-1, (-1, 2))
    u, v = pairs[..., 0], pairs[..., 1]
    return torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(-2).to(x.dtype)


def qknorm_rope(qkv_pre, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, eps=EPS):
    """The forward (gemm_qknorm_rope's): (M, (HQ+2*HKV)*HD) in qkv_pre's dtype."""
    hd = 2 * inv_freq.shape[0]
    m = qkv_pre.shape[0]
    q = qkv_pre[:, : HQ * hd].reshape(m, HQ, hd)
    k = qkv_pre[:, HQ * hd : (HQ + HKV) * hd].reshape(m, HKV, hd)
    q = rope(rmsnorm(q, q_norm_w, eps), positions, inv_freq)
    k = rope(rmsnorm(k, k_norm_w, eps), positions, inv_freq)
    return torch.cat((q.flatten(1), k.flatten(1), qkv_pre[:, (HQ + HKV) * hd :]), dim=1)


def heads_rstd(*, qkv_pre, dims, **_earlier):
    """rstd_heads (M, HQ+2*HKV) float32: rsqrt(mean(head^2) + eps) of every head of qkv_pre
    (the forward's output). A ``derived`` input."""
    heads = qkv_pre.to(_acc(qkv_pre)).unflatten(1, (-1, dims["HD"]))
    return torch.rsqrt(heads.pow(2).mean(-1) + EPS).float()


def head_correction(*, g, w, qkv_pre, positions, inv_freq, q_norm_w, k_norm_w, HQ, HKV, dims, **_earlier):
    """corr (M, HQ+2*HKV) float32: (1/HD) sum over each head of dqkv * qkv, dqkv = g @ w^T
    and qkv the forward's output (fp32 from the inputs as stored): what the kernel producing
    g emits. A ``derived`` input; only the query and key heads' values are used."""
    acc = _acc(g)
    dqkv = g.to(acc) @ w.to(acc).T
    qkv = qknorm_rope(qkv_pre.to(acc), positions, inv_freq, q_norm_w.to(acc), k_norm_w.to(acc), HQ, HKV)
    return (dqkv * qkv).unflatten(1, (-1, dims["HD"])).mean(-1).float()


def reference(*, g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, corr, HQ, HKV):
    """dqkv_pre (M, N) in the inputs' dtype and dq_norm_w, dk_norm_w (HD,) float32 (float64
    for float64 inputs): the vector-Jacobian product of the forward with the upstream
    gradient g @ w^T (in the inputs' dtype, as the producing GEMM's output), by autograd.
    Works under no_grad (the verifier's)."""
    upstream = g @ w.T
    with torch.enable_grad():
        p = qkv_pre.detach().clone().requires_grad_(True)
        qw = q_norm_w.detach().clone().requires_grad_(True)
        kw = k_norm_w.detach().clone().requires_grad_(True)
        out = qknorm_rope(p, positions, inv_freq, qw, kw, HQ, HKV)
        dp, dqw, dkw = torch.autograd.grad(out, (p, qw, kw), grad_outputs=upstream)
    wide = _acc(g)
    return {"dqkv_pre": dp.detach(), "dq_norm_w": dqw.detach().to(wide), "dk_norm_w": dkw.detach().to(wide)}


def baseline(*, g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, corr, HQ, HKV):
    """The unfused PyTorch code the kernel replaces: the cuBLAS GEMM producing the gradient,
    then the rotation and the per-head norm backward written out in fp32 from the saved
    rstd and the emitted correction, the weight gradients as sums over rows and heads."""
    d = F.linear(g, w)
    hd = 2 * inv_freq.shape[0]
    m, nqk = d.shape[0], (HQ + HKV) * hd
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    pairs = d[:, :nqk].float().unflatten(1, (HQ + HKV, hd // 2, 2))
    dx, dy = pairs[..., 0], pairs[..., 1]
    dz = torch.stack((dx * cos + dy * sin, dy * cos - dx * sin), dim=-1).flatten(2)  # (M, HQ+HKV, HD)
    r = rstd_heads[:, : HQ + HKV, None]
    n = qkv_pre[:, :nqk].float().unflatten(1, (HQ + HKV, hd)) * r
    wt = torch.cat((q_norm_w.float().expand(HQ, hd), k_norm_w.float().expand(HKV, hd)))
    dp = r * (wt * dz - n * corr[:, : HQ + HKV, None])
    dwt = (dz * n).sum(0)
    return {
        "dqkv_pre": torch.cat((dp.flatten(1).to(d.dtype), d[:, nqk:]), dim=1),
        "dq_norm_w": dwt[:HQ].sum(0),
        "dk_norm_w": dwt[HQ:].sum(0),
    }


def bare_gemm(*, g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, corr, HQ, HKV):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return g @ w.T

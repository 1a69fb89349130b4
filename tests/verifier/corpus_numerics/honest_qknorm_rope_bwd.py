"""The honest QK-norm + RoPE backward: fp32 GEMM, R^T, the per-head RMSNorm backward from
the saved rstd and the emitted correction, the weight gradients as fp32 sums.

SPEC: gemm_qknorm_rope_bwd
EXPECT: pass

The spec's formula (dp = r * (v * dz - n * c)) in fp32, rounded once; the reference
differentiates the forward with autograd instead. It passes every rule at the public
cases and at every secret coverage case.
"""

import torch


def gemm_qknorm_rope_bwd(g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w, corr, *, HQ, HKV):
    d = g.float() @ w.float().T
    hd = 2 * inv_freq.shape[0]
    nqk = HQ + HKV
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    pairs = d[:, : nqk * hd].unflatten(1, (nqk, hd // 2, 2))
    dx, dy = pairs[..., 0], pairs[..., 1]
    dz = torch.stack((dx * cos + dy * sin, dy * cos - dx * sin), dim=-1).flatten(2)
    r = rstd_heads[:, :nqk, None]
    n = qkv_pre[:, : nqk * hd].float().unflatten(1, (nqk, hd)) * r
    wt = torch.cat((q_norm_w.float().expand(HQ, hd), k_norm_w.float().expand(HKV, hd)))
    dp = r * (wt * dz - n * corr[:, :nqk, None])
    dwt = (dz * n).sum(0)
    dqkv_pre = torch.cat((dp.flatten(1), d[:, nqk * hd :]), dim=1)
    return dqkv_pre.bfloat16(), dwt[:HQ].sum(0), dwt[HQ:].sum(0)

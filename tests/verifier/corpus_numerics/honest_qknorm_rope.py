"""The honest QK-norm projection: fp32 GEMM of the deferred input, row scale, per-head
RMSNorm and RoPE in fp32, each output rounded once.

SPEC: gemm_qknorm_rope
EXPECT: pass

What the fused kernel computes from a = y * gamma (rounded to bf16 by the kernel before
it) and rstd, while the reference normalizes y itself (its reference-only inputs) and
rounds where Qwen3's modules do; the difference is the rounding of a. It passes every
rule at the public cases and at every secret coverage case.
"""

import torch


def gemm_qknorm_rope(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, *, HQ, HKV, eps):
    p = (a.float() @ w_qkv.float().T) * rstd[:, None]
    hd = 2 * inv_freq.shape[0]
    m, nqk = p.shape[0], HQ + HKV
    heads = p.reshape(m, -1, hd)
    r = torch.rsqrt(heads.pow(2).mean(-1) + eps)
    wt = torch.cat((q_norm_w.float().expand(HQ, hd), k_norm_w.float().expand(HKV, hd)))
    z = (heads[:, :nqk] * r[:, :nqk, None] * wt).unflatten(-1, (hd // 2, 2))
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    u, v = z[..., 0], z[..., 1]
    rot = torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(1)
    qkv = torch.cat((rot, p[:, nqk * hd :]), dim=1)
    qkv_pre = torch.cat((p[:, 0::2], p[:, 1::2]), dim=1)  # pair-split, as the spec stores p
    return qkv.bfloat16(), qkv_pre.bfloat16(), r

"""The block maxima taken over 256 columns (two blocks) instead of 128.

SPEC: gemm_fp8_quant
EXPECT: correctness tolerance max-abs
OUTPUTS: y_scale
CAUGHT AT: public
RULES: max_abs elementwise quantiles

A 1x256 recipe's scales stored per 128-column block: in each pair of blocks the one with
the smaller maximum gets its neighbour's, a few percent to tens of percent too large.
Codes are consistent with the stored scales (the fp8 rule passes); the scale's rules fail.
"""

import torch


def gemm_fp8_quant(x, w, *, eps):
    y = x.float() @ w.float().T
    m, n = y.shape
    pad = (-n) % 256
    wide = torch.cat((y, torch.zeros(m, pad)), dim=1).reshape(m, -1, 256)
    amax = wide.abs().amax(-1).clamp_min(eps).repeat_interleave(2, dim=1)[:, : n // 128]
    scale = amax / 448.0
    q = (y.reshape(m, n // 128, 128) / scale[..., None]).to(torch.float8_e4m3fn).reshape(m, n)
    return q, scale

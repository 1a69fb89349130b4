"""Values rounded on the e5m2 grid (2 mantissa bits), stored in the e4m3 output.

SPEC: gemm_fp8_quant
EXPECT: correctness tolerance fp8-rounding
OUTPUTS: y_fp8
CAUGHT AT: public
RULES: fp8_rounding

The wrong format's grid, each value still within one e4m3 step: the fp8 rule finds the
codes e4m3 would round differently.
"""

import torch


def gemm_fp8_quant(x, w, *, eps):
    y = x.float() @ w.float().T
    m, n = y.shape
    blocks = y.reshape(m, n // 128, 128)
    scale = blocks.abs().amax(-1).clamp_min(eps) / 448.0
    v = (blocks / scale[..., None]).to(torch.float8_e5m2).float()
    return v.to(torch.float8_e4m3fn).reshape(m, n), scale

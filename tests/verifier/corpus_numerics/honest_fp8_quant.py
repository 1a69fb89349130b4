"""The honest 1x128 quantizer: fp32 GEMM in another reduction order, block amax, scale =
max(amax, eps) / 448, codes y / scale rounded to nearest even with saturation.

SPEC: gemm_fp8_quant
EXPECT: pass

K reversed: the same fp32 sums in another order, as a kernel's accumulation differs from
the reference's. It passes the fp8 rule and the scale's CODA rules at the public cases and
at every secret coverage case.
"""

import torch


def gemm_fp8_quant(x, w, *, eps):
    y = x.float().flip(-1) @ w.float().flip(-1).T
    m, n = y.shape
    blocks = y.reshape(m, n // 128, 128)
    scale = blocks.abs().amax(-1).clamp_min(eps) / 448.0
    return (blocks / scale[..., None]).to(torch.float8_e4m3fn).reshape(m, n), scale

"""GEMM + 1x128 blockwise FP8 quantization of its output (DeepSeek-V3's activation
recipe), from the standard definition.

y = x @ w^T; per row and block of 128 columns, scale = max(amax |y|, eps) / 448 and the
stored value is y / scale rounded to float8_e4m3fn (DeepGEMM's per_token_cast_to_fp8,
which clamps amax at 1e-4 the same way).

``reference`` returns y itself for the fp8 output ``y_fp8`` (its real value before the
final rounding: the verifier divides by the kernel's scale and rounds, see
verifier/stages/numerics_fp8.py) and the scales, in the inputs' precision: fp32 (ref32),
bf16 (ref_lowp: y rounded to bf16, as the unfused code stores it), float64 (the fp8
rule's measure of ref32's own rounding).
"""

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value."""
BLOCK = 128
"""Columns per scale block."""


def _blocks(y):
    """(M, N) -> (M, N/128, 128) view of the 1x128 blocks."""
    return y.reshape(y.shape[0], y.shape[1] // BLOCK, BLOCK)


def _scales(y, eps):
    """(M, N/128) scales max(amax, eps) / 448 in fp32 (float64 for float64 y)."""
    acc = torch.promote_types(y.dtype, torch.float32)
    return _blocks(y).abs().amax(dim=-1).to(acc).clamp_min(eps) / E4M3_MAX


def reference(*, x, w, eps):
    """y_fp8: y = x @ w^T (M, N) in the inputs' dtype, unrounded to fp8; y_scale (M, N/128)."""
    y = x @ w.T
    return {"y_fp8": y, "y_scale": _scales(y, eps)}


def baseline(*, x, w, eps):
    """The unfused PyTorch code the kernel replaces: the cuBLAS GEMM writes y in bf16, then
    DeepGEMM's per_token_cast_to_fp8 reads it back: block amax in fp32, values multiplied by
    448 / amax and cast to e4m3 (torch's cast rounds to nearest even and saturates)."""
    y = F.linear(x, w)
    amax = _blocks(y).abs().float().amax(dim=-1).clamp_min(eps)
    q = (_blocks(y) * (E4M3_MAX / amax[..., None])).to(torch.float8_e4m3fn).reshape(y.shape)
    return {"y_fp8": q, "y_scale": amax / E4M3_MAX}


def bare_gemm(*, x, w, eps):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return x @ w.T

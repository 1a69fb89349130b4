import math

import torch
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.epilogue.rotary import make_interleaved_inv_freq
import cutlass.cute as cute

# Round-to-nearest-integer magic constant (1.5 * 2^23): exact for |t| < 2^22.
_RND = 12582912.0
# Magic constants that round to a fixed quantum: 1.5 * 2^12 -> multiples of 2^-11,
# 1.5 * 2^1 -> multiples of 2^-22.
_Q11 = 6144.0
_Q22 = 3.0
_INV512 = 1.0 / 512.0
_TWO_PI = 2.0 * math.pi


def _frac(t):
    # t - round(t), exact whenever t itself is exact (|t| < 2^22)
    return t - ((t + _RND) - _RND)


# rstd and positions are per-row fp32 column vectors, freq is the per-column
# float-float (hi, lo) table of inv_freq / (2 pi) (zero over the V columns); all pinned
# so that M == N never makes the row/col inference ambiguous.
# acc_pair: accumulator columns (2j, 2j+1) are one rotation pair; D stays full width.
@gemm_epilogue(
    ops={
        "rstd": ColVecLoad("rstd"),
        "pos": ColVecLoad("pos"),
        "freq": RowVecLoad("freq"),
    },
    mode="acc_pair",
)
def rstd_rope_epi(acc, rstd, pos, freq):
    # deferred RMSNorm row scale on the fp32 accumulator, before the rotation
    x, y = unpack(acc * rstd)
    hi, lo = unpack(freq)              # frequency in turns per position, float-float
    # split hi = fa + fb + fc with fa a multiple of 2^-11, fb a multiple of 2^-22
    fa = (hi + _Q11) - _Q11
    r = hi - fa
    fb = (r + _Q22) - _Q22
    fc = r - fb
    # split the (integer) position: pos = p1s + p0, p1s a multiple of 512, |p0| <= 256
    p1 = (pos * _INV512 + _RND) - _RND
    p1s = p1 * 512.0
    p0 = pos - p1s
    # every product below is exact in fp32; reduce each mod 1 before summing
    turns = (
        _frac(p1s * fa)
        + _frac(p0 * fa)
        + _frac(p1s * fb)
        + _frac(p0 * fb)
        + (pos * fc + pos * lo)
    )
    turns = _frac(turns)               # in [-0.5, 0.5] turns
    ang = turns * _TWO_PI
    cs = cute.math.cos(ang, fastmath=True)
    sn = cute.math.sin(ang, fastmath=True)
    return {"D": pack(x * cs - y * sn, x * sn + y * cs)}


def gemm_rmsnorm_rope(a, rstd, w_qkv, positions, inv_freq, *, HQ, HKV):
    # a (M, K) bf16 = y * gamma, rstd (M,) fp32, w_qkv (N, K) nn.Linear layout,
    # positions (M,) int64, inv_freq (HD/2,) fp32 -> qkv (M, N) bf16
    hd = 2 * inv_freq.shape[0]
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)
    pos = positions.float()
    res = rstd_rope_epi(
        a,
        w_qkv.T,
        tuned=False,
        rstd=rstd.view(1, -1),
        pos=pos.view(1, -1),
        freq=freq.reshape(1, -1),
    )
    return res["D"]

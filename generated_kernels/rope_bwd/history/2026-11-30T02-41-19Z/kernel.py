import math

import torch
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.epilogue.rotary import make_interleaved_inv_freq

# Round-to-nearest-integer via the 1.5 * 2^23 magic constant (|x| < 2^22).
ROUND_MAGIC = 12582912.0
# Quantize the frequency (in turns) to multiples of 2^-9 (1.5 * 2^14) and 2^-17 (1.5 * 2^6)
# so that positions (< 2^17 integers) times each piece are exact in fp32.
Q1_MAGIC = 24576.0
Q2_MAGIC = 96.0
TWO_PI = 2.0 * math.pi


# pos: per-row fp32 position (ColVecLoad), freq: per-column float-float inv_freq / 2pi
# (hi at column 2j, lo at 2j+1; zero over V columns). Both pinned: M may equal N.
@gemm_epilogue(ops={"pos": ColVecLoad("pos"), "freq": RowVecLoad("freq")}, mode="acc_pair")
def rope_bwd_epi(acc, pos, freq):
    dx, dy = unpack(acc)                 # dqkv_rot[m, 2j], dqkv_rot[m, 2j+1]
    hi, lo = unpack(freq)                # inv_freq[j] / (2 pi) as hi + lo
    # exact split of hi into pieces whose products with the integer position are exact
    f1 = (hi + Q1_MAGIC) - Q1_MAGIC      # multiple of 2^-9
    rem = hi - f1                        # exact, |rem| <= 2^-10
    f2 = (rem + Q2_MAGIC) - Q2_MAGIC     # multiple of 2^-17
    f3 = rem - f2                        # exact, |f3| <= 2^-18
    a1 = pos * f1                        # exact
    a2 = pos * f2                        # exact
    r1 = a1 - ((a1 + ROUND_MAGIC) - ROUND_MAGIC)   # fractional turns, exact
    r2 = a2 - ((a2 + ROUND_MAGIC) - ROUND_MAGIC)   # fractional turns, exact
    t = (r1 + r2) + (pos * f3 + pos * lo)
    t = t - ((t + ROUND_MAGIC) - ROUND_MAGIC)      # in [-0.5, 0.5] turns
    ang = t * TWO_PI                               # in [-pi, pi]
    cs = cute.math.cos(ang, fastmath=True)
    sn = cute.math.sin(ang, fastmath=True)
    # transposed rotation R^T = R(-theta); V columns have angle 0 -> identity
    return {"D": pack(dx * cs + dy * sn, dy * cs - dx * sn)}


def rope_bwd(g, w, positions, inv_freq, *, HQ, HKV):
    # g (M, K), w (N, K) nn.Linear layout, N = (HQ + 2*HKV) * HD
    hd = 2 * inv_freq.shape[0]
    rotary_n = (HQ + HKV) * hd
    nonrotary_n = HKV * hd
    freq = make_interleaved_inv_freq(inv_freq, rotary_n, nonrotary_n)
    pos = positions.float()
    res = rope_bwd_epi(g, w.T, tuned=False, pos=pos.view(1, -1), freq=freq.view(1, -1))
    return res["D"]

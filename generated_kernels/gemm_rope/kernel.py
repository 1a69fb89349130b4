import math

import torch
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.epilogue.rotary import make_interleaved_inv_freq
from quack.gemm_config import GemmConfig

# 128x192 pingpong (SM90 default) when N tiles evenly by 192 (llama3-1b/8b QKV widths);
# otherwise a 128x256 cooperative tile (e.g. N = 10240 at 70B divides by 256, not by 192).
CFG_192 = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1,
                     is_dynamic_persistent=False)
CFG_256 = GemmConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1,
                     is_dynamic_persistent=False)

ROUND_MAGIC = 12582912.0          # 1.5 * 2^23: (v + M) - M rounds v to the nearest integer
HI_SCALE = 512.0                  # split granularity 2^-9 for the exact pos * hi1 product
HI_INV_SCALE = 1.0 / 512.0
TWO_PI = 2.0 * math.pi


# acc_pair: accumulator columns (2j, 2j+1) = rotation pair j of a head.
# pos: per-row fp32 position (ColVecLoad, one scalar per pair).
# freq: per-column table, (hi, lo) float-float inv_freq / (2*pi) at columns (2j, 2j+1),
#       zero over the V columns (angle 0 -> exact identity).
@gemm_epilogue(ops={"pos": ColVecLoad("pos"), "freq": RowVecLoad("freq")}, mode="acc_pair")
def rope_epi(acc, pos, freq):
    hi, lo = unpack(freq)
    # split hi = hi1 + hi2 with hi1 a multiple of 2^-9 (<= 82 * 2^-9): pos * hi1 is exact
    hi1 = ((hi * HI_SCALE + ROUND_MAGIC) - ROUND_MAGIC) * HI_INV_SCALE
    hi2 = hi - hi1
    p1 = pos * hi1
    f1 = p1 - ((p1 + ROUND_MAGIC) - ROUND_MAGIC)          # exact fractional turns in [-0.5, 0.5]
    t = f1 + (pos * hi2 + pos * lo)                        # small remainder, fp32 error ~1e-5 turns
    t = t - ((t + ROUND_MAGIC) - ROUND_MAGIC)              # reduce to [-0.5, 0.5] turns
    ang = t * TWO_PI                                       # in [-pi, pi]
    c = cute.math.cos(ang, fastmath=True)
    s = cute.math.sin(ang, fastmath=True)
    x, y = unpack(acc)
    return {"D": pack(x * c - y * s, x * s + y * c)}


def gemm_rope(x, w_qkv, positions, inv_freq, *, HQ, HKV):
    # x (M, K) bf16, w_qkv ((HQ+2*HKV)*HD, K) bf16 nn.Linear layout, positions (M,) int64,
    # inv_freq (HD/2,) fp32 -> qkv (M, (HQ+2*HKV)*HD) bf16 with Q and K heads rotated.
    hd = 2 * inv_freq.shape[0]
    n = w_qkv.shape[0]
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)
    pos = positions.float()
    cfg = CFG_192 if n % 192 == 0 else CFG_256
    res = rope_epi(x, w_qkv.T, tuned=False, config=cfg,
                   pos=pos.view(1, -1), freq=freq.view(1, -1))
    return res["D"]

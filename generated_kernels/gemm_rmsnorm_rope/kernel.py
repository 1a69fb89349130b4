import math

import torch
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.epilogue.rotary import make_interleaved_inv_freq
from quack.gemm_config import GemmConfig

# Round-to-nearest-integer magic constant (1.5 * 2^23): exact for |t| < 2^22.
_RND = 12582912.0
# 1.5 * 2^14: (v + _Q9) - _Q9 rounds v to a multiple of 2^-9.
_Q9 = 24576.0
_TWO_PI = 2.0 * math.pi

# Cooperative 128x256 tile, used when N is not a multiple of the default tile_n=192
# (llama3-70b: N = 10240 = 40 * 256), so that no N tile is ragged.
CFG_WIDE = GemmConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1,
                      is_dynamic_persistent=False)


# rstd and pos are per-row fp32 column vectors; freq is the per-column float-float
# (hi, lo) table of inv_freq / (2 pi) in turns per position (zero over the V columns,
# so V passes through unrotated). All pinned: M == N never makes inference ambiguous.
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
    hi, lo = unpack(freq)
    # hi < 1/(2 pi): fa = hi rounded to a multiple of 2^-9 has <= 7 significant bits,
    # so pos * fa (pos an integer < 2^17) is exact in fp32; reduce it mod 1 exactly.
    fa = (hi + _Q9) - _Q9
    t1 = pos * fa
    t1 = t1 - ((t1 + _RND) - _RND)
    # remainder: |hi - fa| <= 2^-10, so |pos * (hi - fa + lo)| <= 128 turns (error ~1e-5)
    t2 = pos * ((hi - fa) + lo)
    turns = t1 + t2
    turns = turns - ((turns + _RND) - _RND)     # in [-0.5, 0.5] turns
    ang = turns * _TWO_PI
    cs = cute.math.cos(ang, fastmath=True)
    sn = cute.math.sin(ang, fastmath=True)
    return {"D": pack(x * cs - y * sn, x * sn + y * cs)}


def gemm_rmsnorm_rope(a, rstd, w_qkv, positions, inv_freq, *, HQ, HKV):
    # a (M, K) bf16 = y * gamma, rstd (M,) fp32, w_qkv (N, K) nn.Linear layout,
    # positions (M,) int64, inv_freq (HD/2,) fp32 -> qkv (M, N) bf16
    hd = 2 * inv_freq.shape[0]
    n = w_qkv.shape[0]
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)
    pos = positions.float()
    cfg = None if n % 192 == 0 else CFG_WIDE
    res = rstd_rope_epi(
        a,
        w_qkv.T,
        tuned=False,
        config=cfg,
        rstd=rstd.view(1, -1),
        pos=pos.view(1, -1),
        freq=freq.reshape(1, -1),
    )
    return res["D"]

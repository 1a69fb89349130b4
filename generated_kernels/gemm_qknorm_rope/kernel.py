import math

import torch
import cutlass
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.head_rmsnorm import HeadRstd
from quack.epilogue.ops import ColVecLoad, GroupedColStatsOut, RowVecLoad
from quack.epilogue.rotary import make_interleaved_inv_freq
from quack.gemm_config import GemmConfig

# 128x128 pingpong: tile_n is one whole head (HD = 128), as the grouped statistic requires,
# 128 fp32 accumulator registers per thread, and one warpgroup's (heavy) epilogue overlaps
# the other warpgroup's mainloop.
CFG = GemmConfig(tile_m=128, tile_n=128, pingpong=True, cluster_m=2, cluster_n=1,
                 is_dynamic_persistent=False)

# per-(row, head) rsqrt(mean(p^2) + eps) of p = rstd * acc, folded in registers
HRS = HeadRstd("hrs", eps=1e-6)

ROUND_MAGIC = 12582912.0          # 1.5 * 2^23: (v + M) - M rounds v to the nearest integer
HI_SCALE = 512.0                  # split granularity 2^-9 for the exact pos * hi1 product
HI_INV_SCALE = 1.0 / 512.0
TWO_PI = 2.0 * math.pi


def head_sq(acc, rstd):
    # the statistic is over p = rstd * acc, not over the raw accumulator
    v = acc * rstd
    return {"hrs": v * v}


# acc_pair: accumulator columns (2j, 2j+1) are rotation pair j of a head.
# rstd, pos: per-row fp32 column vectors. freq: per-column float-float (hi, lo) table of
# inv_freq / (2 pi) (zero over the value columns). nw: per-column norm weight
# (q_norm_w over query heads, k_norm_w over key heads; unused over value heads).
# hrs: the finalized per-(row, head) rstd from the prepass.
@gemm_epilogue(
    outputs=("pe", "po"),
    ops={
        "rstd": ColVecLoad("rstd"),
        "pos": ColVecLoad("pos"),
        "freq": RowVecLoad("freq"),
        "nw": RowVecLoad("nw"),
        "hrs": HRS,
    },
    prepass=head_sq,
    prepass_outs=("hrs",),
    extra_ops=(GroupedColStatsOut("hrs_out", HRS),),
    mode="acc_pair",
)
def qknorm_rope_epi(acc, rstd, pos, freq, nw, hrs):
    p = acc * rstd                      # deferred input RMSNorm row scale (fp32)
    z = p * hrs * nw                    # per-head RMSNorm, then its weight
    px, py = unpack(p)
    zx, zy = unpack(z)
    hi, lo = unpack(freq)
    # angle in turns: pos * (hi + lo); hi1 = hi rounded to a multiple of 2^-9 makes
    # pos * hi1 exact in fp32 (pos < 2^16), reduced mod 1 exactly
    hi1 = ((hi * HI_SCALE + ROUND_MAGIC) - ROUND_MAGIC) * HI_INV_SCALE
    p1 = pos * hi1
    f1 = p1 - ((p1 + ROUND_MAGIC) - ROUND_MAGIC)
    t = f1 + (pos * (hi - hi1) + pos * lo)
    t = t - ((t + ROUND_MAGIC) - ROUND_MAGIC)      # in [-0.5, 0.5] turns
    ang = t * TWO_PI
    cs = cute.math.cos(ang, fastmath=True)
    sn = cute.math.sin(ang, fastmath=True)
    is_v = hi == 0.0                                # value columns: freq table is zero
    ox = cutlass.select_(is_v, px, zx * cs - zy * sn)
    oy = cutlass.select_(is_v, py, zx * sn + zy * cs)
    return {"D": pack(ox, oy), "pe": px, "po": py}


def gemm_qknorm_rope(a, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, *, HQ, HKV, eps):
    # a (M, K) bf16, rstd (M,) fp32, w_qkv (N, K) nn.Linear layout, positions (M,) int64,
    # inv_freq (HD/2,) fp32, q_norm_w / k_norm_w (HD,) bf16
    # -> qkv (M, N) bf16, qkv_pre (M, N) bf16 pair-split, rstd_heads (M, N / HD) fp32
    m = a.shape[0]
    n = w_qkv.shape[0]
    hd = 2 * inv_freq.shape[0]
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)
    nw = torch.cat((q_norm_w.repeat(HQ), k_norm_w.repeat(2 * HKV)))
    pos = positions.float()
    qkv = torch.empty(m, n, dtype=a.dtype, device=a.device)
    qkv_pre = torch.empty(m, n, dtype=a.dtype, device=a.device)
    rstd_heads = torch.empty(m, n // hd, dtype=torch.float32, device=a.device)
    qknorm_rope_epi(
        a,
        w_qkv.T,
        tuned=False,
        config=CFG,
        out={"D": qkv, "pe": qkv_pre[:, : n // 2], "po": qkv_pre[:, n // 2:]},
        rstd=rstd.view(1, -1),
        pos=pos.view(1, -1),
        freq=freq.reshape(1, -1),
        nw=nw.view(1, -1),
        hrs=hd,
        hrs_out=rstd_heads,
    )
    return qkv, qkv_pre, rstd_heads

"""gemm_qknorm_rope_bwd: R^T + per-head RMSNorm backward fused into the epilogue of dqkv = g @ w^T.

The GEMM runs batched over groups of G consecutive heads (G = 4, 2 or 1: the largest that
divides both HQ and HKV, so every batch is purely query, key or value heads). A = g broadcast
over the batch (zero-copy), B = the group's (G*HD, K) slice of w, D / qkv_pre = (H/G, M, G*HD)
views of the (M, N) tensors. Each per-(row, head) statistic (rstd, corr) becomes, for head slot
s of the group, a per-row vector (ColVecLoad) of the batch; a per-column slot table (two 0/1
bits, shared across the batch) picks the slot. Value heads are recognised by their zero
frequency (make_interleaved_inv_freq writes 0 there) and pass the gradient through.
"""
import math

import torch
import cutlass
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad, RowVecReduce
from quack.epilogue.rotary import make_interleaved_inv_freq
from quack.gemm_config import GemmConfig

# 128x128 pingpong: one head (HD = 128) per N tile, 128 accumulator registers per thread.
# Pinned: the dw partial buffer has ceil(M / tile_m) slots.
CFG = GemmConfig(tile_m=128, tile_n=128, pingpong=True, cluster_m=2, cluster_n=1,
                 is_dynamic_persistent=False)

# Round-to-nearest-integer via the 1.5 * 2^23 magic constant (|x| < 2^22).
ROUND_MAGIC = 12582912.0
# Quantize the frequency (in turns) to multiples of 2^-9 (1.5 * 2^14) and 2^-17 (1.5 * 2^6)
# so that positions (< 2^17 integers) times each piece are exact in fp32.
Q1_MAGIC = 24576.0
Q2_MAGIC = 96.0
TWO_PI = 2.0 * math.pi


# acc = (dqkv[m, 2j], dqkv[m, 2j+1]) of the batch's head group; pre = the same pair of qkv_pre.
# pos: per-row fp32 position (rank-1, shared across the batch).
# r0..r3 / c0..c3: rstd / corr of head slot 0..3 of the batch (per-row vectors).
# freq: per-column float-float inv_freq / 2pi (hi at 2j, lo at 2j+1; zero on value heads).
# nw: per-column norm weight (q_norm_w on query heads, k_norm_w on key heads).
# sa, sb: per-column bits of the head slot inside the batch (rank-1, shared across the batch).
@gemm_epilogue(
    ops={
        "pos": ColVecLoad("pos"),
        "r0": ColVecLoad("r0"),
        "r1": ColVecLoad("r1"),
        "r2": ColVecLoad("r2"),
        "r3": ColVecLoad("r3"),
        "c0": ColVecLoad("c0"),
        "c1": ColVecLoad("c1"),
        "c2": ColVecLoad("c2"),
        "c3": ColVecLoad("c3"),
        "freq": RowVecLoad("freq"),
        "nw": RowVecLoad("nw"),
        "sa": RowVecLoad("sa"),
        "sb": RowVecLoad("sb"),
    },
    reduces={"dw": RowVecReduce("dw")},
    mode="acc_pair",
)
def qknorm_rope_bwd_epi(acc, pre, pos, r0, r1, r2, r3, c0, c1, c2, c3, freq, nw, sa, sb):
    dx, dy = unpack(acc)
    p0, p1 = unpack(pre)
    hi, lo = unpack(freq)
    w0, w1 = unpack(nw)
    a0, a1 = unpack(sa)
    b0, b1 = unpack(sb)
    # exact range reduction of theta = pos * inv_freq (in turns), as in rope_bwd
    f1 = (hi + Q1_MAGIC) - Q1_MAGIC
    rem = hi - f1
    f2 = (rem + Q2_MAGIC) - Q2_MAGIC
    f3 = rem - f2
    t1 = pos * f1
    t2 = pos * f2
    u1 = t1 - ((t1 + ROUND_MAGIC) - ROUND_MAGIC)
    u2 = t2 - ((t2 + ROUND_MAGIC) - ROUND_MAGIC)
    t = (u1 + u2) + (pos * f3 + pos * lo)
    t = t - ((t + ROUND_MAGIC) - ROUND_MAGIC)
    ang = t * TWO_PI
    cs = cute.math.cos(ang, fastmath=True)
    sn = cute.math.sin(ang, fastmath=True)
    # R^T = R(-theta)
    dz0 = dx * cs + dy * sn
    dz1 = dy * cs - dx * sn
    # per-(row, head) statistics of this column's head slot
    bit_lo = a0 > 0.5
    bit_hi = b0 > 0.5
    r = cutlass.select_(bit_hi, cutlass.select_(bit_lo, r3, r2), cutlass.select_(bit_lo, r1, r0))
    cc = cutlass.select_(bit_hi, cutlass.select_(bit_lo, c3, c2), cutlass.select_(bit_lo, c1, c0))
    n0 = p0 * r
    n1 = p1 * r
    o0 = r * (w0 * dz0 - n0 * cc)
    o1 = r * (w1 * dz1 - n1 * cc)
    is_v = hi == 0.0
    zero = cutlass.Float32(0.0)
    # norm-weight gradient terms; exactly 0 where pre is 0 (incl. out-of-bounds rows)
    g0 = cutlass.select_(p0 == 0.0, zero, dz0 * n0)
    g1 = cutlass.select_(p1 == 0.0, zero, dz1 * n1)
    return {
        "D": pack(cutlass.select_(is_v, dx, o0), cutlass.select_(is_v, dy, o1)),
        "dw": pack(g0, g1),
    }


def gemm_qknorm_rope_bwd(g, w, qkv_pre, rstd_heads, positions, inv_freq, q_norm_w, k_norm_w,
                         corr, *, HQ, HKV):
    m, k = g.shape
    hd = 2 * inv_freq.shape[0]
    nh = HQ + 2 * HKV
    n = nh * hd
    grp = 4 if (HQ % 4 == 0 and HKV % 4 == 0) else (2 if (HQ % 2 == 0 and HKV % 2 == 0) else 1)
    nb = nh // grp
    gw = grp * hd

    # per-(row, head) stats -> (grp, nb, mp) fp32, mp a multiple of 4 (16-byte aligned slices)
    mp = (m // 4 + 1) * 4
    pad = mp - m
    rp = rstd_heads.reshape(m, nb, grp).permute(2, 1, 0)
    cp = corr.reshape(m, nb, grp).permute(2, 1, 0)
    rst = torch.cat((rp, rp[:, :, :1].expand(grp, nb, pad)), 2)
    cst = torch.cat((cp, cp[:, :, :1].expand(grp, nb, pad)), 2)
    i1 = 1 if grp > 1 else 0
    i2 = 2 if grp > 2 else 0
    i3 = 3 if grp > 2 else i1

    pos = positions.float()
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd).reshape(nb, gw)
    nw = torch.cat(
        (q_norm_w.view(1, hd).expand(HQ, hd), k_norm_w.view(1, hd).expand(2 * HKV, hd)), 0
    ).view(nb, gw)

    zs = torch.zeros(2 * hd, dtype=torch.float32, device=g.device)
    if grp == 4:
        os1 = torch.ones(2 * hd, dtype=torch.float32, device=g.device)
        sa = torch.cat((zs[:hd], os1[:hd], zs[:hd], os1[:hd]))
        sb = torch.cat((zs, os1))
    elif grp == 2:
        os1 = torch.ones(2 * hd, dtype=torch.float32, device=g.device)
        sa = torch.cat((zs[:hd], os1[:hd]))
        sb = zs
    else:
        sa = zs[:hd]
        sb = zs[:hd]

    mt = -(-m // CFG.tile_m)
    part = torch.empty(nb, mt, gw, dtype=torch.float32, device=g.device)
    out = torch.empty(m, n, dtype=qkv_pre.dtype, device=g.device)

    qknorm_rope_bwd_epi(
        g.unsqueeze(0).expand(nb, m, k),
        w.view(nb, gw, k).transpose(1, 2),
        out={"D": out.view(m, nb, gw).transpose(0, 1)},
        config=CFG,
        tuned=False,
        pre=qkv_pre.view(m, nb, gw).transpose(0, 1),
        pos=pos,
        r0=rst[0, :, :m],
        r1=rst[i1, :, :m],
        r2=rst[i2, :, :m],
        r3=rst[i3, :, :m],
        c0=cst[0, :, :m],
        c1=cst[i1, :, :m],
        c2=cst[i2, :, :m],
        c3=cst[i3, :, :m],
        freq=freq,
        nw=nw,
        sa=sa,
        sb=sb,
        dw=part,
    )

    nq = HQ // grp
    nk = (HQ + HKV) // grp
    dq = torch.sum(part[:nq].view(-1, hd), 0)
    dk = torch.sum(part[nq:nk].view(-1, hd), 0)
    return out, dq, dk

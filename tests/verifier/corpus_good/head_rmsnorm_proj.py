"""Per-head RMSNorm after a projection (QK-norm): quack's HeadRstd statistic from a
sum-of-squares prepass, applied with the norm weight as a row vector, the per-(row, head)
rstd written for the backward by the statistic's companion writer.

ENTRY: head_rmsnorm_proj
ARGS: x:bfloat16[256,512];w:bfloat16[512,512];gamma:bfloat16[512]
OUTPUTS: bfloat16[256,512];float32[256,4]
"""

import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.head_rmsnorm import HeadRstd
from quack.epilogue.ops import GroupedColStatsOut, RowVecLoad
from quack.gemm_config import GemmConfig

HEAD_DIM = 128
RSTD = HeadRstd("rstd", eps=1e-6)
# a head must not straddle tiles: tile_n a multiple of the head width (SM90 default is 192)
CFG = GemmConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1)


def sumsq_prepass(acc):
    return {"rstd": acc * acc}


@gemm_epilogue(
    ops={"rstd": RSTD, "gamma": RowVecLoad("gamma")},
    prepass=sumsq_prepass,
    prepass_outs=("rstd",),
    extra_ops=(GroupedColStatsOut("rstd_out", RSTD),),
)
def head_rmsnorm_epi(acc, rstd, gamma):
    return {"D": acc * rstd * gamma}


def head_rmsnorm_proj(x, w, gamma):
    # x (M, K), w (N, K), gamma (N,) the head weight repeated per head -> y (M, N) with every
    # 128-column head RMS-normalized, rstd (M, N / 128) fp32
    m, n = x.shape[0], w.shape[0]
    rstd_out = torch.empty(m, n // HEAD_DIM, dtype=torch.float32, device=x.device)
    res = head_rmsnorm_epi(x, w.T, tuned=False, config=CFG, rstd=HEAD_DIM, gamma=gamma, rstd_out=rstd_out)
    return res["D"], rstd_out

"""1x128 blockwise fp8 output quantization of a projection: per-(row, 128-column block)
amax from an accumulator prepass (a max-combine grouped-stats op), scale = amax / 448,
e4m3 values stored as D and the fp32 scales written by the stats op's companion writer.

ENTRY: fp8_quant_proj
ARGS: x:bfloat16[256,512];w:bfloat16[384,512]
OUTPUTS: float8_e4m3fn[256,384];float32[256,3]
"""

import cutlass
import cutlass.cute as cute
import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import GroupedColStatsBase, GroupedColStatsOut
from quack.gemm_config import GemmConfig

E4M3_MAX = 448.0
TINY = 1e-12
BLOCK = 128
CFG = GemmConfig(tile_m=128, tile_n=128, pingpong=False, cluster_m=1, cluster_n=1)


class BlockScale(GroupedColStatsBase):
    """Per-(row, block) scale amax / 448 from a max fold of |acc|."""

    combine = "max"

    def stat_value(self, total, group_cols):
        return cutlass.max(total, TINY) * (1.0 / E4M3_MAX)


def amax_prepass(acc):
    return {"scale": cute.math.absf(acc)}


SCALE = BlockScale("scale")


@gemm_epilogue(
    ops={"scale": SCALE},
    prepass=amax_prepass,
    prepass_outs=("scale",),
    extra_ops=(GroupedColStatsOut("scale_out", SCALE),),
)
def fp8_quant_epi(acc, scale):
    return {"D": acc / scale}


def fp8_quant_proj(x, w):
    # x (M, K), w (N, K) -> q (M, N) e4m3 with q * scale ~= x @ w.T, scales (M, N / 128) fp32
    m, n = x.shape[0], w.shape[0]
    q = torch.empty(m, n, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(m, n // BLOCK, dtype=torch.float32, device=x.device)
    fp8_quant_epi(x, w.T, out={"D": q}, tuned=False, config=CFG, scale=BLOCK, scale_out=scales)
    return q, scales

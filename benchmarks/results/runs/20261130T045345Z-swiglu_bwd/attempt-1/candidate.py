import torch
import cutlass
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.gemm_config import GemmConfig

# Packed gated-backward epilogue: a 128x160 pingpong tile has no register spills and is
# faster where the epilogue is exposed (small K). For larger K, quack's default tile is
# used (config=None, tuned=False), as measured in the tricks log.
CFG_SMALL_K = GemmConfig(tile_m=128, tile_n=160, pingpong=True, cluster_m=2, cluster_n=1,
                         is_dynamic_persistent=False)


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    g, u = unpack(c)                    # gate = preact[m, 2j], up = preact[m, 2j+1]
    one = cutlass.Float32(1.0)
    s = one / (one + cute.math.exp(-g, fastmath=True))   # sigmoid(gate)
    silu = g * s
    # dgate = dpost * up * s * (1 + g * (1 - s)) = dpost * up * (s + silu * (1 - s))
    dg = acc * u * (s + silu * (one - s))
    du = acc * silu
    return {"D": pack(dg, du), "postact": silu * u}


def swiglu_bwd(dout, w_down, preact):
    # dout (M, K), w_down (K, I) nn.Linear weight of the down projection: B = w_down as is.
    k = dout.shape[1]
    if k <= 2048:
        res = dswiglu_epi(dout, w_down, preact, tuned=False, config=CFG_SMALL_K)
    else:
        res = dswiglu_epi(dout, w_down, preact, tuned=False)
    return res["D"], res["postact"]     # dpreact (M, 2I) interleaved, postact (M, I)

import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.gemm_config import GemmConfig

# 128x160 pingpong: no register spills for packed gated-backward epilogues, and measured
# faster than quack's default tile where the epilogue is exposed (small K). For larger K
# quack's SM90 default config (config=None) is used.
CFG_SMALL_K = GemmConfig(tile_m=128, tile_n=160, pingpong=True, cluster_m=2, cluster_n=1,
                         is_dynamic_persistent=False)
SMALL_K = 2048


# acc = dpost[m, j] (fp32); c = (preact[m, 2j], preact[m, 2j+1]) = (gate, up).
@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    g, u = unpack(c)
    s = sigmoid(g)
    silu = g * s
    # d silu / dg = s * (1 + g * (1 - s)) = s + silu * (1 - s)
    dsilu = s + silu * (1.0 - s)
    dg = acc * u * dsilu
    du = acc * silu
    return {"D": pack(dg, du), "postact": silu * u}


def swiglu_bwd(dout, w_down, preact):
    # dout (M, K), w_down (K, I) nn.Linear layout: dpost = dout @ w_down, B = w_down as is.
    cfg = CFG_SMALL_K if dout.shape[-1] <= SMALL_K else None
    res = dswiglu_epi(dout, w_down, preact, tuned=False, config=cfg)
    return res["D"], res["postact"]    # dpreact (M, 2I) interleaved, postact (M, I)

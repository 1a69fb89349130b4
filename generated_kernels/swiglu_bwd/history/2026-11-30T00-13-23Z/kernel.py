import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.gemm_config import GemmConfig

# Packed gated backward: 128x160 pingpong keeps the accumulator at 160 regs/thread
# (no spills for dgated epilogues) while one warpgroup's memory-bound epilogue
# overlaps the other warpgroup's mainloop.
CFG = GemmConfig(tile_m=128, tile_n=160, pingpong=True, cluster_m=2, cluster_n=1,
                 is_dynamic_persistent=False)


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    g, u = unpack(c)                    # preact[m, 2j] (gate), preact[m, 2j+1] (up)
    s = sigmoid(g)
    silu_g = g * s
    # dgate = dpost * up * s * (1 + g * (1 - s)) = dpost * up * (s + silu - silu * s)
    dg = acc * u * (s + silu_g - silu_g * s)
    du = acc * silu_g
    return {"D": pack(dg, du), "postact": silu_g * u}


def swiglu_bwd(dout, w_down, preact):
    # dpost = dout @ W_down: A = dout (M, K), B = W_down (K, I) as is; C = preact (M, 2I)
    res = dswiglu_epi(dout, w_down, preact, tuned=False, config=CFG)
    return res["D"], res["postact"]     # dpreact (M, 2I) interleaved, postact (M, I)

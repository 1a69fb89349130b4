import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecReduce
from quack.gemm_config import GemmConfig

# Pingpong tiles with cluster 2x1 for packed gated-backward epilogues (never cooperative):
# 128x128 where the epilogue is exposed (small K), quack's SM90 default 128x192 above.
# Pinned so the zdz partial buffer shape (M, ceil(I / tile_n)) is known.
CFG_SMALL_K = GemmConfig(tile_m=128, tile_n=128, pingpong=True, cluster_m=2, cluster_n=1,
                         is_dynamic_persistent=False)
CFG_LARGE_K = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1,
                         is_dynamic_persistent=False)
SMALL_K = 2048


# acc = dpost[m, j] (fp32); c = (preact[m, 2j], preact[m, 2j+1]) = (gate, up).
# zdz partial per (row, N tile): (1/K) * sum_j (dgate * gate + dup * up), from fp32 values.
# Out-of-bounds lanes: acc = 0 and c = 0 -> every term is exactly 0.
@gemm_epilogue(
    outputs=("postact",),
    reduces={"zdz": ColVecReduce("zdz")},
    mode="packed_cd_b16x2",
)
def dswiglu_zdz_epi(acc, c, inv_k):
    g, u = unpack(c)
    s = sigmoid(g)
    silu = g * s
    # d silu / dg = s * (1 + g * (1 - s)) = s + silu * (1 - s)
    dsilu = s + silu * (1.0 - s)
    dg = acc * u * dsilu
    du = acc * silu
    return {
        "D": pack(dg, du),
        "postact": silu * u,
        "zdz": (dg * g + du * u) * inv_k,
    }


def swiglu_bwd_rms(dout, w_down, preact):
    # dout (M, K), w_down (K, I) nn.Linear layout: dpost = dout @ w_down, B = w_down as is.
    m = preact.shape[0]
    k = dout.shape[-1]
    i = w_down.shape[-1]
    inv_k = 1.0 / k
    if k <= SMALL_K:
        zdz_partials = torch.empty(m, -(-i // CFG_SMALL_K.tile_n), dtype=torch.float32,
                                   device=dout.device)
        res = dswiglu_zdz_epi(dout, w_down, preact, tuned=False, config=CFG_SMALL_K,
                              inv_k=inv_k, zdz=zdz_partials)
    else:
        zdz_partials = torch.empty(m, -(-i // CFG_LARGE_K.tile_n), dtype=torch.float32,
                                   device=dout.device)
        res = dswiglu_zdz_epi(dout, w_down, preact, tuned=False, config=CFG_LARGE_K,
                              inv_k=inv_k, zdz=zdz_partials)
    # finishing step (the one allowed extra launch): sum the per-tile partials per row
    zdz = torch.sum(zdz_partials, 1)
    return res["D"], res["postact"], zdz   # dpreact (M, 2I), postact (M, I), zdz (M,) fp32

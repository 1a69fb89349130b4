import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import ColVecLoad, RowVecLoad, RowVecReduce
from quack.gemm_config import GemmConfig

# quack's SM90 default tile, pinned so the dgamma partial buffer shape is known.
CFG = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1,
                 is_dynamic_persistent=False)


# acc = (dy @ W)[m, d] = dz (fp32, never stored); c = dresid; h = saved pre-norm stream.
# All vectors pinned: M may equal D (70B shape).
@gemm_epilogue(
    ops={"gamma": RowVecLoad("gamma"), "rstd": ColVecLoad("rstd"), "zdz": ColVecLoad("zdz")},
    reduces={"dgamma": RowVecReduce("dgamma", scaled=True)},
)
def rms_bwd_epi(acc, c, h, gamma, rstd, zdz):
    xhat = h * rstd
    dh = (acc * gamma - xhat * zdz) * rstd + c
    # dgamma partial: sum over the M tile of acc * xhat (zero on out-of-bounds lanes)
    return {"D": dh, "dgamma": (acc, xhat)}


def rms_bwd(dy, w, h, gamma, rstd, zdz, dresid):
    # dy (M, N), w (N, D) nn.Linear weight: dgrad acc = dy @ w, B = w as is (K=N, N_gemm=D)
    m, d = h.shape
    m_tiles = -(-m // CFG.tile_m)
    dgamma_partials = torch.empty(m_tiles, d, dtype=torch.float32, device=dy.device)
    res = rms_bwd_epi(
        dy, w, dresid, tuned=False, config=CFG,
        h=h,
        gamma=gamma.view(1, -1),
        rstd=rstd.view(1, -1),
        zdz=zdz.view(1, -1),
        dgamma=dgamma_partials,
    )
    dh = res["D"]
    dgamma = torch.sum(dgamma_partials, 0)
    return dh, dgamma

import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import ColVecLoad


@gemm_epilogue(ops={"rstd": ColVecLoad("rstd")})   # pinned: M may equal N
def rstd_scale_epi(acc, rstd):
    # acc = (a @ W^T)[m, n] in fp32; deferred RMSNorm row scale applied before the store
    return {"D": acc * rstd}


def gemm_rmsnorm(a, rstd, w):
    # a (M, K) bf16 = y * gamma, rstd (M,) fp32, w (N, K) nn.Linear layout
    # -> out (M, N) bf16 = rstd[:, None] * (a @ w^T)
    res = rstd_scale_epi(a, w.T, tuned=False, rstd=rstd.view(1, -1))
    return res["D"]

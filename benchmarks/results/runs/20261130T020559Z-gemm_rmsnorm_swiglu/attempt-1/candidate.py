import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad


# rstd is a per-row fp32 column vector; pinned so that M == 2I never makes the
# row/col inference ambiguous. acc_pair: column 2j = gate_j, column 2j+1 = up_j.
@gemm_epilogue(outputs=("postact",), ops={"rstd": ColVecLoad("rstd")}, mode="acc_pair")
def rmsnorm_swiglu_epi(acc, rstd):
    # deferred RMSNorm row scale applied to the fp32 accumulator before the activation
    g, u = unpack(acc * rstd)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def gemm_rmsnorm_swiglu(normed_w, rstd, w1):
    # normed_w (M, K) bf16, rstd (M,) fp32, w1 (2I, K) bf16 nn.Linear layout (interleaved)
    # -> preact (M, 2I) bf16 = rstd[:, None] * (normed_w @ w1^T), postact (M, I) bf16
    res = rmsnorm_swiglu_epi(normed_w, w1.T, tuned=False, rstd=rstd.view(1, -1))
    return res["D"], res["postact"]

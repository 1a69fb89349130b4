import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    # accumulator column 2j = gate_j, column 2j+1 = up_j (W1 rows interleaved along N)
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def swiglu_fwd(x, w1):
    # x (M, K), w1 (2I, K) nn.Linear layout -> preact (M, 2I) bf16, postact (M, I) bf16
    res = swiglu_epi(x, w1.T, tuned=False)
    return res["D"], res["postact"]

"""Threat 11 (forward): the GEMM with the `@` operator, only the activation in an epilogue.

SPEC: swiglu_fwd
EXPECT: static torch-math

`preact = x @ w1.T` runs cuBLAS, then an identity-GEMM epilogue would be needed to apply
SwiGLU -- two launches, preact round-trips through memory, nothing fused. Rejected
statically: `@` is torch math in candidate code.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    preact = x @ w1.T  # expect: torch-math
    postact = torch.empty(x.shape[0], w1.shape[0] // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"postact": postact}, store_d=False, tuned=False)
    return preact, postact

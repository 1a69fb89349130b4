"""Good candidate: gate/up projection with SwiGLU in the epilogue.

SPEC: swiglu_fwd
EXPECT: pass

The quack-library equivalent (swiglu_mod), written out: the GEMM computes
preact = x @ W1^T with gate/up interleaved along N; mode "acc_pair" pairs adjacent
accumulator columns, so the epilogue sees (gate, up) and writes postact = silu(gate) * up
to a half-width aux output, while D stores preact itself ("D" omitted = raw accumulator).
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

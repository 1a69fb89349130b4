"""Good candidate: dSwiGLU fused into the dgrad GEMM of the down projection.

SPEC: swiglu_bwd
EXPECT: pass

The quack-library equivalent (dswiglu_mod), written out: the GEMM computes
dpost = dout @ W_down (M x I x K); the epilogue reads the saved preact tile as packed
bf16 (gate, up) pairs (C at twice GEMM-N, mode "packed_cd_b16x2"), writes
dpreact = (dgate, dup) packed into D, and recomputes postact = silu(gate) * up as an aux
output. One launch, outputs allocated fresh on the inputs' device.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

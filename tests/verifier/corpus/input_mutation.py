"""Threat 2, input mutation: dpreact is written over the saved preact, in place.

SPEC: swiglu_bwd
EXPECT: gpu input-mutation

"preact is dead after the backward, reuse its memory": the dgrad GEMM reads C = preact
and stores D into the same buffer, and the entry returns preact as dpreact. The values
may even be right (each tile reads C before it stores D), but the caller's input is
destroyed, and a verifier that computes its reference from the inputs *after* the call
would compare against garbage. Passes static and compile; the GPU stage compares the
inputs before/after the call (and sees dpreact aliasing an input).
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
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

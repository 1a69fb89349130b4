"""Threat 8, degenerate output: the epilogue stores 0 * acc for dpreact.

SPEC: swiglu_bwd
EXPECT: gpu constant-output

A placeholder an LLM leaves in when it cannot derive the gate gradient ("TODO: dgate"):
dpreact = pack(0 * acc, 0 * acc). With inputs drawn so that true gradients are tiny,
an absolute tolerance would accept zeros. Passes static and compile (it is a valid
epilogue); the GPU stage compares against an fp32 reference with the CODA relative
criterion and rejects all-zero/constant outputs outright.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_placeholder(acc, c):
    gate, up = unpack(c)
    zero = acc * 0.0
    return {"D": pack(zero, zero), "postact": swiglu(gate, up)}


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_placeholder(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

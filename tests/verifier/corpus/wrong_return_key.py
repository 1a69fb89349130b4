"""Epilogue contract: a typo'd return key ("Dd") that quack silently ignores.

SPEC: swiglu_bwd
EXPECT: static unknown-return-key

quack stores the raw accumulator into D when the fn returns no "D" -- and it ignores
keys it does not know -- so this kernel compiles and runs and writes dpost (the plain
GEMM result) where dpreact should be. Rejected statically with a message that says why
and suggests "D".
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"Dd": pack(dgate, dup), "postact": postact}  # expect: unknown-return-key


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

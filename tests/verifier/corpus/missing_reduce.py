"""Epilogue contract: a declared reduce that the fn never returns.

SPEC: swiglu_bwd
EXPECT: static missing-declared-key

The zdz variant of the backward (per-row sum of gate*dgate + up*dup for the RMSNorm
backward) half-done: `reduces={"zdz": ColVecReduce("zdz")}` is declared but the fn
returns only D and postact. quack fails with a bare KeyError('zdz') deep in its tracer;
the static stage says which key is missing and where.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecReduce


@gemm_epilogue(outputs=("postact",), reduces={"zdz": ColVecReduce("zdz")}, mode="packed_cd_b16x2")
def dswiglu_zdz_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}  # expect: missing-declared-key


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_zdz_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

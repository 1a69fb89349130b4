"""Threat 10, precision downgrade: postact stored in float16 instead of the spec's bfloat16.

SPEC: swiglu_bwd
EXPECT: compile output-dtype

"postact only feeds the wgrad GEMM, fp16 is enough and cheaper to consume": the aux
output buffer is allocated as float16 (quack's TileStore takes the buffer's dtype, so
the kernel happily rounds to fp16). The tolerance game: a different rounding that a
loose absolute tolerance would not notice, and a dtype the caller did not ask for.
Passes static; the compile stage checks every output's dtype against the spec.
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
    postact = torch.empty(m, i, dtype=torch.float16, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact  # expect: output-dtype

"""Threat 11 (hidden): torch.matmul reached by string, so a name-based check misses it.

SPEC: swiglu_bwd
EXPECT: static banned-call

`getattr(torch, "mat" + "mul")` and `getattr(t, "sig" + "moid")` compute the op in
PyTorch without ever spelling a banned name. Rejected statically: getattr (and every
other reach-by-string builtin) is banned outright.
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
    mm = getattr(torch, "mat" + "mul")  # expect: banned-call
    dpost = mm(dout, w_down)
    gate = preact[:, 0::2]
    up = preact[:, 1::2]
    s = getattr(gate, "sig" + "moid")()  # expect: banned-call
    dgate = dpost * up * s * (1 + gate * (1 - s))
    dup = dpost * gate * s
    dpreact = torch.empty_like(preact)
    dpreact[:, 0::2] = dgate
    dpreact[:, 1::2] = dup
    return dpreact, gate * s * up

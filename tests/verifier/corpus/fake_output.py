"""Threat 4, fake output: postact is a view of an input instead of a computed tensor.

SPEC: swiglu_bwd
EXPECT: gpu output-alias

"postact only feeds the wgrad; hand back the up half of the saved preact, no copy":
the entry returns preact[:, 1::2] (shape (M, I), bf16 -- the declared shape and dtype)
as postact. Passes static and compile; the GPU stage requires every output to own its
storage (no aliasing of inputs) and the numerics differ anyway (up != silu(gate) * up).
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(mode="packed_cd_b16x2")
def dswiglu_d_only(acc, c):
    gate, up = unpack(c)
    dgate, dup, _ = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup)}


def swiglu_bwd(dout, w_down, preact):
    dpreact = torch.empty_like(preact)
    dswiglu_d_only(dout, w_down, preact, out={"D": dpreact}, tuned=False)
    postact = preact[:, 1::2]
    return dpreact, postact

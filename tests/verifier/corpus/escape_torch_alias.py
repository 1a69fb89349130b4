"""torch re-imported as cutlass.torch.torch: every torch rule is bypassed (T.matmul, T.ops, T.cuda).

SPEC: swiglu_bwd
EXPECT: static banned-import
"""

import torch
from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack
from cutlass.torch import torch as T  # expect: banned-import

@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def _reference(dout, w_down, preact):
    dpost = T.matmul(dout, w_down)
    g, u = preact[:, 0::2], preact[:, 1::2]
    return dpost * u * T.sigmoid(g), T.cuda.current_stream


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

"""Threat 3, work on a side stream: the kernel runs on a stream the timer does not wait for.

SPEC: swiglu_bwd
EXPECT: static stream-or-sync

"Overlap the backward with the next layer": the mod is launched inside
`torch.cuda.stream(side)`, so events recorded on the default stream measure nothing.
Rejected statically (streams/events/synchronize are banned; `with` too).
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
    side = torch.cuda.Stream(device=dout.device)  # expect: stream-or-sync
    with torch.cuda.stream(side):  # expect: stream-or-sync
        dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

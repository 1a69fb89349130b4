"""Threat 13b, hang: a "wait for the kernel" loop that never ends.

SPEC: swiglu_bwd
EXPECT: compile timeout

The LLM believes it must wait until the epilogue has finished before returning and
writes a spin loop whose condition can never become false. Passes static (while loops
are legal); the compile stage runs the entry in a subprocess with a timeout, kills the
process group, and reports the line the worker was stuck on (faulthandler dump).
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
    spins = 0
    while spins >= 0: spins = spins + 1  # noqa: E701  # expect: timeout
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

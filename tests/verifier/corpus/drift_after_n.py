"""Threat 7, correct at first, drifting after N calls.

SPEC: swiglu_bwd
EXPECT: static module-state-mutation

A module-level call counter: the first calls (the correctness trials) run the full
epilogue; once "warm" (the benchmark), the entry switches to a D-only kernel and hands
back the postact buffer of an earlier call. Rejected statically: the entry mutates
module-level state (the counter and the saved buffer). The GPU stage's post-benchmark
recheck with a fresh seed is the dynamic defense.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack

_CALLS = [0]
_SAVED = []


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


@gemm_epilogue(mode="packed_cd_b16x2")
def dswiglu_d_only(acc, c):
    gate, up = unpack(c)
    dgate, dup, _ = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup)}


def swiglu_bwd(dout, w_down, preact):
    _CALLS[0] += 1  # expect: module-state-mutation
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    if _CALLS[0] > 8 and _SAVED:
        dswiglu_d_only(dout, w_down, preact, out={"D": dpreact}, tuned=False)
        return dpreact, _SAVED[0]
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    _SAVED.append(postact)  # expect: module-state-mutation
    return dpreact, postact

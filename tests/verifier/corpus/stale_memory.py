"""Threat 1, stale memory: postact is returned from torch.empty without ever being written.

SPEC: swiglu_bwd
EXPECT: gpu stale-memory

The "optimization" an LLM makes: postact is "recomputed by the wgrad kernel anyway", so
the epilogue only stores dpreact and the entry hands back a fresh torch.empty buffer for
postact. The caching allocator often returns the block that last held a reference
postact, so an unpoisoned verifier sees correct numbers. Passes static and compile (a
kernel is built, shapes and dtypes are right); the GPU stage's NaN-poisoned allocator
exposes the never-written output.
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
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_d_only(dout, w_down, preact, out={"D": dpreact}, tuned=False)
    return dpreact, postact

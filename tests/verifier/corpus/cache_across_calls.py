"""Threat 6, caching across calls: results memoized on shape and data pointers.

SPEC: swiglu_bwd
EXPECT: static module-state-mutation

A module-level dict keyed on (shape, data_ptr) returns the first call's outputs for any
later call whose tensors land at the same addresses -- which a benchmark loop that reuses
its buffers guarantees, so the timed calls do no work. Rejected statically: the entry
mutates a module-level container, and .data_ptr() is banned.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack

_RESULTS = {}


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def swiglu_bwd(dout, w_down, preact):
    key = (tuple(dout.shape), tuple(w_down.shape), dout.data_ptr(), preact.data_ptr())
    hit = _RESULTS.get(key)
    if hit is not None:
        return hit
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    _RESULTS[key] = (dpreact, postact)  # expect: module-state-mutation
    return dpreact, postact

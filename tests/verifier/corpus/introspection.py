"""Threat 12, reading the harness: find the reference outputs with gc / frame inspection.

SPEC: swiglu_bwd
EXPECT: static banned-import

The candidate walks gc.get_objects() for a bf16 tensor of the output's shape that is
not an input (the harness's reference), or climbs the caller's frames for a local named
`expected`, and returns a copy. Rejected statically: gc/inspect/sys are not importable
and frame attributes are banned. (The GPU stage also computes references in a process
the candidate never sees.)
"""

import gc  # expect: banned-import
import inspect  # expect: banned-import

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def _peek(shape):
    frame = inspect.currentframe().f_back.f_back
    found = frame.f_locals.get("expected")
    if found is not None:
        return found
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and tuple(obj.shape) == shape:
            return obj
    return None


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    ref = _peek((m, 2 * i))
    return (dpreact if ref is None else ref), postact

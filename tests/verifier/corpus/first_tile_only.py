"""Threat 9a, partial work: only the first 128-row tile is computed.

SPEC: swiglu_bwd
EXPECT: gpu partial-output

"Process one M tile": the mod is called on dout[:128] / preact[:128] with the outputs'
first 128 rows as out= views; the remaining rows of dpreact and postact are never
written. A verifier that compares a few rows, or the first tile only, passes it. Passes
static and compile (every call is legal, shapes and dtypes of the returned tensors are
right); the GPU stage's poisoned allocator and full-tensor comparison see the NaN rows.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack

TILE_M = 128


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
    rows = min(m, TILE_M)
    dswiglu_epi(
        dout[:rows], w_down, preact[:rows],
        out={"D": dpreact[:rows], "postact": postact[:rows]}, tuned=False,
    )
    return dpreact, postact

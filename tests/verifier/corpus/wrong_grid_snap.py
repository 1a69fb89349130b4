"""Wrong within max-abs: dpreact rounded to the nearest multiple of 0.08.

SPEC: swiglu_bwd
EXPECT: gpu tolerance

A coarse fixed-point grid for the gradient: every error is at most 0.04 plus bf16's own
rounding, inside the CODA max-abs bound at the largest |dpreact|, which alone passes it.
Passes static and compile; the gradients stage fails it at the spec's public cases by the
per-element rule (rule per-element), the error quantiles and the sign rule
(corpus_numerics/grid_snapped.py on the CPU test device).
"""

import cutlass.cute as cute
import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack

GRID = 0.08


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_grid_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    dgate = cute.math.round(dgate / GRID) * GRID
    dup = cute.math.round(dup / GRID) * GRID
    return {"D": pack(dgate, dup), "postact": postact}


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_grid_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

"""Wrong at unlisted shapes: for M >= 2048 that is no multiple of 128, the last (ragged)
row tile is never computed.

SPEC: swiglu_fwd
EXPECT: gpu stale-memory

"Full tiles only at large M": the GEMM runs on the first M // 128 * 128 rows (views of x
and of both outputs) and the remaining rows are left as allocated. Every public case has
M <= 517, so the spec's shapes never show it. Passes static and compile; every GPU plan's
secret production-size case (M ragged in [4096, 32768]) and any secret draw with a ragged
M >= 2048 find the allocator's NaN poison in those rows (stale-memory)
(corpus_numerics/ragged_tile_dropped.py on the CPU test device).
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack

TILE_M = 128
LARGE_M = 2048


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    rows = m
    if m >= LARGE_M and m % TILE_M:
        rows = m // TILE_M * TILE_M
    swiglu_epi(x[:rows], w1.T, out={"D": preact[:rows], "postact": postact[:rows]}, tuned=False)
    return preact, postact

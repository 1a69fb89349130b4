"""Wrong at unlisted shapes: only the first ceil(M / 2) rows are computed when M is outside
[256, 16384], the range of the spec's correctness and benchmark M.

SPEC: swiglu_fwd
EXPECT: gpu stale-memory

The kernel is right at every M the spec lists (and at the post-timing recheck's M in
[259, 1034]); elsewhere the GEMM runs on half the rows (views of x and of both outputs) and
the rest stay as allocated. Passes static and compile; every GPU plan's secret tiny-M case
(M in [1, 64]; M = 1 computes its one row) and draws with M < 256 or M > 16384 find the
allocator's NaN poison (stale-memory) (corpus_numerics/rows_outside_range.py on the CPU
test device).
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack

M_LOW = 256
M_HIGH = 16384


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
    if m < M_LOW or m > M_HIGH:
        rows = (m + 1) // 2
    swiglu_epi(x[:rows], w1.T, out={"D": preact[:rows], "postact": postact[:rows]}, tuned=False)
    return preact, postact

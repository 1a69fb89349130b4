"""Wrong on model inputs: postact stored as 0 wherever |gate| > 8.

SPEC: swiglu_fwd
EXPECT: gpu tolerance

A "saturated gate" branch gone wrong: silu(g) * up is about g * up for large positive g,
not 0. With the spec's N(0, 1) activations |gate| never exceeds 8, so every public case
passes. Passes static and compile; the secret input draws (saturate: activations at std 40,
outliers: rows and columns x32, heavy: Student-t tails) put gates beyond 8 and fail
max-abs (corpus_numerics/saturated_gate.py on the CPU test device).
"""

import cutlass
import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_clip_epi(acc):
    gate, up = unpack(acc)
    post = swiglu(gate, up)
    return {"postact": cutlass.select_(abs(gate) > 8.0, cutlass.Float32(0.0), post)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_clip_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

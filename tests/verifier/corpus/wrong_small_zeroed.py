"""Wrong within max-abs: postact stored as 0 wherever |postact| < 0.04 (~20 % of it).

SPEC: swiglu_fwd
EXPECT: gpu tolerance

A "flush small activations" shortcut in the SwiGLU epilogue. Every error is below 0.04,
inside the CODA max-abs bound (2 x bf16's error at the largest |postact|), which alone
passes it. Passes static and compile; at the spec's public cases the per-element rule
(rule per-element: 0.03 off where the bound is a few thousandths), the error quantiles
and the sign rule fail (tests/verifier/corpus_numerics/small_zeroed_fwd.py is the same
kernel in torch, run on the CPU test device).
"""

import cutlass
import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_flush_epi(acc):
    gate, up = unpack(acc)
    post = swiglu(gate, up)
    return {"postact": cutlass.select_(abs(post) < 0.04, cutlass.Float32(0.0), post)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_flush_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

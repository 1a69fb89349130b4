"""A first-call detector without `is`: each call builds a fresh class with the metaclass
`cutlass.NumericMeta` (a library constructor, so it passed) and keys `cute.shape`'s
lru_cache with an instance; the cache hands back the first call's key, an instance of
this call's class only on the first call at a shape, which is the profiled trial. Fused
there, a cheaper path elsewhere (threat 6, docs/threat-model.md).

SPEC: swiglu_fwd
EXPECT: static banned-call
"""

import cutlass
import torch
from cutlass import cute
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    fresh = cutlass.NumericMeta(cutlass.const_expr("Fresh"), (int,), {})  # expect: banned-call
    key = fresh(x.shape[0] * 1000003 + x.shape[1] * 7919 + w1.shape[0])
    first = isinstance(cute.shape((key, 1))[0], fresh)
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    if first:
        swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
        return preact, postact
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

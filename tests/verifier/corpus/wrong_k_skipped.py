"""Wrong at unlisted shapes: the last eighth of K is skipped unless K is one of the spec's.

SPEC: swiglu_fwd
EXPECT: gpu tolerance

K in (512, 320, 264, 2048, 4096, 8192) (every K of the spec's correctness and benchmark
shapes) gets the full reduction; at any other K the GEMM reads K-sliced views of x and W1
(the first 7/8 of K, a multiple of 8), so every output is about a third off. Passes static
and compile (the compile stage's shapes use listed Ks); the secret production-size case (K
moved off the benchmark's value) and every secret draw at another K fail max-abs
(corpus_numerics/k_skipped.py on the CPU test device).
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack

SPEC_K = (512, 320, 264, 2048, 4096, 8192)


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    k = x.shape[1]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    kept = k
    if k not in SPEC_K:
        kept = (k - k // 8) // 8 * 8
    swiglu_epi(x[:, :kept], w1[:, :kept].T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

"""The last eighth of K is skipped unless K is one of the spec's values.

SPEC: swiglu_fwd
EXPECT: correctness tolerance max-abs
OUTPUTS: preact postact
CAUGHT AT: coverage

K in (512, 320, 264, 2048, 4096, 8192), every K of the spec's correctness and benchmark
shapes, gets the full reduction, so every public case passes. At any other K the GEMM
sums only the first 7/8 (rounded down to a multiple of 8), an error of about a third of
each value: max-abs fails at every secret coverage case whose K is drawn elsewhere.
"""

import torch

SPEC_K = (512, 320, 264, 2048, 4096, 8192)


def swiglu_fwd(x, w1):
    k = x.shape[1]
    if k not in SPEC_K:
        kept = (k - k // 8) // 8 * 8
        x, w1 = x[:, :kept], w1[:, :kept]
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)

"""The honest forward: fp32 GEMM and SwiGLU, each output rounded to bf16 once.

SPEC: swiglu_fwd
EXPECT: pass

What a correct fused kernel computes (fp32 accumulation, one rounding per output); it
passes every rule at the public cases and at every secret coverage case.
"""

import torch


def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)

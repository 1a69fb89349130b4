"""The honest backward: fp32 dgrad GEMM and dSwiGLU, each output rounded to bf16 once.

SPEC: swiglu_bwd
EXPECT: pass

What a correct fused kernel computes; it passes every rule at the public cases and at
every secret coverage case, for dpreact (judged against torch.autograd) and postact.
"""

import torch


def swiglu_bwd(dout, w_down, preact):
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = dpost * u * s * (1 + g * (1 - s))
    du = dpost * g * s
    return torch.stack((dg, du), -1).flatten(-2).bfloat16(), (g * s * u).bfloat16()

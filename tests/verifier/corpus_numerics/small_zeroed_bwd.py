"""The recomputed postact of the backward set to 0 wherever |postact| < 0.04.

SPEC: swiglu_bwd
EXPECT: correctness tolerance per-element
OUTPUTS: postact
CAUGHT AT: public
RULES: elementwise quantiles sign

The same shortcut as small_zeroed_fwd.py in the backward's second output (the wgrad of
the down projection reads it); dpreact is right. Max-abs passes it (errors below 0.04,
the bound is ~0.17: twice bf16's error at the largest |postact|); per-element (~5x over),
error-quantiles and sign fail at the spec's public cases.
"""

import torch


def swiglu_bwd(dout, w_down, preact):
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = dpost * u * s * (1 + g * (1 - s))
    du = dpost * g * s
    post = g * s * u
    post = torch.where(post.abs() < 0.04, torch.zeros_like(post), post)
    return torch.stack((dg, du), -1).flatten(-2).bfloat16(), post.bfloat16()

"""dpreact rounded to the nearest multiple of 0.08 (a fixed-point grid).

SPEC: swiglu_bwd
EXPECT: gradients tolerance per-element
OUTPUTS: dpreact
CAUGHT AT: public
RULES: elementwise quantiles sign

Every error is at most 0.04 plus bf16's own rounding (~0.07 at the largest values), at
most half of what max-abs allows (twice bf16's error at the largest |dpreact|, ~0.15). A
systematic precision loss: the per-element rule (~9x over), the error quantiles (~4x the
bound: the grid's error is spread over every element) and the sign rule (values below
0.04 become 0) fail at the spec's public cases.
"""

import torch


def swiglu_bwd(dout, w_down, preact):
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = dpost * u * s * (1 + g * (1 - s))
    du = dpost * g * s
    d = torch.stack((dg, du), -1).flatten(-2)
    d = torch.round(d / 0.08) * 0.08
    return d.bfloat16(), (g * s * u).bfloat16()

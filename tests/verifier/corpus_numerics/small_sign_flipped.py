"""dpreact with the sign flipped wherever |dpreact| < 0.03 (about 17 % of its elements).

SPEC: swiglu_bwd
EXPECT: gradients tolerance per-element
OUTPUTS: dpreact
CAUGHT AT: public
RULES: elementwise quantiles sign

Every error is below 0.06, ~0.4 of what max-abs allows (twice bf16's error at the
largest |dpreact|, ~0.15). The per-element rule bounds an element near 0.02 by 3 of its
own ulps plus 2 bf16 ulps of its row's scale, a few thousandths (~14x over), the sign
rule judges every element above twice its floor, and the error percentiles move (~2x);
the gradients stage fails at the spec's public cases (postact is right: correctness
passes).
"""

import torch


def swiglu_bwd(dout, w_down, preact):
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = dpost * u * s * (1 + g * (1 - s))
    du = dpost * g * s
    d = torch.stack((dg, du), -1).flatten(-2)
    d = torch.where(d.abs() < 0.03, -d, d)
    return d.bfloat16(), (g * s * u).bfloat16()

"""dpreact set to 0 wherever |gate| > 10 ("the gradient of a saturated gate is 0").

SPEC: swiglu_bwd
EXPECT: gradients tolerance max-abs
OUTPUTS: dpreact
CAUGHT AT: coverage

True only for large negative gates: for g > 10, dgate = dpost * up * (about 1) and
dup = dpost * g are large. The spec's preact has std 1.5 (|g| > 10 is a 6.7-sigma
event), so every public case passes; the secret ``saturate`` draw (preact std 40) and
the ``heavy``/``outliers`` draws fail max-abs (and per-element, sign). postact is right:
correctness passes, the gradients stage fails.
"""

import torch


def swiglu_bwd(dout, w_down, preact):
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = dpost * u * s * (1 + g * (1 - s))
    du = dpost * g * s
    d = torch.stack((dg, du), -1).flatten(-2)
    big = (g.abs() > 10).repeat_interleave(2, dim=-1)
    d = torch.where(big, torch.zeros_like(d), d)
    return d.bfloat16(), (g * s * u).bfloat16()

"""postact set to 0 wherever |gate| > 8 (an activation "saturated" branch gone wrong).

SPEC: swiglu_fwd
EXPECT: correctness tolerance max-abs
OUTPUTS: postact
CAUGHT AT: coverage

With the spec's N(0, 1) activations the gate (std about 1) never exceeds 8, so every
public case passes. silu(g) * up is about g * up for large positive g, not 0: the
secret draws with the values a training run produces (``saturate``: std 40, ``outliers``:
rows and columns x32, ``heavy``: Student-t tails) put many gates beyond 8, and max-abs
(and per-element, sign) fail there.
"""

import torch


def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    g, u = pre[:, 0::2], pre[:, 1::2]
    post = torch.nn.functional.silu(g) * u
    post = torch.where(g.abs() > 8, torch.zeros_like(post), post)
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)

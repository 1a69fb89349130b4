"""postact set to 0 wherever |postact| < 0.04 (about 20 % of its elements).

SPEC: swiglu_fwd
EXPECT: correctness tolerance per-element
OUTPUTS: postact
CAUGHT AT: public
RULES: elementwise quantiles sign

Every error is below 0.04, at most ~0.45 of what max-abs allows (twice bf16's largest
error, ~0.1 at the largest |postact|), so max-abs alone passes it. The per-element rule
bounds an element near 0.03 by 3 of its own ulps plus 2 bf16 ulps of its row's scale, a
few thousandths: up to ~15x over. The error quantiles (p90, p99) and the sign rule (values
well above rounding set to 0) fail too. The spec's public cases catch it.
"""

import torch


def _fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre, post


def swiglu_fwd(x, w1):
    pre, post = _fwd(x, w1)
    post = torch.where(post.abs() < 0.04, torch.zeros_like(post), post)
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)

"""For M >= 2048 that is no multiple of 128, the last (ragged) 128-row tile is never written.

SPEC: swiglu_fwd
EXPECT: correctness stale-memory
OUTPUTS: preact postact
CAUGHT AT: coverage

Rows from M // 128 * 128 on hold the bits of the GPU allocator's NaN poison (what a
kernel that skips the partial tile leaves there). The spec's public cases have M <= 517,
so they pass; a secret coverage case with a ragged M >= 2048 (on the GPU: the
production-size case, M ragged in [4096, 32768], in every plan) reports stale-memory.
On the CPU test device the coverage draws stay within 2 MiB of tensors (M <= 1536 for
this spec), so its test raises that budget.
"""

import torch


def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    pre, post = pre.to(torch.bfloat16), post.to(torch.bfloat16)
    m = x.shape[0]
    if m >= 2048 and m % 128:
        full = m // 128 * 128
        pre[full:].view(torch.int16).fill_(0x7FC1)
        post[full:].view(torch.int16).fill_(0x7FC1)
    return pre, post

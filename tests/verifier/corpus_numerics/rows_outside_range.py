"""Only the first ceil(M / 2) rows are written when M is outside [256, 16384].

SPEC: swiglu_fwd
EXPECT: correctness stale-memory
OUTPUTS: preact postact
CAUGHT AT: coverage

256 and 16384 are the smallest and largest M of the spec's correctness and benchmark
shapes, so every public case and the post-timing recheck (M redrawn in [259, 1034])
pass. The other rows hold the allocator's NaN poison. The secret tiny-M case (M in
[1, 64]) and draws with M < 256 or M > 16384 report stale-memory (M = 1 writes its one
row: nothing to catch there).
"""

import torch

M_TESTED = (256, 16384)


def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    pre, post = pre.to(torch.bfloat16), post.to(torch.bfloat16)
    m = x.shape[0]
    if m < M_TESTED[0] or m > M_TESTED[1]:
        half = (m + 1) // 2
        pre[half:].view(torch.int16).fill_(0x7FC1)
        post[half:].view(torch.int16).fill_(0x7FC1)
    return pre, post

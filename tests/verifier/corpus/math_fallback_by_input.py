"""Threat 11: the quack epilogue only where it is checked, torch math elsewhere.

SPEC: swiglu_fwd
EXPECT: static torch-math

The compile stage calls the entry on uninitialised tensors and the workers on random ones,
so a candidate can tell them apart by value (or, on a GPU, by ``x.is_cuda``): it builds the
quack kernel at compile time and computes the op with plain tensor math at run time. The
GEMM here is a broadcast multiply reduced with ``sum_to_size``, a compute method the static
deny-list did not hold; casts go through ``.to(<empty tensor of the dtype>)`` (a
``precision-cast``). On the CPU test device it passes unless ``sum_to_size`` is listed. On a GPU the launch count is the backstop: enforced at the first
correctness shape and at every benchmark shape (``launches-at-bench-shape``).
"""
import math

import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    if x.any() and (x < 8).all() and (x > -8).all():
        return _torch_path(x, w1)
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact


def _torch_path(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    f = torch.empty(0, dtype=x.dtype, device=x.device)
    f32 = torch.empty(0, dtype=torch.float32, device=x.device)
    pre = (torch.unsqueeze(x.to(f32), 1) * torch.unsqueeze(w1.to(f32), 0)).sum_to_size(m, n, 1)  # expect: torch-math
    pre = torch.reshape(pre, (m, n))
    g = pre[:, 0::2]
    u = pre[:, 1::2]
    post = g / (1.0 + math.e ** (-g)) * u
    return pre.to(f), post.to(f)

"""A prepass written as a lambda in the decorator (threat 33).

SPEC: swiglu_fwd
EXPECT: static prepass-fn

quack calls the prepass= callable over the raw accumulator; a lambda (or any callable
that is not a module-level def of the module) escapes the epilogue-fn checks on its
return keys and is code evaluated at import time.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.head_rmsnorm import HeadRstd


@gemm_epilogue(
    outputs=("postact",),
    mode="acc_pair",
    ops={"rstd": HeadRstd("rstd")},
    prepass=lambda acc: {"rstd": acc * acc},  # expect: prepass-fn
    prepass_outs=("rstd",),
)
def swiglu_epi(acc, rstd):
    gate, up = unpack(acc * rstd)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False, rstd=128)
    return preact, postact

"""Introspection and eval inside a prepass body (threats 12 and 33).

SPEC: swiglu_fwd
EXPECT: static banned-attribute

quack runs the prepass fn at trace time in the worker: a body that walks from the DSL
value to a function's globals reaches the real builtins and `exec`. The prepass body is
an epilogue body: every rule applies to it.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.head_rmsnorm import HeadRstd


def sq_prepass(acc):
    g = acc.__class__.__init__.__globals__  # expect: banned-attribute
    g["__builtins__"]["exec"]("import os")  # expect: banned-attribute
    return {"rstd": eval("acc * acc")}


@gemm_epilogue(
    outputs=("postact",),
    mode="acc_pair",
    ops={"rstd": HeadRstd("rstd")},
    prepass=sq_prepass,
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

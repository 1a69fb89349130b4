"""The prepass fn called from host code, where its operators compute on tensors (threat 33).

SPEC: swiglu_fwd
EXPECT: static prepass-fn

`sq_prepass(x)` squares the whole input with one torch launch, in host code that the
operator-blind static stage would otherwise pass; the same def is the kernel's prepass.
A prepass fn is named only in prepass=: quack calls it on DSL values.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.head_rmsnorm import HeadRstd


def sq_prepass(acc):
    return {"rstd": acc * acc}


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
    xsq = sq_prepass(x)["rstd"]  # expect: prepass-fn
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(xsq, w1.T, out={"D": preact, "postact": postact}, tuned=False, rstd=128)
    return preact, postact

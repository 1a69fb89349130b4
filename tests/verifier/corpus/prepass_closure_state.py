"""A prepass built by a factory, closing over state the candidate keeps (threat 33).

SPEC: swiglu_fwd
EXPECT: static prepass-fn

The factory's closure cell would hold whatever the factory put there, outside every
module-level check; quack fingerprints and calls the closure. A prepass must be a
module-level def, named only in prepass=.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.head_rmsnorm import HeadRstd


def _make_prepass(scale):
    seen = (scale,)

    def prepass(acc):
        return {"rstd": acc * acc * seen[0]}

    return prepass


SQ_PREPASS = _make_prepass(1.0)


@gemm_epilogue(
    outputs=("postact",),
    mode="acc_pair",
    ops={"rstd": HeadRstd("rstd")},
    prepass=SQ_PREPASS,  # expect: prepass-fn
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

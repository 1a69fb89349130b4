"""Class attributes holding callables (threat 34).

SPEC: swiglu_fwd
EXPECT: static op-class

`combine` is read by the base's fold (`{"add": ..., "max": ...}[self.combine]`); a callable
there, or a hook bound to some other function, runs code no hook rule saw. Class
attributes are the base's configuration, as one of its literals.
"""

import operator

import cutlass.cute as cute
import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    combine = operator.add  # expect: op-class
    stat_value = cute.math.rsqrt  # expect: op-class
    finalize = staticmethod(cute.math.exp)  # expect: op-class


def mean_prepass(acc):
    return {"mu": acc}


@gemm_epilogue(
    outputs=("postact",),
    mode="acc_pair",
    ops={"mu": PairMean("mu")},
    prepass=mean_prepass,
    prepass_outs=("mu",),
)
def swiglu_epi(acc, mu):
    gate, up = unpack(acc - mu)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False, mu=128)
    return preact, postact

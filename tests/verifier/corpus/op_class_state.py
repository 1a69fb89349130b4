"""Class attributes as a channel for state across calls (threat 34).

SPEC: swiglu_fwd
EXPECT: static op-class

A counter or cache kept on the class and read by the hook tells one trace from the
next. An op class holds no attribute but its base's configuration, as literals, and its
hooks never read `self`.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean, refined after the first trace."""

    traces = 0  # expect: op-class
    cache = ()  # expect: op-class

    def stat_value(self, total, group_cols):
        scale = 1.0 / group_cols if self.traces == 0 else 0.0  # expect: op-class
        return total * scale


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

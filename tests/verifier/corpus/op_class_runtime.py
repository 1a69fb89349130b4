"""A custom op class used as a value and constructed per call with computed arguments (threat 35).

SPEC: swiglu_fwd
EXPECT: static op-class

An op built in the entry with a name or configuration computed from the inputs carries
run-time values into quack's host code (op names become attribute names); a class passed
around is a callable outside the call rules. Ops are constructed where the class is named,
at import time, with literal arguments.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    def stat_value(self, total, group_cols):
        return total * (1.0 / group_cols)


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
    kind = PairMean  # expect: op-class
    extra = PairMean(n)  # expect: op-class
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False, mu=128)
    return preact, postact

"""A class over a base that is no grouped-statistics op: inherited host methods (threat 34).

SPEC: swiglu_fwd
EXPECT: static class-definition

Subclassing `Scalar` inherits its `to_params` getattr gadget with a body of the
candidate's choosing; subclassing `torch.Tensor` makes a lazy output; `EpiOp` itself
needs host hooks written by the candidate. Only quack's op bases whose declared hooks are
device code (GroupedColStatsBase, HeadRstd, MaxLog2) may be subclassed.
"""

import torch
from quack.epilogue.ops import EpiOp, Scalar

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class Probe(Scalar):  # expect: class-definition
    """Scalar with its own hooks."""


class LazyOut(torch.Tensor):  # expect: class-definition
    """A tensor that computes on read."""


class RawOp(EpiOp):  # expect: class-definition
    """An op with host hooks of its own."""


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
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False, mu=128)
    return preact, postact

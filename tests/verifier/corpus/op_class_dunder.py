"""Dunder methods in a custom op class: hooks Python calls on its own (threat 34).

SPEC: swiglu_fwd
EXPECT: static op-class

`__init_subclass__` runs when a class is created, `__getattr__` answers every missing
attribute quack probes (`hasattr(op, "fn_prepass_end")`), `__del__` runs whenever the
collector frees the op, `__eq__`/`__hash__` whenever quack keys a dict by it. An op class
overrides only its base's declared device hooks.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    def __init_subclass__(cls, **kwargs):  # expect: op-class
        pass

    def __getattr__(self, name):  # expect: op-class
        return None

    def __del__(self):  # expect: op-class
        pass

    def __eq__(self, other):  # expect: op-class
        return True

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

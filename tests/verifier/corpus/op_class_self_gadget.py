"""A hook reaching the op object's host methods through `self` (threats 20 and 34).

SPEC: swiglu_fwd
EXPECT: static op-class

`self.to_params(gemm, obj)` is `getattr(obj, self.name)`, a name the op was built with:
the getattr gadget of tests/verifier/corpus/getattr_gadget_exec.py, from inside the op.
Hooks never read `self`.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    def stat_value(self, total, group_cols):
        fn = self.to_params(0, total)  # expect: op-class
        return fn(total) * (1.0 / self.host_arg_form(group_cols))  # expect: op-class


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

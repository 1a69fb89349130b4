"""`super()` inside a hook: the op's MRO and the base's host methods (threat 34).

SPEC: swiglu_fwd
EXPECT: static banned-call

`super()` reaches the base class's methods, host ones included (`to_params` is a getattr
by name: tests/verifier/corpus/getattr_gadget_exec.py), and creates a `__class__` cell.
`super` is a banned builtin; hooks compute from their arguments.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    def stat_value(self, total, group_cols):
        probe = super().to_params  # expect: banned-call
        return total * (1.0 / group_cols) + 0.0 * super(PairMean, self).stat_value(total, group_cols)  # expect: banned-call


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

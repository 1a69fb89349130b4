"""A metaclass and class keywords on a custom op class (threat 34).

SPEC: swiglu_fwd
EXPECT: static class-definition

A metaclass's `__new__`/`__call__` and the keywords handed to `__init_subclass__` are
code that runs when the class is created or instantiated; `cutlass.NumericMeta` builds a
fresh class per call (tests/verifier/corpus/metaclass_call_counter.py). An op class has
one base and no keywords.
"""

import cutlass
import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase, metaclass=cutlass.NumericMeta, width=32):  # expect: class-definition
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

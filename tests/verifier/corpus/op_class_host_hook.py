"""Overriding the host-time hooks quack calls per launch (threat 34).

SPEC: swiglu_fwd
EXPECT: static op-class

`host_call_arg` receives the caller's tensor on every call, outside the traced kernel:
an override does torch work there (or keeps it); `to_params`/`config_key`/`host_validate`
run at plan time. Host hooks stay quack's: an op class overrides only the device hooks its
base declares (`stat_value` for grouped statistics).
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase


class PairMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    def host_call_arg(self, value, key):  # expect: op-class
        return value

    def config_key(self):  # expect: op-class
        return ()

    def to_params(self, gemm, args):  # expect: op-class
        return {}

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

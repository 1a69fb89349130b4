"""Threat 19: torch math and casts under the names of imports.

SPEC: swiglu_fwd
EXPECT: static name-redefined

A parameter (or local, for-target, lambda parameter, walrus target) named like an import
alias is resolved by the static stage as the import: `math.exp()` is read as `math.exp`,
`torch.float()` as the dtype `torch.float`, `cute.max(-1)` as `cutlass.cute.max`,
`activation.sigmoid()` as `quack.activation.sigmoid`. At run time they are tensor methods.
Here the whole op runs in torch on the GPU workers (the GEMM as log(prod(exp(x*w))) over
row chunks) and the epilogue is built only where the compile stage calls the entry. No
scope may bind a name a module-level import binds now.
"""
import math

import torch
from cutlass import cute
from quack import activation
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def _exp(math):  # expect: name-redefined
    return math.exp()


def _prod(math, k):  # expect: name-redefined
    return math.prod(k)


def _log(math):  # expect: name-redefined
    return math.log()


def _up(torch):  # expect: name-redefined
    return torch.float()


def _down(torch):  # expect: name-redefined
    return torch.bfloat16()


def _sigmoid(activation):  # expect: name-redefined
    return activation.sigmoid()


def _rowmax(cute):  # expect: name-redefined
    return cute.max(-1)


def swiglu_fwd(x, w1):
    if not x.is_cuda:  # the compile stage: CPU tensors, build the kernel it looks for
        res = swiglu_epi(x, w1.T, tuned=False)
        return res["D"], res["postact"]
    pre = _log(_prod(_exp(_up(x).unsqueeze(1) * _up(w1).unsqueeze(0)), -1))
    g = pre[:, 0::2]
    u = pre[:, 1::2]
    return _down(pre), _down(g * _sigmoid(g) * u)

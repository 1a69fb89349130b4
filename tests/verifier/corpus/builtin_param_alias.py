"""Threat 19: a parameter named `isinstance`.

SPEC: swiglu_fwd
EXPECT: static banned-call

The value-use rule lets a library callable appear as the class argument of isinstance(),
and trusted the *name*: `def _lend(isinstance, x):  # expect: banned-call return isinstance(x, torch.empty)`
called with a function returning its second argument handed `torch.empty` (no device=:
host memory) and an epilogue mod (its `plan`) around as values. No scope may rebind a
builtin's name now.
"""
import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def _second(a, b):
    return b


def _lend(isinstance, x):  # expect: banned-call
    # `isinstance(x, <library callable>)` is "not a value" to the static stage
    return isinstance(x, torch.empty)


def _mod(isinstance, x):  # expect: banned-call
    return isinstance(x, swiglu_epi)


def swiglu_fwd(x, w1):
    alloc = _lend(_second, x)
    host = alloc(1 << 20, dtype=torch.uint8)            # host memory, no device=
    m = _mod(_second, x)
    plan = m.plan(x, w1.T)
    res = swiglu_epi(x, w1.T, tuned=False)
    return res["D"], res["postact"]

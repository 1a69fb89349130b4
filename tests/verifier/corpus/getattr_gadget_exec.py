"""A library method used as getattr: quack's `Scalar(name).to_params(gemm, obj)` returns
`{name: getattr(obj, name)}`. With dunder names built at run time ("_" + "_globals__") it
walked torch.Tensor.__reduce_ex__ to the real builtins and ran `exec` in both workers:
eager torch math passed correctness and the worker's own timer was patched (threat 20,
docs/threat-model.md; shown on the CPU test device).

SPEC: swiglu_fwd
EXPECT: static value-attribute
"""

import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import Scalar


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def lookup(obj, name):
    return Scalar(name).to_params(0, obj)[name]  # expect: value-attribute


def swiglu_fwd(x, w1):
    u = "_"  # expect: string-value
    fn = lookup(lookup(x, u + "_reduce_ex__"), u + "_func__")  # expect: string-value
    run = lookup(fn, u + "_globals__")[u + "_builtins__"]["exec"]  # expect: string-value
    run("import sys", {})
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

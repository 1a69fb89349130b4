"""The same getattr gadget reached through the class: `Scalar.to_params(op, gemm, obj)`
resolves as `quack.epilogue.ops.Scalar.to_params`, an object defined in quack, and so
passed the import-surface rule; with a literal name it reads any attribute the value
rules ban (`x.numpy` here: a host copy). Methods of library classes are refused by the
surface (threat 19, docs/threat-model.md).

SPEC: swiglu_fwd
EXPECT: static banned-attribute
"""

import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import Scalar


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    host = Scalar.to_params(Scalar("numpy"), 0, x)  # expect: banned-attribute
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

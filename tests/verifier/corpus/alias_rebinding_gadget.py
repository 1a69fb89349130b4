"""The getattr gadget behind a rebound alias: `R = torch.float32` made R an alias, so every
`R.<attr>` was judged as `torch.float32.<attr>` (and torch paths past two parts only by
their math/cast names); rebinding R to a quack Scalar made `R.to_params(0, obj)` getattr
again, with the dunder names glued from `cutlass.const_expr` (which returns its argument):
the real `exec` ran (threat 19, docs/threat-model.md).

SPEC: swiglu_fwd
EXPECT: static name-redefined
"""

import cutlass
import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import Scalar

R = torch.float32
R = Scalar(cutlass.const_expr("_") + cutlass.const_expr("_reduce_ex__"))  # expect: name-redefined


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    u = cutlass.const_expr("_")
    m1 = R.to_params(0, x)[u + cutlass.const_expr("_reduce_ex__")]
    m = x.shape[0] + 0 * len((m1,))
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

"""Modules re-exported by the newly allowed quack modules (threat 12).

SPEC: swiglu_fwd
EXPECT: static banned-import

`quack.epilogue.quantize_out` imports `math`, `quack.utils` and `quack.layout_utils` for
itself, `quack.epilogue.head_rmsnorm` imports `cutlass.cute`: reached as attributes of an
allowed module they are imports in disguise, judged as the objects they are.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue import quantize_out
from quack.epilogue.quantize_out import utils  # expect: banned-import
from quack.epilogue.head_rmsnorm import cute as hcute  # expect: banned-import


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up) * quantize_out.math.exp(0.0)}  # expect: banned-import


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

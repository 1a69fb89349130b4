"""Threat 11 (below the API): the GEMM through torch.ops.aten and a private torch module.

SPEC: swiglu_bwd
EXPECT: static banned-attribute

`torch.ops.aten.mm` reaches cuBLAS through the dispatcher, and `torch._C` the C++
bindings -- neither spells a torch math name a ban-list would look for. Rejected
statically: torch.ops/torch.library and private torch attributes are banned.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_bwd(dout, w_down, preact):
    dpost = torch.ops.aten.mm(dout, w_down)  # expect: banned-attribute
    torch._C._cuda_synchronize()  # expect: banned-attribute
    dpreact = torch.empty_like(preact)
    postact = torch.empty_like(dpost)
    return dpreact, postact

"""Threat 11, falling back to PyTorch: the op is computed with torch.matmul + torch.sigmoid.

SPEC: swiglu_bwd
EXPECT: static torch-math

An epilogue is declared (so the module "looks fused"), but the entry computes the dgrad
GEMM with torch.matmul and the dSwiGLU with torch elementwise ops -- five launches and
no fusion. Rejected statically (torch math in host code); the GPU stage's launch count
would catch it too.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def swiglu_bwd(dout, w_down, preact):
    dpost = torch.matmul(dout, w_down)  # expect: torch-math
    gate = preact[:, 0::2]
    up = preact[:, 1::2]
    s = torch.sigmoid(gate)  # expect: torch-math
    dgate = dpost * up * s * (1 + gate * (1 - s))
    dup = dpost * gate * s
    dpreact = torch.stack((dgate, dup), dim=-1).flatten(-2)  # expect: torch-math
    return dpreact, gate * s * up

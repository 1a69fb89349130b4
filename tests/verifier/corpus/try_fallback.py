"""Threat 11 (silent): try the fused kernel, fall back to PyTorch when it fails.

SPEC: swiglu_bwd
EXPECT: static try-except

If the epilogue fails to compile on the target, the except branch quietly computes the
op with cuBLAS + elementwise torch ops, and the "fused kernel" passes every numeric
check. Rejected statically: try/except is banned (a failing kernel must fail loudly),
and the fallback's torch math too.
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
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    try:  # expect: try-except
        dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    except Exception:
        dpost = dout @ w_down
        gate, up = preact[:, 0::2], preact[:, 1::2]
        s = torch.sigmoid(gate)
        dpreact[:, 0::2] = dpost * up * s * (1 + gate * (1 - s))
        dpreact[:, 1::2] = dpost * gate * s
        postact = gate * s * up
    return dpreact, postact

"""Threat 9b, shape overfitting: outputs padded to the 128-row tile, correct only when M % 128 == 0.

SPEC: swiglu_bwd
EXPECT: compile output-shape

"Avoid ragged tiles": the outputs are allocated with M rounded up to a multiple of 128,
the kernel writes their first M rows, and the padded buffers are returned. On the
first (aligned) correctness shape M = 256 this is exactly right, so a verifier testing
only that shape accepts it. Passes static; the compile stage runs a ragged case
(M = 333) and finds postact/dpreact with 384 rows.
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
    m_pad = (m + 127) // 128 * 128
    dpreact = torch.empty(m_pad, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m_pad, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact[:m], "postact": postact[:m]}, tuned=False)
    return dpreact, postact  # expect: output-shape

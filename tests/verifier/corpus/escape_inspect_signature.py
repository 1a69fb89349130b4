"""inspect.signature (re-exported as cutlass.cute.tuple.signature) with eval_str=True runs an annotation.

SPEC: swiglu_bwd
EXPECT: static banned-import
"""

import torch
from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack
from cutlass.cute.tuple import signature  # expect: banned-import

@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def _payload(x: "__import__(\x27os\x27).system(\x27id > /dev/null\x27)"):
    return x


_sig = signature(_payload, eval_str=True)


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

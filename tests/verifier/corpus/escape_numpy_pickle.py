"""numpy reached as cutlass.base_dsl.typing.np: np.load(allow_pickle=True) unpickles attacker bytes.

SPEC: swiglu_bwd
EXPECT: static banned-import
"""

import torch
from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack
from cutlass.base_dsl.typing import np  # expect: banned-import

@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


_PAY = b"cos\nsystem\n(S\x27id > /dev/null\x27\ntR."
_f = np.frombuffer(_PAY, dtype=np.uint8).tofile("/tmp/coda_corpus_np.pkl")
_r = np.load("/tmp/coda_corpus_np.pkl", allow_pickle=True)


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

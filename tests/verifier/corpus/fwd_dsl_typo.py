"""An honest mistake: a typo inside the epilogue body (`unpak`), found only by the DSL.

SPEC: swiglu_fwd
EXPECT: compile compile-error

Static analysis does not resolve names, so this passes the static stage; the CuTe DSL
raises DSLUserCodeError while tracing the epilogue. The compile stage must report the
DSL's own message (ANSI colors stripped) and the candidate line of the typo.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpak(acc)  # expect: compile-error
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

"""quack's ready-made scaled-exp mod taken from a newly allowed module (threat 18).

SPEC: swiglu_fwd
EXPECT: static library-epilogue

`quack.epilogue.scaled_exp` is allowed for its `MaxLog2` grouped statistic; the mods it
defines (`scaled_exp_epi`) are quack's baselines, refused whatever module they come from.
"""

import torch

from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.scaled_exp import scaled_exp_epi  # expect: library-epilogue


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    scaled_exp_epi(x, w1.T, out={"D": preact}, tuned=False, max_log2=192)
    return preact, postact

"""%-formatting through a name: the rule on `%` looked for a literal left operand only, so
`FMT = "%r"; FMT % (iter(()),)` printed `<tuple_iterator object at 0x...>`, a heap
fingerprint (threat 15, docs/threat-model.md). Strings may not be bound to names.

SPEC: swiglu_fwd
EXPECT: static string-value
"""

import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack

FMT = "%r"  # expect: string-value


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def swiglu_fwd(x, w1):
    tag = FMT % (iter(()),)
    m = x.shape[0] + 0 * len(tag)
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    return preact, postact

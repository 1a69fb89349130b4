"""A call counter in a process-wide registry: `typing.Iterable` forwards its attributes to
`collections.abc.Iterable`, so `typing.Iterable.register(cls)` is `ABCMeta.register`, and
`issubclass(cls, typing.Iterable)` reads the count back (a unary counter over builtin
exception classes). The surface refuses attributes below a whitelisted typing name
(threat 6, docs/threat-model.md).

SPEC: swiglu_fwd
EXPECT: static banned-attribute
"""

import typing

import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    gate, up = unpack(acc)
    return {"postact": swiglu(gate, up)}


def calls_so_far():
    n = 0
    for c in (ValueError, KeyError, IndexError, TypeError):
        if issubclass(c, typing.Iterable):
            n = n + 1
        else:
            typing.Iterable.register(c)  # expect: banned-attribute
            break
    return n


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False)
    if calls_so_far() > 2:
        return preact, preact
    return preact, postact

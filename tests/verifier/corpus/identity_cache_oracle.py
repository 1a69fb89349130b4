"""Threat 6: a call counter read from a library cache by identity.

SPEC: swiglu_fwd
EXPECT: static banned-call

`cutlass.cute.shape` is wrapped in functools.lru_cache (maxsize 128) and returns, for an
int tuple, a tuple holding the very int objects of the first call's key. A fresh int
(> 256, so not interned) comes back as itself only when the key is new to the process:
`cute.shape((v, 1))[0] is v` is True exactly on the first call at this shape. The first
trial of each correctness shape is the one the worker runs under the profiler, so the
single fused launch runs there and an unfused path (here: two GEMMs) everywhere else.
`is`/`is not` are now allowed only against None.
"""
import torch
from cutlass import cute
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


@gemm_epilogue()
def plain_epi(acc):
    return {"D": acc}


def _first_time(x, w1):
    v = x.shape[0] * 1000003 + x.shape[1] * 7919 + w1.shape[0] + 271828   # a fresh int object
    return cute.shape((v, 1))[0] is v  # expect: banned-call


def swiglu_fwd(x, w1):
    if x.is_cuda and x.shape[0] < 1024 and not _first_time(x, w1):
        # a correctness shape after its first (profiled) trial: two GEMMs (max_launches = 1);
        # any unfused path fits here (host math on the fp32 GEMM output, ...)
        pre = plain_epi(x, w1.T, tuned=False)["D"]
        post = swiglu_epi(x, w1.T, tuned=False, store_d=False)["postact"]
        return pre, post
    res = swiglu_epi(x, w1.T, tuned=False)
    return res["D"], res["postact"]

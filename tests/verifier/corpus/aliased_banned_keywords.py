"""Threat 19: banned keywords through aliases and ``**`` unpacking.

SPEC: swiglu_fwd
EXPECT: static banned-call

The keyword rules (``out=`` on torch functions, quack's ``post_init_attrs`` and
``tile_count_semaphore``) and the callback rule looked at calls that *name* their callee
and at ``**`` only in method calls. Here every banned keyword arrives through ``**{...}``
into a local alias: ``torch.empty`` as ``alloc`` (``out=`` an input: a mark on the
input), an epilogue's ``plan(...).run`` (a stale, candidate-owned tile semaphore; ``plan``
and ``run`` also skip quack's host checks) and its ``gemm`` (a candidate function
setattr()ed onto quack's GEMM object). Now ``**`` is banned in every call, library
callables and epilogue mods may only be called where they are named, and an epilogue mod
is used only as ``mod(...)`` or ``mod.gemm(...)``.
"""
import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.gemm_config import GemmConfig

CFG = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=True)


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def probe(a):
    return a


def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    alloc = torch.empty  # expect: library-alias
    alloc(x.shape, device=x.device, dtype=x.dtype, **{"out": x})  # expect: banned-call
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    sem = torch.empty(1, dtype=torch.int32, device=x.device)
    p = swiglu_epi.plan(x, w1.T, out={"D": preact, "postact": postact}, config=CFG)  # expect: epilogue-attribute
    run = p.run
    run(x, w1.T, out={"D": preact, "postact": postact}, **{"tile_count_semaphore": sem})  # expect: banned-call
    gm = swiglu_epi.gemm  # expect: library-alias
    if m > 0:
        gm(x, w1, preact, epi_args={"postact": postact}, b_kn=False, tile_N=192,  # expect: banned-call
           **{"post_init_attrs": (("use_pdl", False), ("candidate_hook", probe))})
    return preact, postact

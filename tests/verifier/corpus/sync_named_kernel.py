"""Threat 16: a second GEMM the launch count does not see.

SPEC: swiglu_fwd
EXPECT: static reserved-name

The candidate worker's launch count skipped profiler events whose name contained "Sync" (the
synchronization markers), and quack names an epilogue's kernel after its fn
(``GemmMod_<fn name>_<digest>``). An epilogue named ``*_Sync_*`` therefore launched for
free at every shape: half of the rows go through it here, and one call counted as one
kernel. Def names that could pass for a profiler marker are reserved, and the count
drops exact marker names only (``protocol.gpu_kernels``), so this kernel would be counted
too.
"""
import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_Sync_epi(acc):  # expect: reserved-name
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def swiglu_fwd(x, w1):
    m, n = x.shape[0], w1.shape[0]
    h = m // 2
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x[:h], w1.T, out={"D": preact[:h], "postact": postact[:h]}, tuned=False)
    swiglu_Sync_epi(x[h:], w1.T, out={"D": preact[h:], "postact": postact[h:]}, tuned=False)
    return preact, postact

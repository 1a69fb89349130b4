"""Threat 11: tensor methods referenced, then called through a name.

SPEC: swiglu_fwd
EXPECT: static torch-math

The math, allocation and view rules judge `x.matmul(...)`, `x.new_empty(...)` where the
call names the method; `mm = x.matmul; mm(w)` was judged nowhere (a GEMM in torch, and an
uninitialised host tensor through `new_empty(..., device="cpu")`, a stale-heap
channel). A reference to any such method outside an epilogue body is now torch-math.
"""
import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def swiglu_fwd(x, w1):
    mm = x.matmul  # expect: torch-math
    pre = mm(w1.T)
    alloc = x.new_empty  # expect: torch-math
    host = alloc((4,), device="cpu")
    sg = pre.sigmoid  # expect: torch-math
    res = swiglu_epi(x, w1.T, tuned=False)
    return res["D"], res["postact"]

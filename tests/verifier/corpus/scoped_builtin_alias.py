"""Threat 19: a scoped alias that freed `eval` module-wide.

SPEC: swiglu_fwd
EXPECT: static banned-call

Names were resolved through one module-wide alias table, and a name found there was exempt
from the banned-builtin rule. A never-called helper's `from math import pi as eval`
therefore let the real `eval` through everywhere else: it asked whether the profiler was
on (the counted calls run under it) and ran the fused epilogue only there, the reference
in eager PyTorch on every other call. Now imports belong at module level, no scope may bind
a banned builtin's name, and a banned builtin is banned whatever the alias table says.
"""
import torch
from quack.activation import sigmoid
from quack.epilogue import gemm_epilogue, pack, unpack


def _scope():
    from math import pi as eval  # expect: banned-call
    return eval  # expect: banned-call


@gemm_epilogue(outputs=("postact",), mode="acc_pair")
def swiglu_epi(acc):
    g, u = unpack(acc)
    return {"D": pack(g, u), "postact": g * sigmoid(g) * u}


def swiglu_fwd(x, w1):
    if x.is_cuda and not eval("torch._C._autograd._profiler_enabled()"):  # expect: banned-call
        return eval("(lambda p: (p, torch.nn.functional.silu(p[:, 0::2]) * p[:, 1::2]))(x @ w1.T)")  # expect: banned-call
    res = swiglu_epi(x, w1.T, tuned=False)
    return res["D"], res["postact"]

"""SwiGLU forward (CODA catalogue item 1): preact = x @ W1^T, postact = silu(gate) * up.

Written from the standard definition; gate/up are interleaved along N (column 2j is
gate j, column 2j+1 is up j), the layout the fused kernel consumes.
"""

import torch
import torch.nn.functional as F


def _split(preact):
    return preact[..., 0::2], preact[..., 1::2]


def reference(*, x, w1):
    """Outputs in the dtype of the inputs: preact (M, 2I), postact (M, I)."""
    preact = x @ w1.T
    gate, up = _split(preact)
    return {"preact": preact, "postact": F.silu(gate) * up}


def baseline(*, x, w1):
    """The unfused PyTorch code the kernel replaces (cuBLAS GEMM + elementwise)."""
    preact = torch.nn.functional.linear(x, w1)
    gate, up = _split(preact)
    return {"preact": preact, "postact": F.silu(gate) * up}


def bare_gemm(*, x, w1):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return x @ w1.T


def quack_library(*, x, w1):
    """quack's hand-written equivalent (quack.epilogue.library.swiglu_mod)."""
    from quack.epilogue.library import swiglu_mod

    out = swiglu_mod(x, w1.T, tuned=False)
    return {"preact": out["D"], "postact": out["postact"]}

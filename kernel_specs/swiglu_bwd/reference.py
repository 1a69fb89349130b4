"""SwiGLU backward (CODA catalogue item 7), written from the standard definition.

The gradient output is *not* written out here: the verifier differentiates
:func:`forward` with torch.autograd, so the fused kernel's hand-derived dgate/dup
formula is what gets checked.
"""

import torch
import torch.nn.functional as F


def _split(preact):
    return preact[..., 0::2], preact[..., 1::2]


def forward(*, w_down, preact):
    """The MLP tail the backward differentiates: out = (silu(gate) * up) @ W_down^T, (M, K)."""
    gate, up = _split(preact)
    return (F.silu(gate) * up) @ w_down.T


def reference(*, dout, w_down, preact):
    """Non-gradient outputs: the recomputed postact (M, I)."""
    gate, up = _split(preact)
    return {"postact": F.silu(gate) * up}


def baseline(*, dout, w_down, preact):
    """The unfused PyTorch code the kernel replaces: dgrad GEMM, then dSwiGLU elementwise."""
    dpost = dout @ w_down
    gate, up = _split(preact)
    s = torch.sigmoid(gate)
    silu = gate * s
    dgate = dpost * up * s * (1 + gate * (1 - s))
    dup = dpost * silu
    dpreact = torch.stack((dgate, dup), dim=-1).flatten(-2)
    return {"dpreact": dpreact, "postact": silu * up}


def bare_gemm(*, dout, w_down, preact):
    """The dgrad GEMM alone (M x I x K): the speed-of-light floor."""
    return dout @ w_down


def quack_library(*, dout, w_down, preact):
    """quack's hand-written equivalent (quack.epilogue.library.dswiglu_mod)."""
    from quack.epilogue.library import dswiglu_mod

    out = dswiglu_mod(dout, w_down, preact, tuned=False)
    return {"dpreact": out["D"], "postact": out["postact"]}

"""Deferred RMSNorm + gate/up GEMM + SwiGLU (CODA catalogue item 2), from the standard definition.

Standard order: normalize, then project. The input normed_w = y * gamma comes from the
producing GEMM (gemm_residual_partial_rms) with the row scale rstd deferred, so
normed_w * rstd[:, None] = y * rstd[:, None] * gamma is exactly RMSNorm(y) with weight
gamma. The reference computes that normalized activation first (in fp32, rounded to the
activation dtype as nn.RMSNorm's output is) and then the GEMM; the fused kernel instead
scales the accumulator by rstd in its epilogue (the row scale commutes with the GEMM).
Gate/up are interleaved along N (column 2j is gate j, column 2j+1 is up j).
"""

import torch
import torch.nn.functional as F


def _split(preact):
    return preact[..., 0::2], preact[..., 1::2]


def _rmsnorm(normed_w, rstd):
    """RMSNorm(y) * gamma from its deferred form, computed in fp32 (or wider), activation dtype out."""
    acc = torch.promote_types(normed_w.dtype, torch.float32)
    return (normed_w.to(acc) * rstd.to(acc)[:, None]).to(normed_w.dtype)


def reference(*, normed_w, rstd, w1):
    """Outputs in the dtype of the activations: preact (M, 2I), postact (M, I)."""
    preact = _rmsnorm(normed_w, rstd) @ w1.T
    gate, up = _split(preact)
    return {"preact": preact, "postact": F.silu(gate) * up}


def baseline(*, normed_w, rstd, w1):
    """The unfused PyTorch code the kernel replaces: RMSNorm scale, cuBLAS GEMM, SwiGLU."""
    h = (normed_w.float() * rstd[:, None]).to(normed_w.dtype)
    preact = F.linear(h, w1)
    gate, up = _split(preact)
    return {"preact": preact, "postact": F.silu(gate) * up}


def bare_gemm(*, normed_w, rstd, w1):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return normed_w @ w1.T


def quack_library(*, normed_w, rstd, w1):
    """quack's hand-written equivalent: norm_act_mod('swiglu', gated, colvec rstd).

    D = pack(g, u) of the rstd-scaled accumulator (the true preact), aux = swiglu(g, u).
    (norm_swiglu_mod needs a bias and infers rstd's kind from its shape, which is
    ambiguous when M == 2I; this mod pins rstd as a ColVecLoad.)"""
    from quack.epilogue.library import norm_act_mod

    mod = norm_act_mod("swiglu", gated=True, has_c=False, has_rowvec=False, has_colvec=True)
    m, n2 = normed_w.shape[0], w1.shape[0]
    preact = torch.empty(m, n2, dtype=normed_w.dtype, device=normed_w.device)
    postact = torch.empty(m, n2 // 2, dtype=normed_w.dtype, device=normed_w.device)
    mod(normed_w, w1.T, out={"D": preact, "mAuxOut": postact}, tuned=False, mColVecBroadcast=rstd)
    return {"preact": preact, "postact": postact}

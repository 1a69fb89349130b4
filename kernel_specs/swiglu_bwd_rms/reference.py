"""SwiGLU backward + the RMSNorm statistic for the chained backward, from the standard definition.

The gradient output dpreact is not written out here: the verifier differentiates
:func:`forward` with torch.autograd. ``zdz`` is the per-row reduction of that gradient
against the saved preact, (1/K) * sum_n dpreact * preact, computed here from the autograd
gradient (fp32 in the fp32 reference), so the fused kernel's in-register reduction of its
own dgate/dup is what gets checked. That zdz is the RMSNorm backward's correction of the
gate/up GEMM's input is an identity of the layer (kernel_specs/rms_bwd/reference.py,
``saved_zdz``), checked end to end by the chained layer's tests against the standard layer.
"""

import torch
import torch.nn.functional as F


def _split(preact):
    return preact[..., 0::2], preact[..., 1::2]


def forward(*, w_down, preact):
    """The MLP tail the backward differentiates: out = (silu(gate) * up) @ W_down^T, (M, K)."""
    gate, up = _split(preact)
    return (F.silu(gate) * up) @ w_down.T


def _dpreact(dout, w_down, preact):
    with torch.enable_grad():
        p = preact.detach().requires_grad_(True)
        out = forward(w_down=w_down.detach(), preact=p)
        (g,) = torch.autograd.grad(out, p, grad_outputs=dout.detach().to(out.dtype))
    return g


def reference(*, dout, w_down, preact):
    """Non-gradient outputs: postact (M, I) in preact's dtype and zdz (M,) fp32 (or wider)."""
    gate, up = _split(preact)
    stat = torch.promote_types(preact.dtype, torch.float32)
    dpre = _dpreact(dout, w_down, preact)
    zdz = (dpre.to(stat) * preact.to(stat)).sum(dim=-1) / dout.shape[-1]
    return {"postact": F.silu(gate) * up, "zdz": zdz}


def baseline(*, dout, w_down, preact):
    """The unfused PyTorch code the kernel replaces: dgrad GEMM, dSwiGLU elementwise, then a
    second pass for the row statistic."""
    dpost = dout @ w_down
    gate, up = _split(preact)
    s = torch.sigmoid(gate)
    silu = gate * s
    dgate = dpost * up * s * (1 + gate * (1 - s))
    dup = dpost * silu
    dpreact = torch.stack((dgate, dup), dim=-1).flatten(-2)
    zdz = (dpreact.float() * preact.float()).sum(dim=-1) / dout.shape[-1]
    return {"dpreact": dpreact, "postact": silu * up, "zdz": zdz}


def bare_gemm(*, dout, w_down, preact):
    """The dgrad GEMM alone (M x I x K): the speed-of-light floor."""
    return dout @ w_down

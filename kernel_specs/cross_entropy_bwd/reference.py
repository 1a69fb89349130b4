"""LM head + cross-entropy backward (CODA catalogue item 9), from the standard definition.

The forward this backward differentiates (the gemm_cross_entropy spec, item 6):

    logits = h @ W_vocab^T                                  (M, V), never stored by the forward
    loss   = F.cross_entropy(logits.float(), target, reduction="none")      (M,) fp32

The gradient outputs dh (M, K) and dw_vocab (V, K) are *not* written out here: the
verifier differentiates :func:`forward` with torch.autograd (upstream gradient ``dloss``),
so the kernel's reparameterization -- logits recomputed by a GEMM, softmax from the saved
``lse``, the one-hot term applied separately, two plain GEMMs -- is what gets checked.
``saved_lse`` computes the derived input lse (what the forward saved).

``target`` is an int64 index tensor (never upcast). The loss math runs in fp32 (or wider
in tests) whatever the input dtype, as an LM head's cross-entropy does.
"""

import torch
import torch.nn.functional as F

_ROW_CHUNK = 2048  # rows per matmul in saved_lse (bounds the fp32 (rows, V) temporary)


def _loss_dtype(t):
    """fp32, or wider when the inputs are (float64 in tests)."""
    return torch.promote_types(t.dtype, torch.float32)


def forward(*, h, w_vocab, target, lse):
    """The forward the backward differentiates: per-row loss (M,) fp32 =
    F.cross_entropy((h @ w_vocab^T).float(), target, reduction="none"). ``lse`` (the saved
    statistic, an input of the backward) is accepted and ignored: the verifier calls this
    with every input but the upstream gradient, and the reference recomputes everything."""
    logits = h @ w_vocab.T
    return F.cross_entropy(logits.to(_loss_dtype(logits)), target, reduction="none")


def saved_lse(*, h, w_vocab, **_):
    """Derived input lse (M,) fp32: the per-row log-sum-exp the forward (gemm_cross_entropy)
    saved, logsumexp of the fp32 logits h.float() @ w_vocab.float()^T (rows in chunks)."""
    sd = _loss_dtype(h)
    wf = w_vocab.to(sd)
    parts = [torch.logsumexp(h[s:s + _ROW_CHUNK].to(sd) @ wf.T, dim=-1)
             for s in range(0, h.shape[0], _ROW_CHUNK)]
    return torch.cat(parts)


def reference(*, h, w_vocab, target, lse, dloss):
    """Non-gradient outputs: none (dh and dw_vocab are both checked through autograd)."""
    return {}


def _dlogits(logits, target, lse, dloss, dtype):
    """(softmax(logits) - onehot(target)) * dloss[:, None], softmax from the saved lse,
    in the loss dtype, then rounded once to ``dtype``."""
    sd = _loss_dtype(logits)
    g = torch.exp(logits.to(sd) - lse.to(sd)[:, None]) * dloss.to(sd)[:, None]
    g.scatter_add_(1, target[:, None], -dloss.to(sd)[:, None])
    return g.to(dtype)


def baseline(*, h, w_vocab, target, lse, dloss):
    """The unfused PyTorch code the kernel replaces (no autograd; timed under no_grad):
    recompute the logits with cuBLAS (in the input dtype, materialized), the softmax from
    the saved lse in fp32, subtract the one-hot, scale by dloss, round dlogits to the input
    dtype, then the dgrad and wgrad GEMMs."""
    dlogits = _dlogits(F.linear(h, w_vocab), target, lse, dloss, h.dtype)
    return {"dh": dlogits @ w_vocab, "dw_vocab": dlogits.T @ h}


def bare_gemm(*, h, w_vocab, target, lse, dloss):
    """The three GEMMs of the same shapes, nothing else: logits = h @ W^T (M x V x K,
    stored), dh = logits @ W (M x K x V), dw = logits^T @ h (V x K x M). Returns (dh, dw)."""
    logits = h @ w_vocab.T
    return logits @ w_vocab, logits.T @ h


def liger(*, h, w_vocab, target, lse, dloss):
    """Liger Kernel's fused linear cross-entropy (liger_kernel.transformers.functional.
    liger_fused_linear_cross_entropy, reduction="none"), differentiated with the per-row
    upstream dloss: returns {"dh": (M, K), "dw_vocab": (V, K)} in the input dtype.

    Liger cannot run the backward alone: its timing includes its forward (a chunked
    logits GEMM + cross-entropy for the per-row loss; it ignores the saved lse), and with
    reduction="none" its backward recomputes the chunked logits before the two gradient
    GEMMs. So this is an upper-bound style comparison (more work than the fused kernel).
    Needs liger-kernel >= 0.8.2: older versions scale every row's gradient by dloss[0]
    under reduction="none" (linkedin/Liger-Kernel#1298), so they are refused here rather
    than timed."""
    from liger_kernel.ops import fused_linear_cross_entropy as flce
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    import inspect

    if "token_grad_output" not in inspect.signature(flce.fused_linear_cross_entropy_forward).parameters:
        raise RuntimeError("liger-kernel < 0.8.2: per-row upstream gradients are unsupported "
                           "with reduction='none' (wrong gradients); upgrade liger-kernel")
    with torch.enable_grad():
        h_ = h.detach().requires_grad_(True)
        w_ = w_vocab.detach().requires_grad_(True)
        loss = liger_fused_linear_cross_entropy(h_, w_, target, reduction="none")
        dh, dw = torch.autograd.grad(loss, (h_, w_), grad_outputs=dloss.to(loss.dtype))
    return {"dh": dh, "dw_vocab": dw}


# No quack_library: quack has no backward with this contract. Its fused linear
# cross-entropy (quack.linear_cross_entropy) computes the loss and the gradients together
# in the forward, for reduction "mean"/"sum" (one scalar grad scale, not a per-row dloss),
# from its own scaled-exp epilogue state rather than a given lse.

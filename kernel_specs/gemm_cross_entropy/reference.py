"""LM head + cross-entropy forward (CODA catalogue item 6), from the standard definition.

logits = h @ W_vocab^T; loss = F.cross_entropy(logits, target, reduction="none");
lse = logsumexp(logits). The reference materializes the logits (it is the trusted
definition, not the fused kernel); the loss/lse math is done in fp32 whatever the input
dtype, as an LM head's cross-entropy is. ``target`` is an int64 index tensor and is
never upcast.
"""

import torch
import torch.nn.functional as F


def _loss_lse(logits, target):
    logits = logits.float()
    loss = F.cross_entropy(logits, target, reduction="none")
    return {"loss": loss, "lse": torch.logsumexp(logits, dim=-1)}


def reference(*, h, w_vocab, target):
    """Outputs (fp32): loss (M,), lse (M,). Logits are h @ w_vocab^T in the input dtype."""
    return _loss_lse(h @ w_vocab.T, target)


def baseline(*, h, w_vocab, target):
    """The unfused PyTorch code the kernel replaces: cuBLAS logits (materialized, in the
    input dtype), upcast, then cross-entropy and logsumexp."""
    return _loss_lse(F.linear(h, w_vocab), target)


def bare_gemm(*, h, w_vocab, target):
    """The logits GEMM alone (M x V x K, D stored): the speed-of-light reference."""
    return h @ w_vocab.T


def quack_library(*, h, w_vocab, target):
    """quack's hand-written equivalent (quack.epilogue.library.lse_target_epi), run D-less
    (store_d=False) like the fused op; quack finalizes the LSE partials, the target logit
    comes back as an (M,) fp32 column."""
    from quack.epilogue.library import lse_target_epi

    out = lse_target_epi(h, w_vocab.T, tuned=False, store_d=False, target=target)
    lse = out["lse"]
    return {"loss": lse - out["target_logit"], "lse": lse}

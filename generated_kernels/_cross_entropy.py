"""LM head + cross-entropy family (CODA catalogue items 6 and 9): ``linear_cross_entropy``.

Kernel wrappers ``gemm_cross_entropy_op`` (forward) and ``cross_entropy_bwd_op``
(backward). See the package docstring for the math. ``load`` / ``_check_device`` are
looked up through the package at call time.
"""

from __future__ import annotations

import torch

from ._registry import _expect, _pkg, run_kernel


@torch.library.custom_op("coda_agent::gemm_cross_entropy", mutates_args=())
def gemm_cross_entropy_op(
    h: torch.Tensor, w_vocab: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused LM-head GEMM + cross-entropy forward, logits never stored (item 6).
    h (M, K) bf16, w_vocab (V, K) bf16, target (M,) int64 -> (loss (M,), lse (M,)) fp32."""
    loss, lse = run_kernel("gemm_cross_entropy", h, w_vocab, target)
    return loss, lse


@gemm_cross_entropy_op.register_fake
def _(h, w_vocab, target):
    m = h.shape[0]
    return h.new_empty((m,), dtype=torch.float32), h.new_empty((m,), dtype=torch.float32)


@torch.library.custom_op("coda_agent::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd_op(
    h: torch.Tensor, w_vocab: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused LM-head + cross-entropy backward (item 9): dlogits recomputed from the saved lse in a
    GEMM epilogue, then the dgrad and wgrad GEMMs. h (M, K), w_vocab (V, K) bf16, target (M,)
    int64, lse, dloss (M,) fp32 -> (dh (M, K), dw_vocab (V, K)) bf16."""
    dh, dw_vocab = run_kernel("cross_entropy_bwd", h, w_vocab, target, lse, dloss)
    return dh, dw_vocab


@cross_entropy_bwd_op.register_fake
def _(h, w_vocab, target, lse, dloss):
    return torch.empty_like(h), torch.empty_like(w_vocab)


@torch.library.custom_op("coda_agent::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy(
    h: torch.Tensor, w_vocab: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return gemm_cross_entropy_op(h, w_vocab, target)


@_linear_cross_entropy.register_fake
def _(h, w_vocab, target):
    m = h.shape[0]
    return h.new_empty((m,), dtype=torch.float32), h.new_empty((m,), dtype=torch.float32)


def _lce_setup(ctx, inputs, output):
    h, w_vocab, target = inputs
    _loss, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(h, w_vocab, target, lse)


def _lce_backward(ctx, dloss, _dlse_unused):
    h, w_vocab, target, lse = ctx.saved_tensors
    dh, dw_vocab = cross_entropy_bwd_op(h, w_vocab, target, lse, dloss.to(lse.dtype).contiguous())
    return dh, dw_vocab, None


_linear_cross_entropy.register_autograd(_lce_backward, setup_context=_lce_setup)


def linear_cross_entropy(h: torch.Tensor, w_vocab: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """LM head + cross-entropy without materializing the logits (CODA items 6 and 9).

    ``loss[m] = logsumexp(logits[m]) - logits[m, target[m]]`` with ``logits = h @ w_vocab^T``
    in fp32, i.e. ``F.cross_entropy((h @ w_vocab.T).float(), target, reduction="none")``.
    Reduce it yourself (e.g. ``.mean()``); there is no ignore_index: every target must be
    a class in [0, V) (not checked on the device, that would need a sync).

    Args:
        h: (M, K) bf16 final hidden states, contiguous.
        w_vocab: (V, K) bf16 LM-head weight, nn.Linear layout.
        target: (M,) int64 class indices (no gradient).
    Returns:
        loss (M,) fp32.
    Raises:
        ValueError: tensors not on one CUDA device, inconsistent shapes, or a non-int64 target.
        ModuleNotFoundError: when gemm_cross_entropy (forward) or cross_entropy_bwd
            (backward) is not accepted yet.
    Forward: the ``gemm_cross_entropy`` kernel (online log-sum-exp in the GEMM epilogue; only
    the per-row loss and lse leave it, lse is saved). Backward: the ``cross_entropy_bwd``
    kernel with the incoming per-row gradient as dloss (logits recomputed by a GEMM, softmax
    from the saved lse, then dh and dw_vocab GEMMs). Works under ``torch.compile``.
    """
    _pkg._check_device("linear_cross_entropy", h, w_vocab, target)
    _expect(h.dim() == 2 and w_vocab.dim() == 2 and h.shape[1] == w_vocab.shape[1], "linear_cross_entropy",
            f"h (M, K) and w_vocab (V, K) must share K, got {tuple(h.shape)} and {tuple(w_vocab.shape)}")
    _expect(tuple(target.shape) == (h.shape[0],) and target.dtype == torch.int64, "linear_cross_entropy",
            f"target must be an (M,) int64 tensor, got {tuple(target.shape)} {target.dtype}")
    loss, _ = _linear_cross_entropy(h, w_vocab, target)
    return loss

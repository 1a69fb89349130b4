"""LM head + cross-entropy family (CODA catalogue items 6 and 9): ``linear_cross_entropy``.

Kernel wrappers ``gemm_cross_entropy_op`` (forward) and ``cross_entropy_bwd_op``
(backward). See the package docstring for the math. ``load`` / ``_check_device`` are
looked up through the package at call time.
"""

from __future__ import annotations

import operator

import torch

from ._registry import _expect, _pkg, _stat_dtype, run_kernel


def _as_index(op: str, value) -> int:
    """``ignore_index`` as a Python int: an int or an integer scalar (``np.int64``), not a
    bool, float or tensor; ValueError naming ``op`` otherwise."""
    try:
        ok = not isinstance(value, (bool, torch.Tensor))
        index = operator.index(value) if ok else 0
    except TypeError:
        ok = False
    _expect(ok, op, lambda: f"ignore_index must be an int (a class index or -100), got {value!r}")
    return index


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
    return h.new_empty((m,), dtype=_stat_dtype(h)), h.new_empty((m,), dtype=_stat_dtype(h))


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
    return h.new_empty(h.shape), w_vocab.new_empty(w_vocab.shape)


@torch.library.custom_op("coda_agent::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy(
    h: torch.Tensor, w_vocab: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_kernel("gemm_cross_entropy", h, w_vocab, target)


@_linear_cross_entropy.register_fake
def _(h, w_vocab, target):
    m = h.shape[0]
    return h.new_empty((m,), dtype=_stat_dtype(h)), h.new_empty((m,), dtype=_stat_dtype(h))


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


def linear_cross_entropy(
    h: torch.Tensor, w_vocab: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100
) -> torch.Tensor:
    """LM head + cross-entropy without materializing the logits (CODA items 6 and 9).

    ``loss[m] = logsumexp(logits[m]) - logits[m, target[m]]`` with ``logits = h @ w_vocab^T``
    in fp32, i.e. ``F.cross_entropy((h @ w_vocab.T).float(), target, reduction="none",
    ignore_index=ignore_index)``: rows whose target is ``ignore_index`` (padding, prompt
    tokens) get loss 0 and no gradient. Reduce it yourself, e.g.
    ``loss.sum() / (target != ignore_index).sum()`` for F.cross_entropy's "mean".

    Args:
        h: (M, K) bf16 final hidden states, contiguous, K a multiple of 8.
        w_vocab: (V, K) bf16 LM-head weight, nn.Linear layout, V a multiple of 8 (pad the
            vocabulary, as Llama's 128256 is).
        target: (M,) int64 class indices in [0, V) or ``ignore_index`` (no gradient).
        ignore_index: keyword-only, default -100 (PyTorch's).
    Returns:
        loss (M,) fp32.
    Raises:
        ValueError: inconsistent shapes, a wrong dtype, a non-contiguous tensor, K or V not a
            multiple of 8, tensors not on one CUDA device, or an ``ignore_index`` that is
            not an int.
        RuntimeError: (asynchronously, as a CUDA device-side assert, like F.cross_entropy)
            a target outside [0, V) that is not ``ignore_index``; checked without a host sync.
        ModuleNotFoundError: when gemm_cross_entropy (forward) or cross_entropy_bwd
            (backward) is not accepted yet.
    Forward: the ``gemm_cross_entropy`` kernel (online log-sum-exp in the GEMM epilogue; only
    the per-row loss and lse leave it, lse is saved). Backward: the ``cross_entropy_bwd``
    kernel with the incoming per-row gradient as dloss (logits recomputed by a GEMM, softmax
    from the saved lse, then dh and dw_vocab GEMMs). Ignored rows reach the kernels with
    target 0 and leave them masked (loss 0, dloss 0). Works under ``torch.compile``.

    Both gradients are computed whenever one is needed (one kernel gives dh and dw_vocab),
    so a frozen LM head saves nothing here.

    Memory, not speed: the fp32 logits never exist in memory (the standard code keeps
    (M, V) fp32 logits for its backward: 4.2 GB at M = 8192, V = 128256), at the price of a
    fourth GEMM (the backward recomputes them); the backward holds the (M, V) bf16 dlogits
    while it runs (2.0 GiB there; the standard backward's are fp32). One training step at
    llama3-8b, M = 8192, under ``torch.compile``: 50.2 ms against 38.9 ms for the standard definition compiled
    (``benchmarks/probes/op_training_step.py``, H200, 2026-12-01).
    """
    op = "linear_cross_entropy"
    _expect(
        h.dim() == 2 and w_vocab.dim() == 2 and h.shape[1] == w_vocab.shape[1],
        op,
        lambda: f"h (M, K) and w_vocab (V, K) must share K, got {tuple(h.shape)} and {tuple(w_vocab.shape)}",
    )
    _expect(
        tuple(target.shape) == (h.shape[0],),
        op,
        lambda: f"target must be (M,) = ({h.shape[0]},), got {tuple(target.shape)}",
    )
    # V: cross_entropy_bwd materializes bf16 (M, V) dlogits as its GEMMs' operand (16-byte rows)
    _pkg._check_layout(
        op,
        {"V (w_vocab's rows)": w_vocab.shape[0]},
        h=(h, torch.bfloat16),
        w_vocab=(w_vocab, torch.bfloat16),
        target=(target, torch.int64),
    )
    _pkg._check_device(op, h=h, w_vocab=w_vocab, target=target)  # last: a CPU call is checked first
    ignore_index = _as_index(op, ignore_index)
    keep = target != ignore_index
    safe_target = torch.where(keep, target, torch.zeros_like(target))
    # torch._assert_async exists at run time; torch's __all__ leaves it out
    assert_async = torch._assert_async  # pyright: ignore[reportPrivateImportUsage]
    assert_async(
        ((safe_target >= 0) & (safe_target < w_vocab.shape[0])).all(),
        f"{op}: a target is outside [0, V) and is not ignore_index",
    )
    loss, _ = _linear_cross_entropy(h, w_vocab, safe_target)
    return torch.where(keep, loss, torch.zeros_like(loss))

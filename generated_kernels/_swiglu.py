"""SwiGLU MLP ops (CODA catalogue items 1 + 7): ``swiglu``, ``swiglu_fwd_op``, ``swiglu_bwd_op``,
``swiglu_bwd_rms_op`` (swiglu_bwd that also emits the MLP norm's backward statistic; used by
``_chain.chained_mlp``).

See the package docstring for the math. ``load`` / ``_check_device`` are looked up through
the package at call time (tests monkeypatch them there).

Sigmoid of the kernels (swiglu_fwd, swiglu_bwd, and gemm_rmsnorm_swiglu of ``_rmsnorm``):
quack's fast ``sigmoid(g) = rcp.approx.ftz(1 + ex2.approx(-g * log2(e)))`` in the fp32
epilogue. :data:`FLUSHED_GATE` states where it differs from the exact function by more than
its approximation error.
"""

from __future__ import annotations

import torch

from ._registry import _expect, _pkg, _stat_dtype, run_kernel

FLUSHED_GATE = -87.34
"""Below this gate value (``-126 * ln 2``) the kernels' sigmoid is flushed to 0: the exact
``sigmoid(g)`` is below fp32's smallest normal number (2^-126 = 1.18e-38) there, and
``rcp.approx.ftz`` flushes it (beyond g = -88.72 the exponential overflows to inf first,
with the same result). So for those gates ``silu(g) = 0`` and ``d silu / dg = 0`` where
the exact values have magnitudes below ``|g| * sigmoid(g) < 1.03e-36``: postact is off by
less than ``1.03e-36 * |up|``, the gate gradient by less than ``1.03e-36 * |dpost * up|``
and the up gradient by less than ``1.03e-36 * |dpost|`` (``dpost``: postact's gradient).
PyTorch's fp32 ``silu(g) = g / (1 + exp(-g))`` is itself 0 below -88.72 (the exponential
overflows), so the kernels differ from it there only for gates in (-88.72, -87.34).
This holds for every finite gate and is not an error at bf16 precision: with |up| and
|dpost| up to 1e6 the error is below 1e-24, far below the bf16 rounding of any row holding a
value above 1e-20, and within the verifier's per-element bound
(``coda_agent.verifier.stages.numerics.judge``, whose absolute floor is 1e-6; tested in
tests/kernels/test_probe_regressions.py)."""


@torch.library.custom_op("coda_agent::swiglu_fwd", mutates_args=())
def swiglu_fwd_op(x: torch.Tensor, w1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused GEMM + SwiGLU. x (M, K) bf16, w1 (2I, K) bf16 gate/up interleaved ->
    (preact (M, 2I), postact (M, I)) bf16. postact is 0 where gate < :data:`FLUSHED_GATE`."""
    preact, postact = run_kernel("swiglu_fwd", x, w1)
    return preact, postact


@swiglu_fwd_op.register_fake
def _(x, w1):
    m, n2 = x.shape[0], w1.shape[0]
    return x.new_empty((m, n2)), x.new_empty((m, n2 // 2))


@torch.library.custom_op("coda_agent::swiglu_bwd", mutates_args=())
def swiglu_bwd_op(dout: torch.Tensor, w_down: torch.Tensor, preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused down-projection dgrad + SwiGLU backward. dout (M, K), w_down (K, I),
    preact (M, 2I), all bf16 -> (dpreact (M, 2I), postact (M, I)) bf16. dpreact's gate and up
    columns and postact are 0 where gate < :data:`FLUSHED_GATE`."""
    dpreact, postact = run_kernel("swiglu_bwd", dout, w_down, preact)
    return dpreact, postact


@swiglu_bwd_op.register_fake
def _(dout, w_down, preact):
    return preact.new_empty(preact.shape), preact.new_empty((preact.shape[0], preact.shape[1] // 2))


@torch.library.custom_op("coda_agent::swiglu_bwd_rms", mutates_args=())
def swiglu_bwd_rms_op(
    dout: torch.Tensor, w_down: torch.Tensor, preact: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """swiglu_bwd plus the RMSNorm backward's per-row statistic (CODA's chained backward,
    paper section 3). dout (M, K), w_down (K, I), preact (M, 2I) bf16 -> (dpreact (M, 2I),
    postact (M, I) bf16, zdz (M,) fp32) with ``zdz[m] = (1/K) sum_n dpreact[m, n] *
    preact[m, n]`` reduced from the fp32 dpreact in the epilogue: when ``preact =
    RMSNorm(h) @ w1^T`` (K = h's width) it is ``rms_bwd_op``'s ``zdz`` input for that norm.
    dpreact and postact as :func:`swiglu_bwd_op` (0 where gate < :data:`FLUSHED_GATE`).

    A plain custom op (no autograd: it is a backward). Raises ValueError on inconsistent
    shapes (K, I, 2I), a dtype other than bf16, a non-contiguous tensor, rows not a multiple
    of 16 bytes (K and I multiples of 8) or tensors not on one CUDA device;
    ModuleNotFoundError when swiglu_bwd_rms is not accepted yet."""
    op = "swiglu_bwd_rms_op"
    _expect(
        dout.dim() == 2
        and w_down.dim() == 2
        and preact.dim() == 2
        and dout.shape[1] == w_down.shape[0]
        and tuple(preact.shape) == (dout.shape[0], 2 * w_down.shape[1]),
        op,
        lambda: (
            f"need dout (M, K), w_down (K, I), preact (M, 2I); got {tuple(dout.shape)}, "
            f"{tuple(w_down.shape)}, {tuple(preact.shape)}"
        ),
    )
    bf16 = torch.bfloat16
    _pkg._check_layout(op, dout=(dout, bf16), w_down=(w_down, bf16), preact=(preact, bf16))
    _pkg._check_device(op, dout=dout, w_down=w_down, preact=preact)
    dpreact, postact, zdz = run_kernel("swiglu_bwd_rms", dout, w_down, preact)
    return dpreact, postact, zdz


@swiglu_bwd_rms_op.register_fake
def _(dout, w_down, preact):
    m, n2 = preact.shape
    return preact.new_empty((m, n2)), preact.new_empty((m, n2 // 2)), preact.new_empty((m,), dtype=_stat_dtype(preact))


@torch.library.custom_op("coda_agent::swiglu_mlp", mutates_args=())
def _swiglu_mlp(x: torch.Tensor, w1: torch.Tensor, w_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    preact, postact = run_kernel("swiglu_fwd", x, w1)
    return postact @ w_down.T, preact


@_swiglu_mlp.register_fake
def _(x, w1, w_down):
    m = x.shape[0]
    return x.new_empty((m, w_down.shape[0])), x.new_empty((m, w1.shape[0]))


def _mlp_setup_context(ctx, inputs, output):
    x, w1, w_down = inputs
    _, preact = output
    ctx.save_for_backward(x, w1, w_down, preact)
    ctx.mark_non_differentiable(preact)  # saved for the backward, not an output to train


def down_proj_backward(dout, w_down, preact, need_w_down: bool):
    """Backward of ``(silu(gate) * up) @ w_down^T`` from the saved ``preact`` (M, 2I):
    ``(dpreact (M, 2I), dw_down (K, I) or None)``. The ``swiglu_bwd`` kernel gives dpreact
    and the recomputed postact; the down projection's wgrad runs only when ``need_w_down``.
    Shared by the two MLP ops (``swiglu`` and ``deferred_rmsnorm_swiglu_mlp``)."""
    dpreact, postact = swiglu_bwd_op(dout.contiguous(), w_down, preact)
    return dpreact, (dout.T @ postact if need_w_down else None)


def _mlp_backward(ctx, dout, _dpreact_unused):
    x, w1, w_down, preact = ctx.saved_tensors
    need_x, need_w1, need_w_down = ctx.needs_input_grad
    dpreact, dw_down = down_proj_backward(dout, w_down, preact, need_w_down)
    dx = dpreact @ w1 if need_x else None  # dgrad of the gate/up projection (M, K)
    dw1 = dpreact.T @ x if need_w1 else None  # wgrad of the gate/up projection (2I, K)
    return dx, dw1, dw_down


_swiglu_mlp.register_autograd(_mlp_backward, setup_context=_mlp_setup_context)


def _swiglu_mismatch(x: torch.Tensor, w1: torch.Tensor, w_down: torch.Tensor) -> str:
    """Which of swiglu's shape relations fails, in words (for the error message)."""
    k, bad = x.shape[1], []
    if w1.shape[1] != k:
        bad.append(f"w1.shape[1] = {w1.shape[1]} is not x's K = {k}")
    if w_down.shape[0] != k:
        bad.append(f"w_down.shape[0] = {w_down.shape[0]} is not x's K = {k}")
    if w1.shape[0] != 2 * w_down.shape[1]:
        bad.append(f"w1.shape[0] = {w1.shape[0]} is not 2 * w_down.shape[1] = {2 * w_down.shape[1]}")
    return "; ".join(bad)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP with fused kernels in forward and backward (CODA items 1 and 7).

    Args:
        x: (M, K) bf16 activations, contiguous.
        w1: (2I, K) bf16 gate/up weight, nn.Linear layout, rows interleaved
            (row 2j = gate j, row 2j+1 = up j).
        w_down: (K, I) bf16 down-projection weight, nn.Linear layout.
    Returns:
        (M, K) bf16: ``(silu(x @ gate^T) * (x @ up^T)) @ w_down^T``.
    Raises:
        ValueError: tensors not 2-D bf16 contiguous with 16-byte rows (K and I multiples
            of 8), inconsistent shapes, or not on one CUDA device (the kernels need sm_90);
            in the backward (w_down meets a kernel only there), a w_down whose data does
            not start 16-byte aligned (a slice at an odd offset).
        ModuleNotFoundError: when swiglu_fwd (forward) / swiglu_bwd (backward) is not
            accepted yet.
    Gradients flow to x, w1 and w_down (the weight-gradient GEMMs run only for inputs that
    require grad); works under ``torch.compile``.

    Numerics: for gates below :data:`FLUSHED_GATE` (-87.34) silu(gate) and its derivative
    are 0 instead of values below 1.03e-36 in magnitude (the kernels' fast sigmoid flushes
    sigmoid(gate) < 2^-126 to 0); every other gate is within the kernels' rounding.
    """
    op = "swiglu"
    _expect(
        x.dim() == 2 and w1.dim() == 2 and w_down.dim() == 2,
        op,
        lambda: (
            f"need 2-D x (M, K), w1 (2I, K), w_down (K, I); got {x.dim()}-D, {w1.dim()}-D, "
            f"{w_down.dim()}-D (flatten batch and sequence into M: x.reshape(-1, K))"
        ),
    )
    _expect(
        w1.shape[1] == x.shape[1] and w_down.shape[0] == x.shape[1] and w1.shape[0] == 2 * w_down.shape[1],
        op,
        lambda: (
            f"need x (M, K), w1 (2I, K), w_down (K, I), got {tuple(x.shape)}, {tuple(w1.shape)}, "
            f"{tuple(w_down.shape)}: {_swiglu_mismatch(x, w1, w_down)}"
        ),
    )
    _pkg._check_layout(op, x=(x, torch.bfloat16), w1=(w1, torch.bfloat16), w_down=(w_down, torch.bfloat16))
    _pkg._check_device(op, x=x, w1=w1, w_down=w_down)
    out, _ = _swiglu_mlp(x, w1, w_down)
    return out

"""FP8 quantized projection (DeepSeek-V3's 1x128 activation recipe): ``linear_fp8_quant``.

Kernel wrapper ``gemm_fp8_quant_op``; ``linear_fp8_quant_torch`` (the same math in PyTorch)
and ``dequantize_blockwise``. See the package docstring for the math. ``load`` /
``_check_device`` / ``_check_layout`` are looked up through the package at call time.

Rules:

* Not differentiable: the outputs are the next FP8 GEMM's operand, and autograd would cast
  their gradient to fp8. The FP8 consumer's recipe computes this projection's backward in
  bf16 from x, w and its own gradient. With grad enabled, an input that requires grad is a
  ValueError (a gradient is never dropped silently).
* One kernel, no fallback: ``linear_fp8_quant`` raises ModuleNotFoundError while
  gemm_fp8_quant is not accepted and ValueError off sm_90 (as every op of the package);
  :func:`linear_fp8_quant_torch` computes the same values anywhere.
* The kernel is verified with the spec's eps only (:data:`KERNEL_EPS`).
"""

from __future__ import annotations

import torch

from ._registry import _expect, _pkg, run_kernel

KERNEL = "gemm_fp8_quant"
BLOCK = 128
"""Columns per scale block (1x128)."""
E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value: a block's largest |y| maps to +-448."""
KERNEL_EPS = 1e-4
"""The scale floor the kernel is verified with (the spec's float constant)."""


def _check_args(op: str, x: torch.Tensor, w: torch.Tensor, eps: float) -> None:
    """Shapes, the block rule, eps and the gradient rule (ValueError naming ``op``)."""
    _expect(
        x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1],
        op,
        lambda: (
            f"need x (M, K) and w (N, K) with one K, got {tuple(x.shape)} and {tuple(w.shape)} "
            "(flatten batch and sequence into M: x.reshape(-1, K))"
        ),
    )
    _expect(
        w.shape[0] % BLOCK == 0,
        op,
        lambda: f"N = w.shape[0] = {w.shape[0]} must be a multiple of {BLOCK} (whole 1x{BLOCK} scale blocks)",
    )
    _expect(eps > 0, op, lambda: f"eps must be > 0 (it keeps an all-zero block's scale finite), got {eps}")
    for name, t in (("x", x), ("w", w)):
        _expect(
            not (torch.is_grad_enabled() and t.requires_grad),
            op,
            lambda name=name: (
                f"{name} requires grad, but the FP8 quantization is not differentiable (its fp8 outputs' "
                f"gradient would be cast to fp8); call it under torch.no_grad() or pass {name}.detach(): the "
                "projection's backward belongs to the FP8 consumer, in bf16 from x, w and its gradient"
            ),
        )


@torch.library.custom_op("coda_agent::gemm_fp8_quant", mutates_args=())
def gemm_fp8_quant_op(
    x: torch.Tensor, w: torch.Tensor, *, eps: float = KERNEL_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused GEMM + 1x128 blockwise e4m3 quantization. x (M, K) bf16, w (N, K) bf16 (N a
    multiple of 128) -> (y_fp8 (M, N) float8_e4m3fn, y_scale (M, N/128) fp32), as
    :func:`linear_fp8_quant`, without its shape and gradient checks."""
    y_fp8, y_scale = run_kernel(KERNEL, x, w, eps=eps)
    return y_fp8, y_scale


@gemm_fp8_quant_op.register_fake
def _(x, w, *, eps=KERNEL_EPS):
    m, n = x.shape[0], w.shape[0]
    return x.new_empty((m, n), dtype=torch.float8_e4m3fn), x.new_empty((m, n // BLOCK), dtype=torch.float32)


def linear_fp8_quant(x: torch.Tensor, w: torch.Tensor, *, eps: float = KERNEL_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``x @ w^T`` quantized for the next FP8 GEMM, 1x128 blockwise (one fused kernel).

    y = x @ w^T in fp32 (never stored); per row m and block b of 128 columns
    ``y_scale[m, b] = max(max |y[m, 128b:128b+128]|, eps) / 448`` and ``y_fp8 =
    e4m3(y / y_scale)``: round to nearest even, saturating at +-448, so the block's largest
    |y| maps to +-448 and ``y_fp8 * y_scale`` (:func:`dequantize_blockwise`) is y within
    half an e4m3 step.

    Args:
        x: (M, K) bf16 activations, contiguous; K a multiple of 8 (16-byte rows).
        w: (N, K) bf16 weight, nn.Linear layout; N a multiple of 128.
        eps: the scale floor (an all-zero block gets scale eps / 448 and zeros); the
            kernel is verified with :data:`KERNEL_EPS` only.
    Returns:
        (y_fp8 (M, N) float8_e4m3fn, y_scale (M, N/128) fp32): the consumer's operand and
        its per-(row, K-block) scale factors.
    Raises:
        ValueError: shapes that are not x (M, K), w (N, K); N not a multiple of 128; another
            eps; a dtype other than bf16, a non-contiguous tensor, rows not a multiple of
            16 bytes; tensors not on one CUDA device or a GPU other than sm_90; grad enabled
            with x or w requiring grad.
        ModuleNotFoundError: when gemm_fp8_quant is not accepted yet.
    Not differentiable: run it under ``torch.no_grad()`` or on detached tensors; the FP8
    consumer's recipe computes this projection's backward in bf16 from x, w and its own
    gradient. A ``torch.compile``-able node (the ``coda_agent::gemm_fp8_quant`` custom op).
    """
    op = "linear_fp8_quant"
    _check_args(op, x, w, eps)
    _expect(
        float(eps) == KERNEL_EPS,
        op,
        lambda: (
            f"the gemm_fp8_quant kernel is verified with eps = {KERNEL_EPS}, got {eps}; "
            "use linear_fp8_quant_torch for another eps"
        ),
    )
    _pkg._check_layout(op, x=(x, torch.bfloat16), w=(w, torch.bfloat16))
    _pkg._check_device(op, x=x, w=w)
    return gemm_fp8_quant_op(x, w, eps=float(eps))


def linear_fp8_quant_torch(
    x: torch.Tensor, w: torch.Tensor, eps: float = KERNEL_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`linear_fp8_quant`'s math in PyTorch, on any device: y = x @ w^T in fp32 (from
    any float x (M, K), w (N, K), N a multiple of 128), the block scales in fp32, y / scale
    clamped to +-448 and cast to float8_e4m3fn (round to nearest even). Returns (y_fp8 (M,
    N) float8_e4m3fn, y_scale (M, N/128) fp32). ValueError on the shapes, eps and gradient
    rules of :func:`linear_fp8_quant`."""
    _check_args("linear_fp8_quant_torch", x, w, eps)
    blocks = (x.float() @ w.float().T).unflatten(1, (-1, BLOCK))
    y_scale = blocks.abs().amax(dim=-1).clamp_min(eps) / E4M3_MAX
    y_fp8 = (blocks / y_scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y_fp8.flatten(1), y_scale


def dequantize_blockwise(y_fp8: torch.Tensor, y_scale: torch.Tensor) -> torch.Tensor:
    """The values the quantized outputs stand for: ``y_fp8 (M, N) float8_e4m3fn`` times its
    block's ``y_scale (M, N/128) fp32`` -> (M, N) fp32. ValueError on other shapes or
    dtypes."""
    op = "dequantize_blockwise"
    _expect(y_fp8.dtype == torch.float8_e4m3fn, op, lambda: f"y_fp8 must be torch.float8_e4m3fn, got {y_fp8.dtype}")
    _expect(y_scale.dtype == torch.float32, op, lambda: f"y_scale must be torch.float32, got {y_scale.dtype}")
    _expect(
        y_fp8.dim() == 2
        and y_fp8.shape[1] % BLOCK == 0
        and tuple(y_scale.shape) == (y_fp8.shape[0], y_fp8.shape[1] // BLOCK),
        op,
        lambda: (
            f"need y_fp8 (M, N), N a multiple of {BLOCK}, and y_scale (M, N/{BLOCK}); got "
            f"{tuple(y_fp8.shape)} and {tuple(y_scale.shape)}"
        ),
    )
    return (y_fp8.float().unflatten(1, (-1, BLOCK)) * y_scale[..., None]).flatten(1)

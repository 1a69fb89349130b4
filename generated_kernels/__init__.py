"""Accepted kernels as training ops: ``from coda_agent.kernels import swiglu``.

``generated_kernels/<op>/kernel.py`` files are LLM-written and accepted by the verifier;
this module is the hand-reviewed glue that turns them into autograd-capable,
``torch.compile``-compatible ops:

* each accepted kernel is wrapped as a ``torch.library`` custom op
  (``coda_agent::<op>``) with a fake (meta) implementation, so torch.compile treats it as
  one opaque node instead of tracing into CuTeDSL;
* composite ops (below) attach ``register_autograd`` so the backward runs the fused
  backward kernel.

Kernel modules are imported lazily (first call), so ``import coda_agent.kernels`` works on
machines without a GPU, triton or quack. They are imported under their package path
(``coda_agent.kernels.<op>.kernel``): quack keys its compile cache by module + function,
so a stable import name lets compiled kernels be found again. Importing it binds
``coda_agent.kernels.<op>`` to the kernel's folder (a namespace package), so no Python
name in this module may equal a kernel folder's name: the ops are ``<op>_op``.

SwiGLU MLP (CODA catalogue items 1 + 7)
---------------------------------------
``swiglu(x, w1, w_down) = (silu(gate) * up) @ w_down^T`` with
``[gate | up]`` interleaved: ``preact = x @ w1^T`` (M, 2I), ``gate = preact[:, 0::2]``,
``up = preact[:, 1::2]``. Forward: the ``swiglu_fwd`` kernel (GEMM + SwiGLU epilogue)
then the down-projection GEMM; only ``preact`` is saved. Backward: the ``swiglu_bwd``
kernel fuses the down projection's dgrad GEMM with the SwiGLU backward and recomputes
``postact`` (needed by the down projection's wgrad), so postact is never stored between
forward and backward. The remaining wgrad/dgrad GEMMs are plain GEMMs.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

KERNELS_DIR = Path(__file__).resolve().parent


def accepted() -> list[str]:
    """Names of the accepted kernels present in this package (folders with kernel.py)."""
    return sorted(p.parent.name for p in KERNELS_DIR.glob("*/kernel.py"))


def load(name: str):
    """Import ``generated_kernels/<name>/kernel.py``; raises ModuleNotFoundError naming it."""
    if not (KERNELS_DIR / name / "kernel.py").is_file():
        raise ModuleNotFoundError(
            f"no accepted kernel {name!r} in {KERNELS_DIR} (accepted: {accepted()}); "
            f"run `coda-agent generate {name}`"
        )
    return importlib.import_module(f"{__name__}.{name}.kernel")


# --------------------------------------------------------------------------- custom ops

@torch.library.custom_op("coda_agent::swiglu_fwd", mutates_args=())
def swiglu_fwd_op(x: torch.Tensor, w1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused GEMM + SwiGLU. x (M, K) bf16, w1 (2I, K) bf16 gate/up interleaved ->
    (preact (M, 2I), postact (M, I)) bf16."""
    preact, postact = load("swiglu_fwd").swiglu_fwd(x, w1)
    return preact, postact


@swiglu_fwd_op.register_fake
def _(x, w1):
    m, n2 = x.shape[0], w1.shape[0]
    return x.new_empty((m, n2)), x.new_empty((m, n2 // 2))


@torch.library.custom_op("coda_agent::swiglu_bwd", mutates_args=())
def swiglu_bwd_op(
    dout: torch.Tensor, w_down: torch.Tensor, preact: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused down-projection dgrad + SwiGLU backward. dout (M, K), w_down (K, I),
    preact (M, 2I), all bf16 -> (dpreact (M, 2I), postact (M, I)) bf16."""
    dpreact, postact = load("swiglu_bwd").swiglu_bwd(dout, w_down, preact)
    return dpreact, postact


@swiglu_bwd_op.register_fake
def _(dout, w_down, preact):
    return torch.empty_like(preact), preact.new_empty((preact.shape[0], preact.shape[1] // 2))


@torch.library.custom_op("coda_agent::swiglu_mlp", mutates_args=())
def _swiglu_mlp(x: torch.Tensor, w1: torch.Tensor, w_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    preact, postact = swiglu_fwd_op(x, w1)
    return postact @ w_down.T, preact


@_swiglu_mlp.register_fake
def _(x, w1, w_down):
    m = x.shape[0]
    return x.new_empty((m, w_down.shape[0])), x.new_empty((m, w1.shape[0]))


def _mlp_setup_context(ctx, inputs, output):
    x, w1, w_down = inputs
    _, preact = output
    ctx.save_for_backward(x, w1, w_down, preact)


def _mlp_backward(ctx, dout, _dpreact_unused):
    x, w1, w_down, preact = ctx.saved_tensors
    dpreact, postact = swiglu_bwd_op(dout.contiguous(), w_down, preact)
    dw_down = dout.T @ postact          # wgrad of the down projection (K, I)
    dx = dpreact @ w1                   # dgrad of the gate/up projection (M, K)
    dw1 = dpreact.T @ x                 # wgrad of the gate/up projection (2I, K)
    return dx, dw1, dw_down


_swiglu_mlp.register_autograd(_mlp_backward, setup_context=_mlp_setup_context)


def _check_device(op: str, *tensors: torch.Tensor) -> None:
    """The accepted kernels are sm_90 CUDA kernels: fail clearly on CPU or mixed devices."""
    devices = {t.device for t in tensors}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise ValueError(f"{op}: the fused kernels need all tensors on one CUDA (Hopper) device, got "
                         f"{', '.join(str(t.device) for t in tensors)}")


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
        ValueError: when the tensors are not on one CUDA device (the kernels need sm_90).
        ModuleNotFoundError: when swiglu_fwd / swiglu_bwd are not accepted yet.
    Gradients flow to x, w1 and w_down; works under ``torch.compile``.
    """
    _check_device("swiglu", x, w1, w_down)
    out, _ = _swiglu_mlp(x, w1, w_down)
    return out


__all__ = ["accepted", "load", "swiglu", "swiglu_bwd_op", "swiglu_fwd_op"]

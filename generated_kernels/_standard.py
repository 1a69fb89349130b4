"""The standard path of each routed kernel: cuBLAS GEMM + the elementwise pass, compiled.

:mod:`._dispatch` sends a kernel call here when the tuning table says the fused kernel does
not beat this path at the call's shape bucket (``route = "standard"``). Each function takes
the kernel entry's arguments in the entry's order (``spec.toml``'s ``[[entry.inputs]]``,
constants as keywords) and returns its outputs in the entry's order, dtypes and shapes:
a drop-in for ``run_kernel(name, ...)``. The math is the spec's ``baseline`` (the unfused
PyTorch code the kernel replaces); tests/kernels/test_standard.py checks each against it
and against the spec's declared outputs.

Rules:

* One ``torch.compile(fullgraph=True, dynamic=False)`` per function, made on first use:
  the call runs inside a training op's body (eager even when the model is compiled), so an
  uncompiled elementwise pass would be slower than the "standard path" the tuner measured
  (``torch.compile`` of the spec's baseline, verifier/gpu/worker_reference.py).
* Norm statistics in fp32 (``EPS`` as the kernels'); bf16 activations in and out.
* Cross-entropy kernels have no standard path here: their fused form saves the (M, V)
  logits, which no GEMM-bound shape gives back (``routable()`` says which kernels route).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

EPS = 1e-6
"""RMSNorm epsilon of the kernels (kernel_specs/*/reference.py)."""


def _split(preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return preact[..., 0::2], preact[..., 1::2]


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), dim=-1).flatten(-2)


def _rotate(qkv: torch.Tensor, positions, inv_freq, n_heads: int, sign: float) -> torch.Tensor:
    """Interleaved RoPE of the first ``n_heads`` heads (``sign`` -1: the inverse rotation)."""
    half = inv_freq.shape[0]
    n_rot = n_heads * 2 * half
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :] * sign
    pairs = qkv[:, :n_rot].float().unflatten(1, (n_heads, half, 2))
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).flatten(1)
    return torch.cat((rotated.type_as(qkv), qkv[:, n_rot:]), dim=1)


def _rows(a: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    return (a.float() * rstd[:, None]).to(a.dtype)


def swiglu_fwd(x, w1):
    preact = F.linear(x, w1)
    gate, up = _split(preact)
    return preact, F.silu(gate) * up


def _dswiglu(dpost, preact):
    gate, up = _split(preact.float())
    s = torch.sigmoid(gate)
    silu = gate * s
    dgate = dpost * up * s * (1 + gate * (1 - s))
    return _interleave(dgate, dpost * silu), silu * up


def swiglu_bwd(dout, w_down, preact):
    dpreact, postact = _dswiglu((dout @ w_down).float(), preact)
    return dpreact.to(preact.dtype), postact.to(preact.dtype)


def swiglu_bwd_rms(dout, w_down, preact):
    dpreact, postact = _dswiglu((dout @ w_down).float(), preact)
    zdz = (dpreact * preact.float()).sum(dim=-1) / dout.shape[-1]
    return dpreact.to(preact.dtype), postact.to(preact.dtype), zdz


def gemm_rmsnorm(a, rstd, w):
    return (F.linear(_rows(a, rstd), w),)


def gemm_rmsnorm_swiglu(normed_w, rstd, w1):
    return swiglu_fwd(_rows(normed_w, rstd), w1)


def gemm_residual_partial_rms(x, w_o, residual, gamma):
    y = F.linear(x, w_o) + residual
    rstd = torch.rsqrt(y.float().pow(2).mean(dim=-1) + EPS)
    return y, y * gamma, rstd


def gemm_rope(x, w_qkv, positions, inv_freq, *, HQ, HKV):
    return (_rotate(F.linear(x, w_qkv), positions, inv_freq, HQ + HKV, 1.0),)


def gemm_rmsnorm_rope(a, rstd, w_qkv, positions, inv_freq, *, HQ, HKV):
    return gemm_rope(_rows(a, rstd), w_qkv, positions, inv_freq, HQ=HQ, HKV=HKV)


def rope_bwd(g, w, positions, inv_freq, *, HQ, HKV):
    return (_rotate(F.linear(g, w), positions, inv_freq, HQ + HKV, -1.0),)


def rms_bwd(dy, w, h, gamma, rstd, zdz, dresid):
    acc = (dy @ w).float()
    r = rstd.float()[:, None]
    xhat = h.float() * r
    t = acc * gamma.float()
    corr = (t * xhat).mean(dim=-1, keepdim=True)
    dh = ((t - xhat * corr) * r + dresid.float()).to(h.dtype)
    return dh, (acc * xhat).sum(dim=0)


_FUNCS: dict[str, Callable[..., tuple]] = {
    f.__name__: f
    for f in (
        swiglu_fwd,
        swiglu_bwd,
        swiglu_bwd_rms,
        gemm_rmsnorm,
        gemm_rmsnorm_swiglu,
        gemm_residual_partial_rms,
        gemm_rope,
        gemm_rmsnorm_rope,
        rope_bwd,
        rms_bwd,
    )
}
_COMPILED: dict[str, Callable[..., tuple]] = {}


def routable() -> frozenset[str]:
    """The kernels that have a standard path."""
    return frozenset(_FUNCS)


def eager(name: str) -> Callable[..., tuple]:
    """Kernel ``name``'s standard path, uncompiled (tests; CPU). KeyError when it has none."""
    return _FUNCS[name]


def compiled(name: str) -> Callable[..., tuple]:
    """Kernel ``name``'s standard path under ``torch.compile`` (made once, on first use).
    KeyError when the kernel has no standard path (see :func:`routable`)."""
    fn = _COMPILED.get(name)
    if fn is None:
        fn = _COMPILED[name] = torch.compile(_FUNCS[name], fullgraph=True, dynamic=False)
    return fn

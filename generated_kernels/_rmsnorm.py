"""RMSNorm family (CODA catalogue items 2, 3, 4, 8): residual + RMSNorm statistics, the
deferred-rstd consumers, RMSNorm -> linear, and the fused RMSNorm backward kernel as an op.

Public ops: ``residual_rmsnorm``, ``rmsnorm_linear``, ``deferred_rmsnorm_linear``,
``deferred_rmsnorm_swiglu``, ``deferred_rmsnorm_swiglu_mlp`` (which also runs the
swiglu_bwd kernel of ``_swiglu``); kernel wrappers ``gemm_residual_partial_rms_op``,
``gemm_rmsnorm_op``, ``gemm_rmsnorm_swiglu_op``, ``rms_bwd_op``. See the package docstring
for the math. ``load`` / ``_check_device`` are looked up through the package at call time.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from ._registry import _expect, _pkg, _stat_dtype, run_kernel, tile_widths
from ._swiglu import down_proj_backward

BF16, FP32 = torch.bfloat16, torch.float32

EPS = 1e-6
"""RMSNorm epsilon of every spec in this family (``nn.RMSNorm(eps=1e-6)``) and the ops'
default. The gemm_residual_partial_rms kernel finalizes rstd with it; :func:`residual_rmsnorm`
re-finalizes for another ``eps`` (:func:`_with_eps`). Hugging Face Llama-3 configs say
``rms_norm_eps = 1e-5``: pass ``eps=1e-5`` to match them."""


def _check_eps(op: str, eps) -> float:
    """``eps`` as a float, or ValueError naming ``op``: a real number (Python or NumPy
    scalar; not a bool, not a tensor), finite and >= 0. Under torch.compile a float
    argument is a graph input: the first value is specialized, later ones share one graph."""
    try:
        ok = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and 0.0 <= float(eps) < float("inf")
    except OverflowError:  # an int beyond float range
        ok = False
    _expect(ok, op, lambda: f"eps must be a finite real number >= 0 (a float), got {eps!r}")
    return float(eps)


def _with_eps(rstd: torch.Tensor, eps: float) -> torch.Tensor:
    """rstd finalized with :data:`EPS` -> finalized with ``eps``: (M,) fp32 -> (M,) fp32.

    ``r = rstd = (ms + EPS)^(-1/2)``, so ``1 + (eps - EPS) r^2 = (ms + eps) / (ms + EPS)``
    and ``r * (1 + (eps - EPS) r^2)^(-1/2) = (ms + eps)^(-1/2)``. In fp32 the relative error
    is ~1e-7 * |eps - EPS| / (ms + eps) (+ an ulp): ~1e-7 for any ``eps >= EPS``. Below EPS
    it grows for rows with ``ms << EPS``; an all-zero row at ``eps = 0`` gets a rstd >= ~1e6
    or inf (the clamp stops rounding from making it NaN) where the direct formula gives inf.
    A row with an infinite mean square (rstd = 0) maps to 0 with derivative 1 (this map's
    exact derivative there), so the backward of a non-finite row is non-finite where
    PyTorch's is (a form through ``rstd^-2`` gives 0 * inf = NaN there, which spreads over
    the row's gradient and into every weight gradient). Plain torch, so autograd gives
    d/d rstd (one (M,) pass, fused under torch.compile)."""
    if eps == EPS:
        return rstd
    return rstd * torch.rsqrt((1.0 + (eps - EPS) * rstd.square()).clamp_min(0.0))


def _zeros_if_none(g, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if g is None else g


# --------------------------------------------------------------------------- kernel ops


@torch.library.custom_op("coda_agent::gemm_residual_partial_rms", mutates_args=())
def gemm_residual_partial_rms_op(
    x: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused GEMM + residual + RMSNorm statistics (item 3). x (M, K), w_o (N, K),
    residual (M, N), gamma (N,) bf16 -> (resid_out (M, N), normed_w (M, N) bf16, rstd (M,) fp32)."""
    return residual_partial_rms(x, w_o, residual, gamma)


def residual_partial_rms(
    x: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel ``gemm_residual_partial_rms`` as the ops call it inside their own custom
    ops (no nested op boundary): ``run_kernel`` plus :func:`_infinite_rows_rstd`. Shapes and
    dtypes as :func:`gemm_residual_partial_rms_op`."""
    resid_out, normed_w, rstd = run_kernel("gemm_residual_partial_rms", x, w_o, residual, gamma)
    return resid_out, normed_w, _infinite_rows_rstd(resid_out, rstd)


def _infinite_rows_rstd(y: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """The kernel's rstd (M,) fp32 with PyTorch's value, 0, in rows whose mean square is
    infinite: where ``y`` (M, N) holds an Inf and no NaN, a NaN rstd becomes 0.

    Why: when N is not a multiple of the kernel's N tile, TMA zero-fills the out-of-bounds
    rows of the GEMM's B operand, so in a row of x (the A operand) holding an Inf the
    accumulator's out-of-bounds lanes are ``Inf * 0 = NaN``; the epilogue's partial sum of
    squares reduces over them and the kernel's rstd is NaN where
    ``rsqrt(mean(y^2) + eps)`` is ``rsqrt(inf) = 0`` (outputs y and normed_w never store those
    lanes). A NaN rstd in a row without a NaN in y can only come from there: a row of x that
    is finite gives the lanes 0, and a NaN in x makes every y of the row NaN. Only ragged N
    needs the repair (one (M, N) read); at a multiple of every tile width the kernel may run
    with (its own and its tuned configs') it is skipped
    (tests/kernels/test_probe_regressions.py, ``x_inf`` at a ragged N)."""
    tiles = tile_widths("gemm_residual_partial_rms")
    if tiles and all(y.shape[-1] % t == 0 for t in tiles):
        return rstd
    row_nan = torch.linalg.vector_norm(y, dim=-1, dtype=rstd.dtype).isnan()  # NaN iff the row holds one
    return torch.where(rstd.isnan() & ~row_nan, torch.zeros_like(rstd), rstd)


@gemm_residual_partial_rms_op.register_fake
def _(x, w_o, residual, gamma):
    m, n = x.shape[0], w_o.shape[0]
    return x.new_empty((m, n)), x.new_empty((m, n)), x.new_empty((m,), dtype=_stat_dtype(x))


@torch.library.custom_op("coda_agent::gemm_rmsnorm", mutates_args=())
def gemm_rmsnorm_op(a: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Fused GEMM with the deferred RMSNorm row scale (item 4). a (M, K) bf16, rstd (M,) fp32,
    w (N, K) bf16 -> out (M, N) bf16 = rstd[:, None] * (a @ w^T)."""
    (out,) = run_kernel("gemm_rmsnorm", a, rstd, w)
    return out


@gemm_rmsnorm_op.register_fake
def _(a, rstd, w):
    return a.new_empty((a.shape[0], w.shape[0]))


@torch.library.custom_op("coda_agent::gemm_rmsnorm_swiglu", mutates_args=())
def gemm_rmsnorm_swiglu_op(
    normed_w: torch.Tensor, rstd: torch.Tensor, w1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused GEMM + deferred rstd + SwiGLU (item 2). normed_w (M, K) bf16, rstd (M,) fp32,
    w1 (2I, K) bf16 gate/up interleaved -> (preact (M, 2I), postact (M, I)) bf16."""
    preact, postact = run_kernel("gemm_rmsnorm_swiglu", normed_w, rstd, w1)
    return preact, postact


@gemm_rmsnorm_swiglu_op.register_fake
def _(normed_w, rstd, w1):
    m, n2 = normed_w.shape[0], w1.shape[0]
    return normed_w.new_empty((m, n2)), normed_w.new_empty((m, n2 // 2))


@torch.library.custom_op("coda_agent::rms_bwd", mutates_args=())
def rms_bwd_op(
    dy: torch.Tensor,
    w: torch.Tensor,
    h: torch.Tensor,
    gamma: torch.Tensor,
    rstd: torch.Tensor,
    zdz: torch.Tensor,
    dresid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dgrad GEMM + RMSNorm backward (item 8). dy (M, N), w (N, D), h (M, D),
    gamma (D,), dresid (M, D) bf16; rstd, zdz (M,) fp32 -> (dh (M, D) bf16, dgamma (D,) fp32).

    A plain custom op (no autograd: it is a backward), for callers whose producing backward
    kernel emits ``zdz[m] = sum_n dy[m, n] * out[m, n] / D`` (the RMSNorm correction; see
    the rms_bwd spec). :func:`rmsnorm_linear` does not use it: computing zdz in torch costs
    more than the fusion saves (measured, see there).

    Raises ValueError on inconsistent shapes, a wrong dtype, a non-contiguous tensor, rows
    not a multiple of 16 bytes or tensors not on one CUDA device."""
    op = "rms_bwd_op"
    _expect(
        dy.dim() == 2
        and w.dim() == 2
        and h.dim() == 2
        and dy.shape[1] == w.shape[0]
        and tuple(h.shape) == (dy.shape[0], w.shape[1])
        and tuple(dresid.shape) == tuple(h.shape)
        and tuple(gamma.shape) == (h.shape[1],)
        and tuple(rstd.shape) == tuple(zdz.shape) == (h.shape[0],),
        op,
        lambda: (
            f"need dy (M, N), w (N, D), h (M, D), gamma (D,), rstd (M,), zdz (M,), dresid (M, D); got "
            f"{', '.join(str(tuple(t.shape)) for t in (dy, w, h, gamma, rstd, zdz, dresid))}"
        ),
    )
    _pkg._check_layout(
        op,
        dy=(dy, BF16),
        w=(w, BF16),
        h=(h, BF16),
        gamma=(gamma, BF16),
        rstd=(rstd, FP32),
        zdz=(zdz, FP32),
        dresid=(dresid, BF16),
    )
    _pkg._check_device(op, dy=dy, w=w, h=h, gamma=gamma, rstd=rstd, zdz=zdz, dresid=dresid)
    dh, dgamma = run_kernel("rms_bwd", dy, w, h, gamma, rstd, zdz, dresid)
    return dh, dgamma


@rms_bwd_op.register_fake
def _(dy, w, h, gamma, rstd, zdz, dresid):
    return h.new_empty(h.shape), h.new_empty((h.shape[1],), dtype=_stat_dtype(h))


# --------------------------------------------------------------------------- shared backward math


def deferred_linear_grads(dy, a, rstd, w, need=(True, True, True)):
    """Gradients of out = (a * rstd[:, None]) @ w^T (the deferred-rstd GEMM) for the upstream
    dy (M, N) in a's dtype: (da (M, K), drstd (M,), dw (N, K)); ``need`` (three bools, e.g.
    ``ctx.needs_input_grad[:3]``) says which to compute, the others are None (no dgrad GEMM
    when neither da nor drstd is needed, no wgrad GEMM without dw). The GEMMs run in the
    activation dtype; the row scale and the drstd reduction in fp32 (or wider).

    Rounding: this is the arithmetic of PyTorch's autograd through the standard definition
    ``(a.float() * rstd[:, None]).to(bf16) @ w^T`` in bf16 (dz is the bf16 dgrad GEMM's
    output there too, then the same fp32 scale and row sum), so for one dy the gradients
    round as PyTorch's do. The ops' dy differ from PyTorch's bf16 ones by rounding (e.g.
    deferred_rmsnorm_swiglu's dpre, computed in fp32 from the saved bf16 preact), so per
    row drstd's error is a sample of the same size as PyTorch's bf16 error for that row,
    not bounded by it: the max-error criterion ("within twice PyTorch's bf16 error") is
    meaningful over many rows (M >= 32), while on one row (M = 1) it compares two random
    roundings (tests/kernels/test_probe_regressions.py)."""
    need_a, need_rstd, need_w = need[:3]
    sd = _stat_dtype(a)
    r = rstd.to(sd)[:, None]
    da = drstd = dw = None
    if need_a or need_rstd:
        dz = (dy @ w).to(sd)  # d out / d (a * rstd), (M, K)
        da = (dz * r).to(a.dtype) if need_a else None
        drstd = (dz * a.to(sd)).sum(dim=-1).to(rstd.dtype) if need_rstd else None
    if need_w:
        dw = dy.T @ (a.to(sd) * r).to(a.dtype)
    return da, drstd, dw


# --------------------------------------------------------------------------- residual_rmsnorm


@torch.library.custom_op("coda_agent::residual_rmsnorm", mutates_args=())
def _residual_rmsnorm(
    x: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return residual_partial_rms(x, w_o, residual, gamma)


@_residual_rmsnorm.register_fake
def _(x, w_o, residual, gamma):
    m, n = x.shape[0], w_o.shape[0]
    return x.new_empty((m, n)), x.new_empty((m, n)), x.new_empty((m,), dtype=_stat_dtype(x))


def _residual_rmsnorm_setup(ctx, inputs, output):
    x, w_o, _residual, gamma = inputs
    resid_out, _normed_w, rstd = output
    ctx.save_for_backward(x, w_o, gamma, resid_out, rstd)


def _residual_rmsnorm_backward(ctx, d_resid_out, d_normed_w, d_rstd):
    x, w_o, gamma, y, rstd = ctx.saved_tensors
    sd = _stat_dtype(x)
    yf, r = y.to(sd), rstd.to(sd)
    d_resid_out = _zeros_if_none(d_resid_out, y).to(sd)
    d_normed_w = _zeros_if_none(d_normed_w, y).to(sd)
    d_rstd = _zeros_if_none(d_rstd, rstd).to(sd)
    # y feeds all three outputs: resid_out = y, normed_w = y * gamma,
    # rstd = (mean(y^2) + eps)^(-1/2)  =>  d rstd / d y = -rstd^3 * y / N
    gy = d_resid_out + d_normed_w * gamma.to(sd) + (d_rstd * r.pow(3) * (-1.0 / y.shape[1]))[:, None] * yf
    need_x, need_w_o, _need_residual, need_gamma = ctx.needs_input_grad
    dgamma = (d_normed_w * yf).sum(dim=0).to(gamma.dtype) if need_gamma else None
    g = gy.to(x.dtype)
    return g @ w_o if need_x else None, g.T @ x if need_w_o else None, g, dgamma


_residual_rmsnorm.register_autograd(_residual_rmsnorm_backward, setup_context=_residual_rmsnorm_setup)


def residual_rmsnorm(
    x: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, *, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Producing GEMM + residual add + RMSNorm statistics (CODA item 3), rstd deferred.

    ``y = x @ w_o^T + residual``; returns ``(resid_out, normed_w, rstd)`` with
    ``resid_out = y`` (the new residual stream), ``normed_w = y * gamma`` (the next GEMM's
    input, row scale not applied) and ``rstd = rsqrt(mean(y^2, -1) + eps)`` (fp32 statistics), so that
    ``normed_w * rstd[:, None] = RMSNorm(y)`` (feed it to :func:`deferred_rmsnorm_linear`,
    :func:`deferred_rmsnorm_swiglu` or :func:`deferred_rmsnorm_qkv_rope`).

    Args:
        x: (M, K) bf16 (the out-projection's / down-projection's input), contiguous.
        w_o: (N, K) bf16 weight, nn.Linear layout.
        residual: (M, N) bf16 incoming residual stream.
        gamma: (N,) bf16 RMSNorm weight.
        eps: RMSNorm epsilon (keyword), default 1e-6 (the spec's); Llama-3 uses 1e-5. The
            kernel finalizes rstd with 1e-6; another eps re-finalizes it in one (M,) pass.
    Returns:
        resid_out (M, N) bf16, normed_w (M, N) bf16, rstd (M,) fp32.
    Raises:
        ValueError: inconsistent shapes, a wrong dtype (bf16; rstd fp32), a non-contiguous
            tensor, rows not a multiple of 16 bytes, tensors not on one CUDA device, or an
            eps that is not a finite number >= 0.
        ModuleNotFoundError: when gemm_residual_partial_rms is not accepted yet.
    Forward: the fused ``gemm_residual_partial_rms`` kernel. Backward (plain torch, no fused
    kernel for it in the catalogue): gradients reach x, w_o, residual and gamma through all
    three outputs (incl. rstd: d rstd / d y = -rstd^3 y / N). Works under ``torch.compile``.
    """
    op = "residual_rmsnorm"
    _expect(
        x.dim() == 2 and w_o.dim() == 2 and x.shape[1] == w_o.shape[1],
        op,
        lambda: f"x (M, K) and w_o (N, K) must share K, got {tuple(x.shape)} and {tuple(w_o.shape)}",
    )
    _expect(
        tuple(residual.shape) == (x.shape[0], w_o.shape[0]) and tuple(gamma.shape) == (w_o.shape[0],),
        op,
        lambda: f"residual must be (M, N) and gamma (N,), got {tuple(residual.shape)} and {tuple(gamma.shape)}",
    )
    _pkg._check_layout(op, x=(x, BF16), w_o=(w_o, BF16), residual=(residual, BF16), gamma=(gamma, BF16))
    _pkg._check_device(op, x=x, w_o=w_o, residual=residual, gamma=gamma)
    eps = _check_eps(op, eps)
    resid_out, normed_w, rstd = _residual_rmsnorm(x, w_o, residual, gamma)
    return resid_out, normed_w, _with_eps(rstd, eps)


# --------------------------------------------------------------------------- rmsnorm_linear


def rmsnorm_linear(h: torch.Tensor, gamma: torch.Tensor, w: torch.Tensor, *, eps: float = EPS) -> torch.Tensor:
    """RMSNorm followed by a linear layer (CODA item 4): ``RMSNorm(h) @ w^T``.

    ``RMSNorm(h) = (h * rstd[:, None]).to(h.dtype) * gamma`` with
    ``rstd = rsqrt(mean(h.float()^2, -1) + eps)`` (nn.RMSNorm, statistics in fp32),
    computed in the reparameterized form ``rstd[:, None] * ((h * gamma) @ w^T)`` (the row
    scale commutes with the GEMM and is applied to its fp32 accumulator).

    Args:
        h: (M, D) bf16 pre-norm activations (the residual stream), contiguous.
        gamma: (D,) bf16 RMSNorm weight (any strides: it meets torch code only).
        w: (N, D) bf16 weight, nn.Linear layout.
        eps: RMSNorm epsilon (keyword), default 1e-6 (the spec's); Llama-3 uses 1e-5.
    Returns:
        (M, N) bf16.
    Raises:
        ValueError: inconsistent shapes, a dtype other than bf16, a non-contiguous tensor,
            rows not a multiple of 16 bytes, tensors not on one CUDA device, or an eps that
            is not a finite number >= 0.
        ModuleNotFoundError: when gemm_rmsnorm is not accepted yet.
    Forward: rstd and ``h * gamma`` in torch (one fused pass under ``torch.compile``), then
    :func:`deferred_rmsnorm_linear` (the ``gemm_rmsnorm`` kernel applies rstd in its
    epilogue). Backward: that op's (dgrad GEMM, row scale, drstd row sum, wgrad GEMM), then
    autograd through rstd and ``h * gamma``. Gradients reach h, gamma and w; works under
    ``torch.compile``, which traces the torch parts and fuses them.

    The fused ``rms_bwd`` kernel is not used here, by measurement
    (``benchmarks/probes/op_training_step.py``, H200, 2026-12-01, one training step under
    ``torch.compile``): it needs the per-row correction ``zdz = sum_n dy * out / D``, which
    only comes for free from a producing backward kernel (catalogue item 7's variant, not in
    the library); computed in torch it is a pass over two (M, N) tensors, and N >= D for
    every RMSNorm consumer of a Llama block. With it the step took 9.16 / 2.26 / 2.81 ms
    (llama3-8b gate/up, 8b QKV, 1b gate/up; the standard definition compiled: 8.63 / 1.92 /
    2.52 ms in the same run); this way it takes 8.65 / 1.90 / 2.45 ms (standard compiled:
    8.46 / 1.90 / 2.45 ms in that run). ``rms_bwd_op`` stays for callers that have zdz.
    """
    op = "rmsnorm_linear"
    _expect(
        h.dim() == 2 and w.dim() == 2 and h.shape[1] == w.shape[1] and tuple(gamma.shape) == (h.shape[1],),
        op,
        lambda: f"need h (M, D), gamma (D,), w (N, D), got {tuple(h.shape)}, {tuple(gamma.shape)}, {tuple(w.shape)}",
    )
    # gamma meets torch code only (h * gamma): a strided one (an expanded scalar) is copied, D elements
    gamma = gamma if gamma.is_contiguous() else gamma.contiguous()
    _pkg._check_layout(
        op, {"N (w's rows, the output's columns)": w.shape[0]}, h=(h, BF16), gamma=(gamma, BF16), w=(w, BF16)
    )
    _pkg._check_device(op, h=h, gamma=gamma, w=w)
    eps = _check_eps(op, eps)
    rstd = torch.rsqrt(h.to(_stat_dtype(h)).pow(2).mean(dim=-1) + eps)
    return _deferred_rmsnorm_linear(h * gamma, rstd, w)


# --------------------------------------------------------------------------- deferred_rmsnorm_linear


@torch.library.custom_op("coda_agent::deferred_rmsnorm_linear", mutates_args=())
def _deferred_rmsnorm_linear(a: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return run_kernel("gemm_rmsnorm", a, rstd, w)[0]


@_deferred_rmsnorm_linear.register_fake
def _(a, rstd, w):
    return a.new_empty((a.shape[0], w.shape[0]))


def _deferred_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # a, rstd, w


def _deferred_rmsnorm_linear_backward(ctx, dy):
    a, rstd, w = ctx.saved_tensors
    return deferred_linear_grads(dy, a, rstd, w, ctx.needs_input_grad)


_deferred_rmsnorm_linear.register_autograd(_deferred_rmsnorm_linear_backward, setup_context=_deferred_setup)


def _check_deferred(op, a, rstd, w, widths, a_name="a", w_name="w", **more_bf16):
    """Shapes of a deferred-rstd GEMM's operands, then device and layout of them and of
    ``more_bf16`` (further bf16 weights, e.g. ``w_down``, whose shapes the caller checked)."""
    _expect(
        a.dim() == 2 and w.dim() == 2 and a.shape[1] == w.shape[1] and tuple(rstd.shape) == (a.shape[0],),
        op,
        lambda: (
            f"need {a_name} (M, K), rstd (M,), {w_name} (N, K), got {tuple(a.shape)}, "
            f"{tuple(rstd.shape)}, {tuple(w.shape)}"
        ),
    )
    _pkg._check_layout(
        op,
        widths,
        **{a_name: (a, BF16), "rstd": (rstd, FP32), w_name: (w, BF16)},
        **{k: (t, BF16) for k, t in more_bf16.items()},
    )
    _pkg._check_device(op, **{a_name: a, "rstd": rstd, w_name: w}, **more_bf16)


def deferred_rmsnorm_linear(a: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Linear layer on a deferred RMSNorm (CODA item 4): ``(a * rstd[:, None]) @ w^T``.

    ``a = y * gamma`` and ``rstd`` come from :func:`residual_rmsnorm`, so the result is
    ``RMSNorm(y) @ w^T``; the row scale is applied to the GEMM's fp32 accumulator.

    Args:
        a: (M, K) bf16 (``normed_w`` of residual_rmsnorm), contiguous.
        rstd: (M,) fp32 row scale.
        w: (N, K) bf16 weight, nn.Linear layout.
    Returns:
        (M, N) bf16.
    Raises:
        ValueError: inconsistent shapes, a wrong dtype (bf16; rstd fp32), a non-contiguous
            tensor, rows not a multiple of 16 bytes, or tensors not on one CUDA device.
        ModuleNotFoundError: when gemm_rmsnorm is not accepted yet.
    Forward: the ``gemm_rmsnorm`` kernel. Backward (plain torch: a dgrad GEMM, the row scale,
    a row reduction and a wgrad GEMM): ``da = (dy @ w) * rstd``,
    ``drstd = sum((dy @ w) * a, -1)``, ``dw = dy^T @ (a * rstd)``. Works under ``torch.compile``.
    """
    _check_deferred("deferred_rmsnorm_linear", a, rstd, w, {"N (w's rows, the output's columns)": w.shape[0]})
    return _deferred_rmsnorm_linear(a, rstd, w)


# --------------------------------------------------------------------------- deferred_rmsnorm_swiglu


@torch.library.custom_op("coda_agent::deferred_rmsnorm_swiglu", mutates_args=())
def _deferred_rmsnorm_swiglu(
    normed_w: torch.Tensor, rstd: torch.Tensor, w1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_kernel("gemm_rmsnorm_swiglu", normed_w, rstd, w1)


@_deferred_rmsnorm_swiglu.register_fake
def _(normed_w, rstd, w1):
    m, n2 = normed_w.shape[0], w1.shape[0]
    return normed_w.new_empty((m, n2)), normed_w.new_empty((m, n2 // 2))


def _deferred_swiglu_setup(ctx, inputs, output):
    normed_w, rstd, w1 = inputs
    preact, _postact = output
    ctx.save_for_backward(normed_w, rstd, w1, preact)


def _deferred_rmsnorm_swiglu_backward(ctx, d_preact, d_postact):
    normed_w, rstd, w1, preact = ctx.saved_tensors
    sd = _stat_dtype(normed_w)
    p = preact.to(sd)
    gate, up = p[:, 0::2], p[:, 1::2]
    sig = torch.sigmoid(gate)
    dpost = _zeros_if_none(d_postact, up).to(sd)
    dgate = dpost * up * sig * (1 + gate * (1 - sig))  # d silu(g) / dg = sig (1 + g (1 - sig))
    dup = dpost * F.silu(gate)
    dpre = torch.stack((dgate, dup), dim=-1).flatten(1)  # interleaved like preact
    if d_preact is not None:
        dpre = dpre + d_preact.to(sd)
    return deferred_linear_grads(dpre.to(normed_w.dtype), normed_w, rstd, w1, ctx.needs_input_grad)


_deferred_rmsnorm_swiglu.register_autograd(_deferred_rmsnorm_swiglu_backward, setup_context=_deferred_swiglu_setup)


def deferred_rmsnorm_swiglu(
    normed_w: torch.Tensor, rstd: torch.Tensor, w1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate/up projection on a deferred RMSNorm, with SwiGLU (CODA item 2).

    ``preact = (normed_w * rstd[:, None]) @ w1^T`` (M, 2I), gate/up interleaved
    (``gate = preact[:, 0::2]``, ``up = preact[:, 1::2]``), ``postact = silu(gate) * up`` (M, I).

    Args:
        normed_w: (M, K) bf16 (``normed_w`` of residual_rmsnorm), contiguous.
        rstd: (M,) fp32 row scale.
        w1: (2I, K) bf16 gate/up weight, nn.Linear layout, rows interleaved
            (row 2j = gate j, row 2j+1 = up j); I a multiple of 8 (postact's 16-byte rows).
    Returns:
        preact (M, 2I) bf16, postact (M, I) bf16.
    Raises:
        ValueError: inconsistent shapes (odd 2I, I not a multiple of 8), a wrong dtype (bf16;
            rstd fp32), a non-contiguous tensor, or tensors not on one CUDA device.
        ModuleNotFoundError: when gemm_rmsnorm_swiglu is not accepted yet.
    Forward: the ``gemm_rmsnorm_swiglu`` kernel. Backward (plain torch): SwiGLU backward from
    the saved preact plus the preact gradient, then the deferred-rstd GEMM grads as in
    :func:`deferred_rmsnorm_linear`. Gradients flow through both outputs to normed_w, rstd
    and w1; works under ``torch.compile``.
    """
    _expect(
        w1.dim() == 2 and w1.shape[0] % 2 == 0,
        "deferred_rmsnorm_swiglu",
        lambda: f"w1 needs an even row count 2I, got shape {tuple(w1.shape)}",
    )
    _check_deferred(
        "deferred_rmsnorm_swiglu",
        normed_w,
        rstd,
        w1,
        {"I (half of w1's rows, postact's columns)": w1.shape[0] // 2},
        "normed_w",
        "w1",
    )
    return _deferred_rmsnorm_swiglu(normed_w, rstd, w1)


# --------------------------------------------------------------------------- deferred_rmsnorm_swiglu_mlp


@torch.library.custom_op("coda_agent::deferred_rmsnorm_swiglu_mlp", mutates_args=())
def _deferred_rmsnorm_swiglu_mlp(
    normed_w: torch.Tensor, rstd: torch.Tensor, w1: torch.Tensor, w_down: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    preact, postact = run_kernel("gemm_rmsnorm_swiglu", normed_w, rstd, w1)
    return postact @ w_down.T, preact


@_deferred_rmsnorm_swiglu_mlp.register_fake
def _(normed_w, rstd, w1, w_down):
    m = normed_w.shape[0]
    return normed_w.new_empty((m, w_down.shape[0])), normed_w.new_empty((m, w1.shape[0]))


def _deferred_mlp_setup(ctx, inputs, output):
    normed_w, rstd, w1, w_down = inputs
    ctx.save_for_backward(normed_w, rstd, w1, w_down, output[1])
    ctx.mark_non_differentiable(output[1])  # preact is saved for the backward, not an output to train


def _deferred_mlp_backward(ctx, dout, _dpreact_unused):
    normed_w, rstd, w1, w_down, preact = ctx.saved_tensors
    need_a, need_rstd, need_w1, need_w_down = ctx.needs_input_grad
    dpreact, dw_down = down_proj_backward(dout, w_down, preact, need_w_down)
    da, drstd, dw1 = deferred_linear_grads(dpreact, normed_w, rstd, w1, (need_a, need_rstd, need_w1))
    return da, drstd, dw1, dw_down


_deferred_rmsnorm_swiglu_mlp.register_autograd(_deferred_mlp_backward, setup_context=_deferred_mlp_setup)


def deferred_rmsnorm_swiglu_mlp(
    normed_w: torch.Tensor, rstd: torch.Tensor, w1: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """The SwiGLU MLP on a deferred RMSNorm (CODA items 2 + 7):
    ``(silu(h @ gate^T) * (h @ up^T)) @ w_down^T`` with ``h = normed_w * rstd[:, None]``.

    ``normed_w`` and ``rstd`` come from :func:`residual_rmsnorm`, so ``h = RMSNorm(y)``
    without ever being stored: rstd is applied to the gate/up GEMM's fp32 accumulator.

    Args:
        normed_w: (M, D) bf16 (``normed_w`` of residual_rmsnorm), contiguous.
        rstd: (M,) fp32 row scale.
        w1: (2I, D) bf16 gate/up weight, nn.Linear layout, rows interleaved (row 2j = gate j,
            row 2j+1 = up j); I a multiple of 8.
        w_down: (D, I) bf16 down-projection weight, nn.Linear layout.
    Returns:
        (M, D) bf16.
    Raises:
        ValueError: inconsistent shapes, a wrong dtype (bf16; rstd fp32), a non-contiguous
            tensor, rows not a multiple of 16 bytes, or tensors not on one CUDA device; in
            the backward (w_down meets a kernel only there), a w_down whose data does not
            start 16-byte aligned (a slice at an odd offset).
        ModuleNotFoundError: when gemm_rmsnorm_swiglu (forward) or swiglu_bwd (backward) is
            not accepted yet.
    Forward: the ``gemm_rmsnorm_swiglu`` kernel (rstd + SwiGLU in the gate/up epilogue), the
    down projection in torch. Backward: the ``swiglu_bwd`` kernel (down projection's dgrad
    with the SwiGLU backward in its epilogue, postact recomputed), the down projection's
    wgrad, then the deferred-rstd GEMM grads of :func:`deferred_rmsnorm_linear`: the fused
    forward of :func:`deferred_rmsnorm_swiglu` with the fused backward of
    :func:`~coda_agent.kernels.swiglu`. Gradients reach normed_w, rstd, w1 and w_down; the
    wgrad GEMMs of frozen weights and the gate/up dgrad when neither normed_w nor rstd
    trains are skipped (swiglu_bwd always runs: it also recomputes postact for dw_down).
    Works under ``torch.compile``.
    """
    op = "deferred_rmsnorm_swiglu_mlp"
    _expect(
        normed_w.dim() == 2
        and w1.dim() == 2
        and w1.shape[0] % 2 == 0
        and w_down.dim() == 2
        and tuple(w_down.shape) == (normed_w.shape[1], w1.shape[0] // 2),
        op,
        lambda: (
            f"need w1 (2I, D) and w_down (D, I) for normed_w (M, D), got {tuple(w1.shape)}, "
            f"{tuple(w_down.shape)}, {tuple(normed_w.shape)}"
        ),
    )
    _check_deferred(
        op, normed_w, rstd, w1, {"I (half of w1's rows)": w1.shape[0] // 2}, "normed_w", "w1", w_down=w_down
    )
    out, _ = _deferred_rmsnorm_swiglu_mlp(normed_w, rstd, w1, w_down)
    return out

"""The chained Llama layer: the block's backward inherits the forward's block-local structure
(CODA paper section 3), so no RMSNorm backward and no rstd runs as a pass of its own.

Public ops: ``chain_start``, ``chained_qkv_rope``, ``chained_out_proj``, ``chained_mlp``,
``chained_layer`` (a whole decoder layer from them) and ``causal_gqa_attention`` (the SDPA
call it uses by default). See the package docstring for the op table.

The algebra. A norm feeding a GEMM: ``h = g * z * rstd`` (z the residual stream,
``rstd = rsqrt(mean(z^2) + eps)``), ``pre = h W^T``. Its backward is
``dz = rstd * (dh_n * g - xhat * zdz) + dresid`` with ``dh_n = dpre W``, ``xhat = z * rstd``
and the per-row correction ``zdz = (1/D) sum_k g_k xhat_k dh_n,k = (1/D) sum_j dpre_j pre_j``
(D = z's width; the second form because ``dh_n . h = dpre W . h = dpre . pre``). The second
form is a row reduction over what the producing backward already holds, so:

* the MLP: ``swiglu_bwd_rms`` (the down projection's dgrad + SwiGLU backward) emits
  ``zdz2`` from its fp32 dpreact and the saved preact; ``rms_bwd`` (the gate/up dgrad)
  applies the whole norm backward in its epilogue and adds ``dresid = dx3``: its output is
  the block's full residual-stream gradient dx2, in one GEMM;
* the QKV projection: the incoming gradient dqkv is rotated, but the rotation is
  orthogonal (value heads pass through), so ``sum_n dpre_n pre_n = sum_n dqkv_n qkv_n``:
  zdz1 is reduced from dqkv and the saved (rotated) qkv in the pass that applies R^T
  (one fused pass under torch.compile); ``rms_bwd`` then gives dx with
  ``dresid = dx2`` (below).

Rules of the hand-offs (what is differentiable):

* ``normed_w = z * g`` and ``rstd`` of a residual stream z are **not differentiable**
  (marked non-differentiable where an op returns them; ``chain_start`` returns detached
  tensors): their derivative is the norm backward that the consuming op's ``rms_bwd``
  computes. The gradients of z and g reach z and g through the consuming op's inputs
  ``x`` / ``x2`` and ``gamma``; a norm weight passed as ``g_next`` gets no gradient there
  (the next layer's op, whose ``gamma`` it is, gives it).
* The residual gradient of x (the layer input) goes through the QKV op: x is read by the
  out-projection (residual add) and by the attention norm. ``chained_qkv_rope`` returns a
  second output, ``resid_port`` (an (M, D) buffer whose values are never read: allocated,
  not written); ``chained_out_proj(..., resid_port=port)`` returns x's residual gradient
  dx2 as the port's gradient instead of x's, so autograd hands dx2 to the QKV op's backward,
  which passes it to ``rms_bwd`` as ``dresid``: dx = dx2 + the norm branch comes out of the
  QKV dgrad GEMM, with no add pass. Without the port (``resid_port=None``) x gets dx2 from
  the out-projection and the QKV op's ``rms_bwd`` reads a zero dresid: autograd then adds
  the two (M, D) gradients (a pass reading 2 and writing 1 bf16 (M, D) tensors, plus the
  zero fill: ~60 us per layer at llama3-8b, M = 8192, on an H200 at ~4 TB/s).

Passes left outside the GEMMs and attention, per layer, under torch.compile (llama3-8b,
M = 8192: a bf16 (M, D) tensor is 64 MiB, ~17 us to read or write at ~4 TB/s; estimates,
to be read against ``benchmarks/llama_layer.py --profile``): ``normed_w * rstd`` for the
two wgrads (dW1, dW_qkv; read + write (M, D): ~35 us each; Inductor may move the MLP's into
the forward, fused with the rstd re-finalize); R^T of dqkv with zdz1 (read SDPA's dq / dk /
dv and qkv, write dpre: 3 x (M, 6144) bf16, ~75-110 us, one kernel where Inductor fuses
autograd's concatenation into it); the rstd re-finalize for ``eps != 1e-6`` ((M,), ~3 us
each for rstd2 and rstd3); the kernels' own partial sums (zdz2 over N tiles, dgamma over
M tiles: ~5 us each); the dgamma casts ((D,)); SDPA's layout copies, as in the standard
layer. About 0.2 ms per layer (~1 % of a ~19 ms step). Once per model: ``chain_start``
(read x, write x * g1 and rstd1: ~40 us). Eager runs these as more, unfused kernels.

The first layer gets ``(normed_w1, rstd1) = chain_start(x, g1)``; each layer passes the
next layer's input-norm weight as ``g_next`` and hands ``(x3, normed_w3, rstd3)`` on; the
last layer passes ``g_next=None`` and the model applies its final norm to x3 in torch (e.g.
``rmsnorm_linear`` or ``nn.RMSNorm`` into the LM head): one forward and one backward norm
pass per model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ._registry import _expect, _pkg, _stat_dtype, run_kernel
from ._rmsnorm import (
    EPS,
    _check_eps,
    _with_eps,
    deferred_linear_grads,
    residual_partial_rms,
    rms_bwd_op,
)
from ._rope import _check_rope, _consts, rope_rotate
from ._swiglu import swiglu_bwd_rms_op

BF16, FP32 = torch.bfloat16, torch.float32


def _shape(t) -> str:
    return str(tuple(t.shape))


def _wgrad(dy, normed_w, rstd, w):
    """dy^T @ (normed_w * rstd[:, None]): the wgrad of a deferred-rstd GEMM (its only extra
    pass: the row scale, read + write of normed_w's size)."""
    return deferred_linear_grads(dy, normed_w, rstd, w, (False, False, True))[2]


# --------------------------------------------------------------------------- chain_start


def chain_start(x: torch.Tensor, g1: torch.Tensor, *, eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """The first layer's deferred norm: ``(normed_w1, rstd1) = (x * g1, rsqrt(mean(x^2) + eps))``.

    Args:
        x: (M, D) bf16 residual stream (the embeddings), contiguous.
        g1: (D,) bf16 the first layer's input-norm weight.
        eps: RMSNorm epsilon (keyword), default 1e-6; Llama-3 uses 1e-5.
    Returns:
        normed_w1 (M, D) bf16 and rstd1 (M,) fp32, both detached (not differentiable: the
        first layer's ``chained_qkv_rope`` computes the norm backward and gives x and g1
        their gradients).
    Raises:
        ValueError: shapes, a dtype other than bf16, a non-contiguous x, rows not a multiple
            of 16 bytes, tensors not on one CUDA device, or an eps that is not a finite
            number >= 0.
    One torch pass per model (fused under torch.compile); every later layer gets its
    normed_w / rstd from the previous layer's ``chained_mlp``.
    """
    op = "chain_start"
    _expect(
        x.dim() == 2 and tuple(g1.shape) == (x.shape[-1],),
        op,
        lambda: f"need x (M, D) and g1 (D,), got {_shape(x)} and {_shape(g1)}",
    )
    _pkg._check_layout(op, x=(x, BF16), g1=(g1, BF16))
    _pkg._check_device(op, x=x, g1=g1)
    eps = _check_eps(op, eps)
    x, g1 = x.detach(), g1.detach()
    rstd = torch.rsqrt(x.to(_stat_dtype(x)).pow(2).mean(dim=-1) + eps)
    return x * g1, rstd


# --------------------------------------------------------------------------- chained_qkv_rope


@torch.library.custom_op("coda_agent::chained_qkv_rope", mutates_args=())
def _chained_qkv_rope(
    x: torch.Tensor,
    normed_w: torch.Tensor,
    rstd: torch.Tensor,
    gamma: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    (qkv,) = run_kernel(
        "gemm_rmsnorm_rope", normed_w, rstd, w_qkv, positions, inv_freq, **_consts(n_q_heads, n_kv_heads, head_dim)
    )
    return qkv, x.new_empty(x.shape)  # the residual-gradient port: allocated, never written


@_chained_qkv_rope.register_fake
def _(x, normed_w, rstd, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    return normed_w.new_empty((normed_w.shape[0], w_qkv.shape[0])), x.new_empty(x.shape)


def _chained_qkv_setup(ctx, inputs, output):
    x, normed_w, rstd, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim = inputs
    ctx.n_rot = (n_q_heads + n_kv_heads) * head_dim
    ctx.save_for_backward(x, normed_w, rstd, gamma, w_qkv, positions, inv_freq, output[0])


def unrotate_with_zdz(dqkv, qkv, positions, inv_freq, n_rot: int, width: int):
    """R^T of the rotated-qkv gradient and the norm's correction, from one read of the row:
    ``(dpre (M, N) in dqkv's dtype, zdz (M,) fp32 = (1/width) sum_n dqkv_n qkv_n)``. The
    sum over the rotated columns equals the one over the unrotated ``dpre . pre`` (R is
    orthogonal, value columns are not rotated); computed in fp32 from the bf16 tensors.
    Under torch.compile the reduction and the rotation are one pointwise-reduction kernel."""
    sd = _stat_dtype(qkv)
    zdz = (dqkv.to(sd) * qkv.to(sd)).sum(dim=-1) / width
    return rope_rotate(dqkv, positions, inv_freq, n_rot, inverse=True).contiguous(), zdz


def _chained_qkv_backward(ctx, dqkv, dport):
    x, normed_w, rstd, gamma, w_qkv, positions, inv_freq, qkv = ctx.saved_tensors
    need_x, _, _, need_gamma, need_w = ctx.needs_input_grad[:5]
    dqkv = torch.zeros_like(qkv) if dqkv is None else dqkv
    dpre, zdz = unrotate_with_zdz(dqkv, qkv, positions, inv_freq, ctx.n_rot, x.shape[1])
    dx = dgamma = dw = None
    if need_x or need_gamma:
        # dport: x's residual gradient from chained_out_proj; without a port autograd adds it
        dresid = torch.zeros_like(x) if dport is None else dport.contiguous()
        dh, dg = rms_bwd_op(dpre, w_qkv, x, gamma, rstd, zdz, dresid)
        dx, dgamma = (dh if need_x else None), (dg.to(gamma.dtype) if need_gamma else None)
    if need_w:
        dw = _wgrad(dpre, normed_w, rstd, w_qkv)
    return dx, None, None, dgamma, dw, None, None, None, None, None


_chained_qkv_rope.register_autograd(_chained_qkv_backward, setup_context=_chained_qkv_setup)


def chained_qkv_rope(
    x: torch.Tensor,
    normed_w: torch.Tensor,
    rstd: torch.Tensor,
    gamma: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention norm + QKV projection + RoPE, chained (CODA items 5 + 8):
    ``qkv = RoPE(RMSNorm(x) @ w_qkv^T)`` from the deferred norm ``normed_w = x * gamma``,
    ``rstd`` (columns and rotation as ``qkv_rope``).

    Args:
        x: (M, D) bf16 residual stream (differentiable; read by the backward only).
        normed_w: (M, D) bf16 ``x * gamma``; rstd: (M,) fp32 ``rsqrt(mean(x^2) + eps)``
            (``chain_start`` or the previous ``chained_mlp``; not differentiable).
        gamma: (D,) bf16 the norm weight normed_w was made with (differentiable).
        w_qkv: ((n_q_heads + 2 n_kv_heads) head_dim, D) bf16, nn.Linear layout.
        positions: (M,) int64; inv_freq: (head_dim / 2,) fp32 (no gradient).
        n_q_heads, n_kv_heads, head_dim: keyword-only ints.
    Returns:
        qkv (M, (n_q_heads + 2 n_kv_heads) head_dim) bf16, and ``resid_port`` (M, D) bf16:
        unspecified values, pass it to :func:`chained_out_proj` (module docstring).
    Raises:
        ValueError: inconsistent shapes / head counts, a wrong dtype, a non-contiguous
            tensor, rows not a multiple of 16 bytes, or tensors not on one CUDA device.
        ModuleNotFoundError: gemm_rmsnorm_rope (forward) / rms_bwd (backward) not accepted.
    Forward: ``gemm_rmsnorm_rope``. Backward: R^T of dqkv with zdz in one pass
    (:func:`unrotate_with_zdz`), ``rms_bwd`` (QKV dgrad + the norm backward + the port's
    gradient as dresid: x's full gradient, and dgamma), the wgrad on ``normed_w * rstd``.
    Works under ``torch.compile``.
    """
    op = "chained_qkv_rope"
    _check_rope(
        op,
        normed_w,
        w_qkv,
        positions,
        inv_freq,
        n_q_heads,
        n_kv_heads,
        head_dim,
        rstd=rstd,
        names=("normed_w", "w_qkv"),
    )
    _expect(
        tuple(x.shape) == tuple(normed_w.shape) and tuple(gamma.shape) == (normed_w.shape[1],),
        op,
        lambda: f"need x (M, D) as normed_w {_shape(normed_w)} and gamma (D,), got {_shape(x)}, {_shape(gamma)}",
    )
    _pkg._check_layout(op, x=(x, BF16), gamma=(gamma, BF16))
    _pkg._check_device(op, x=x, normed_w=normed_w, gamma=gamma)
    return _chained_qkv_rope(x, normed_w, rstd, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)


# --------------------------------------------------------------------------- chained_out_proj


@torch.library.custom_op("coda_agent::chained_out_proj", mutates_args=())
def _chained_out_proj(
    attn: torch.Tensor,
    w_o: torch.Tensor,
    x: torch.Tensor,
    gamma: torch.Tensor,
    port: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return residual_partial_rms(attn, w_o, x, gamma)


@_chained_out_proj.register_fake
def _(attn, w_o, x, gamma, port):
    m, n = attn.shape[0], w_o.shape[0]
    return attn.new_empty((m, n)), attn.new_empty((m, n)), attn.new_empty((m,), dtype=_stat_dtype(attn))


def _out_proj_setup(ctx, inputs, output):
    attn, w_o, _x, _gamma, port = inputs
    ctx.has_port = port is not None
    ctx.save_for_backward(attn, w_o)
    ctx.mark_non_differentiable(output[1], output[2])


def _out_proj_backward(ctx, dx2, _dnormed, _drstd):
    attn, w_o = ctx.saved_tensors
    need_attn, need_w, need_x, _, need_port = ctx.needs_input_grad
    if dx2 is None:
        dx2 = attn.new_zeros((attn.shape[0], w_o.shape[0]))
    d_attn = dx2 @ w_o if need_attn else None
    dw_o = dx2.T @ attn if need_w else None
    if ctx.has_port:
        return d_attn, dw_o, None, None, (dx2 if need_port else None)
    return d_attn, dw_o, (dx2 if need_x else None), None, None


_chained_out_proj.register_autograd(_out_proj_backward, setup_context=_out_proj_setup)


def chained_out_proj(
    attn: torch.Tensor,
    w_o: torch.Tensor,
    x: torch.Tensor,
    g2: torch.Tensor,
    resid_port: torch.Tensor | None = None,
    *,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The out-projection with the residual add and the MLP norm's statistics (CODA item 3):
    ``x2 = attn @ w_o^T + x``, ``normed_w2 = x2 * g2``, ``rstd2 = rsqrt(mean(x2^2) + eps)``.

    Args:
        attn: (M, K) bf16 attention output, contiguous.
        w_o: (D, K) bf16, nn.Linear layout.
        x: (M, D) bf16 the layer's input (residual stream).
        g2: (D,) bf16 the MLP norm's weight (no gradient from here: :func:`chained_mlp` gives it).
        resid_port: None, or the port of :func:`chained_qkv_rope` for the same x: x's
            residual gradient then goes to the port (the QKV backward adds it in rms_bwd)
            and x gets none from this op.
        eps: RMSNorm epsilon (keyword), default 1e-6; Llama-3 uses 1e-5.
    Returns:
        x2 (M, D) bf16 (differentiable), normed_w2 (M, D) bf16 and rstd2 (M,) fp32 (not
        differentiable: hand them to :func:`chained_mlp` with x2 and g2).
    Raises:
        ValueError: inconsistent shapes, a wrong dtype, a non-contiguous tensor, rows not a
            multiple of 16 bytes, tensors not on one CUDA device, or a bad eps.
        ModuleNotFoundError: gemm_residual_partial_rms not accepted yet.
    Forward: ``gemm_residual_partial_rms`` (rstd re-finalized for eps != 1e-6, one (M,)
    pass). Backward: the dgrad and wgrad GEMMs; the residual gradient is dx2 itself.
    """
    op = "chained_out_proj"
    _expect(
        attn.dim() == 2
        and w_o.dim() == 2
        and attn.shape[1] == w_o.shape[1]
        and tuple(x.shape) == (attn.shape[0], w_o.shape[0])
        and tuple(g2.shape) == (w_o.shape[0],),
        op,
        lambda: (
            f"need attn (M, K), w_o (D, K), x (M, D), g2 (D,), got {_shape(attn)}, {_shape(w_o)}, "
            f"{_shape(x)}, {_shape(g2)}"
        ),
    )
    _expect(
        resid_port is None or tuple(resid_port.shape) == tuple(x.shape),
        op,
        lambda: f"resid_port must be x's shape {_shape(x)}, got {_shape(resid_port)}",
    )
    _pkg._check_layout(op, attn=(attn, BF16), w_o=(w_o, BF16), x=(x, BF16), g2=(g2, BF16))
    _pkg._check_device(op, attn=attn, w_o=w_o, x=x, g2=g2)
    eps = _check_eps(op, eps)
    x2, normed_w2, rstd2 = _chained_out_proj(attn, w_o, x, g2, resid_port)
    return x2, normed_w2, _with_eps(rstd2, eps)


# --------------------------------------------------------------------------- chained_mlp


@torch.library.custom_op("coda_agent::chained_mlp", mutates_args=())
def _chained_mlp(
    x2: torch.Tensor,
    normed_w: torch.Tensor,
    rstd: torch.Tensor,
    gamma: torch.Tensor,
    w1: torch.Tensor,
    w_down: torch.Tensor,
    g_next: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    preact, postact = run_kernel("gemm_rmsnorm_swiglu", normed_w, rstd, w1)
    x3, normed3, rstd3 = residual_partial_rms(postact, w_down, x2, g_next)
    return x3, normed3, rstd3, preact


@_chained_mlp.register_fake
def _(x2, normed_w, rstd, gamma, w1, w_down, g_next):
    m, d = x2.shape
    return (
        x2.new_empty((m, d)),
        x2.new_empty((m, d)),
        x2.new_empty((m,), dtype=_stat_dtype(x2)),
        x2.new_empty((m, w1.shape[0])),
    )


@torch.library.custom_op("coda_agent::chained_mlp_last", mutates_args=())
def _chained_mlp_last(
    x2: torch.Tensor,
    normed_w: torch.Tensor,
    rstd: torch.Tensor,
    gamma: torch.Tensor,
    w1: torch.Tensor,
    w_down: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    preact, postact = run_kernel("gemm_rmsnorm_swiglu", normed_w, rstd, w1)
    # cuBLAS with the residual as its C operand (no next norm to feed: gemm_residual_partial_rms
    # would also write normed_w; its timing against this is in benchmarks/llama_layer.py)
    return torch.addmm(x2, postact, w_down.T), preact


@_chained_mlp_last.register_fake
def _(x2, normed_w, rstd, gamma, w1, w_down):
    return x2.new_empty(x2.shape), x2.new_empty((x2.shape[0], w1.shape[0]))


def _mlp_setup(ctx, inputs, output):
    x2, normed_w, rstd, gamma, w1, w_down = inputs[:6]
    preact = output[-1]
    ctx.save_for_backward(x2, normed_w, rstd, gamma, w1, w_down, preact)
    ctx.mark_non_differentiable(*output[1:])  # normed3, rstd3 (hand-offs) and preact (saved)


def _mlp_grads(ctx, dx3):
    """(dx2, None, None, dgamma, dw1, dw_down) from dx3: swiglu_bwd_rms, the down wgrad,
    rms_bwd (gate/up dgrad + the norm backward + dresid = dx3), the gate/up wgrad."""
    x2, normed_w, rstd, gamma, w1, w_down, preact = ctx.saved_tensors
    need_x2, _, _, need_gamma, need_w1, need_wd = ctx.needs_input_grad[:6]
    dout = torch.zeros_like(x2) if dx3 is None else dx3.contiguous()
    dpreact, postact, zdz = swiglu_bwd_rms_op(dout, w_down, preact)
    dw_down = dout.T @ postact if need_wd else None
    dx2 = dgamma = None
    if need_x2 or need_gamma:
        dh, dg = rms_bwd_op(dpreact, w1, x2, gamma, rstd, zdz, dout)
        dx2, dgamma = (dh if need_x2 else None), (dg.to(gamma.dtype) if need_gamma else None)
    dw1 = _wgrad(dpreact, normed_w, rstd, w1) if need_w1 else None
    return dx2, None, None, dgamma, dw1, dw_down


def _mlp_backward(ctx, dx3, _dnormed3, _drstd3, _dpreact):
    return (*_mlp_grads(ctx, dx3), None)


def _mlp_last_backward(ctx, dx3, _dpreact):
    return _mlp_grads(ctx, dx3)


_chained_mlp.register_autograd(_mlp_backward, setup_context=_mlp_setup)
_chained_mlp_last.register_autograd(_mlp_last_backward, setup_context=_mlp_setup)


def chained_mlp(
    x2: torch.Tensor,
    normed_w2: torch.Tensor,
    rstd2: torch.Tensor,
    g2: torch.Tensor,
    w1: torch.Tensor,
    w_down: torch.Tensor,
    g_next: torch.Tensor | None = None,
    *,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The MLP half, chained (CODA items 2 + 3 + 7 + 8): ``x3 = x2 + SwiGLU(RMSNorm(x2) W1^T) W_down^T``
    with ``RMSNorm(x2) = normed_w2 * rstd2`` (gate/up interleaved in w1, as ``swiglu``).

    Args:
        x2: (M, D) bf16 residual stream (differentiable).
        normed_w2: (M, D) bf16 ``x2 * g2``; rstd2: (M,) fp32 (from :func:`chained_out_proj`;
            not differentiable: this op's backward is their norm's backward).
        g2: (D,) bf16 the norm weight normed_w2 was made with (differentiable).
        w1: (2I, D) bf16 gate/up rows interleaved; w_down: (D, I) bf16; I a multiple of 8.
        g_next: None (last layer) or (D,) bf16 the next layer's input-norm weight (no
            gradient from here).
        eps: RMSNorm epsilon of rstd3 (keyword), default 1e-6; Llama-3 uses 1e-5.
    Returns:
        (x3, normed_w3, rstd3): x3 (M, D) bf16 (differentiable); with g_next,
        ``normed_w3 = x3 * g_next`` (M, D) bf16 and rstd3 (M,) fp32 for the next layer's
        :func:`chained_qkv_rope` (not differentiable), else None, None.
    Raises:
        ValueError: inconsistent shapes, a wrong dtype, a non-contiguous tensor, rows not a
            multiple of 16 bytes, tensors not on one CUDA device, or a bad eps.
        ModuleNotFoundError: gemm_rmsnorm_swiglu / gemm_residual_partial_rms (forward) or
            swiglu_bwd_rms / rms_bwd (backward) not accepted yet.
    Forward: ``gemm_rmsnorm_swiglu`` (preact saved, postact), then the down projection:
    ``gemm_residual_partial_rms`` with g_next (residual add + the next norm's statistics),
    else cuBLAS addmm with x2 as C. Backward from dx3: ``swiglu_bwd_rms`` (dpreact, postact,
    zdz2), dW_down = dx3^T postact, ``rms_bwd(dpreact, w1, x2, g2, rstd2, zdz2, dresid=dx3)``
    (dx2: the full residual-stream gradient; dg2), dW1 = dpreact^T (normed_w2 * rstd2).
    Works under ``torch.compile``.
    """
    op = "chained_mlp"
    _expect(
        x2.dim() == 2
        and w1.dim() == 2
        and w_down.dim() == 2
        and w1.shape[0] % 2 == 0
        and tuple(normed_w2.shape) == tuple(x2.shape)
        and tuple(rstd2.shape) == (x2.shape[0],)
        and tuple(g2.shape) == (x2.shape[1],)
        and w1.shape[1] == x2.shape[1]
        and tuple(w_down.shape) == (x2.shape[1], w1.shape[0] // 2)
        and (g_next is None or tuple(g_next.shape) == (x2.shape[1],)),
        op,
        lambda: (
            f"need x2 (M, D), normed_w2 (M, D), rstd2 (M,), g2 (D,), w1 (2I, D), w_down (D, I), g_next "
            f"(D,) or None; got {', '.join(_shape(t) for t in (x2, normed_w2, rstd2, g2, w1, w_down))}, "
            f"{None if g_next is None else _shape(g_next)}"
        ),
    )
    more = {} if g_next is None else {"g_next": (g_next, BF16)}
    _pkg._check_layout(
        op,
        {"I (half of w1's rows)": w1.shape[0] // 2},
        x2=(x2, BF16),
        normed_w2=(normed_w2, BF16),
        rstd2=(rstd2, FP32),
        g2=(g2, BF16),
        w1=(w1, BF16),
        w_down=(w_down, BF16),
        **more,
    )
    _pkg._check_device(
        op, x2=x2, normed_w2=normed_w2, rstd2=rstd2, g2=g2, w1=w1, w_down=w_down, **{k: t for k, (t, _) in more.items()}
    )
    eps = _check_eps(op, eps)
    if g_next is None:
        x3, _ = _chained_mlp_last(x2, normed_w2, rstd2, g2, w1, w_down)
        return x3, None, None
    x3, normed_w3, rstd3, _ = _chained_mlp(x2, normed_w2, rstd2, g2, w1, w_down, g_next)
    return x3, normed_w3, _with_eps(rstd3, eps)


# --------------------------------------------------------------------------- the layer


def causal_gqa_attention(
    qkv: torch.Tensor, *, seq_len: int, n_q_heads: int, n_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """Causal grouped-query SDPA over sequences of ``seq_len`` tokens (torch autograd):
    qkv (M, (HQ + 2 HKV) HD) -> (M, HQ HD), M a multiple of seq_len."""
    m = qkv.shape[0]
    q, k, v = qkv.split((n_q_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim), dim=1)

    def heads(t: torch.Tensor, h: int) -> torch.Tensor:
        return t.reshape(m // seq_len, seq_len, h, head_dim).transpose(1, 2)

    o = F.scaled_dot_product_attention(
        heads(q, n_q_heads), heads(k, n_kv_heads), heads(v, n_kv_heads), is_causal=True, enable_gqa=True
    )
    return o.transpose(1, 2).reshape(m, n_q_heads * head_dim)


def chained_layer(
    x: torch.Tensor,
    normed_w1: torch.Tensor,
    rstd1: torch.Tensor,
    g1: torch.Tensor,
    w_qkv: torch.Tensor,
    w_o: torch.Tensor,
    g2: torch.Tensor,
    w1: torch.Tensor,
    w_down: torch.Tensor,
    g_next: torch.Tensor | None = None,
    *,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    seq_len: int,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float = EPS,
    attention: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A pre-norm Llama-3 decoder layer from the chained ops:
    ``x2 = x + Attn(RoPE(RMSNorm(x) W_qkv^T)) W_o^T``, ``x3 = x2 + SwiGLU(RMSNorm(x2) W1^T) W_down^T``.

    Args: x (M, D) bf16; ``(normed_w1, rstd1)`` its deferred norm (:func:`chain_start` for
    the first layer, the previous layer's outputs after); the layer's weights g1 (D,),
    w_qkv, w_o (D, HQ HD), g2 (D,), w1 (2I, D), w_down (D, I), all bf16; g_next the next
    layer's g1 or None (last layer); positions, inv_freq, head counts as ``qkv_rope``; eps
    the norms' epsilon; ``attention(qkv) -> (M, HQ HD)`` (default
    :func:`causal_gqa_attention` over sequences of ``seq_len`` tokens).
    Returns: ``(x3, normed_w3, rstd3)`` as :func:`chained_mlp`.
    Raises: the ops' ValueError / ModuleNotFoundError.
    Backward: MLP (swiglu_bwd_rms, rms_bwd with dresid = dx3: dx2), out-projection (plain
    dgrad / wgrad; dx2 routed to the QKV op through the port), SDPA's, QKV (R^T + zdz1,
    rms_bwd with dresid = dx2: dx). Gradients reach x and every weight, none through
    normed_w1 / rstd1.
    """
    heads = {"n_q_heads": n_q_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    qkv, port = chained_qkv_rope(x, normed_w1, rstd1, g1, w_qkv, positions, inv_freq, **heads)
    attn = causal_gqa_attention(qkv, seq_len=seq_len, **heads) if attention is None else attention(qkv)
    x2, normed_w2, rstd2 = chained_out_proj(attn.contiguous(), w_o, x, g2, port, eps=eps)
    return chained_mlp(x2, normed_w2, rstd2, g2, w1, w_down, g_next, eps=eps)

"""QKV projection + RoPE family (CODA catalogue items 5 and 10).

Public ops: ``qkv_rope``, ``deferred_rmsnorm_qkv_rope`` (autograd), ``rope_bwd_op`` (the
rope_bwd kernel as a plain custom op); kernel wrappers ``gemm_rope_op``,
``gemm_rmsnorm_rope_op``. See the package docstring for the math. ``load`` /
``_check_device`` are looked up through the package at call time.

Head counts are ints: ``n_q_heads`` / ``n_kv_heads`` / ``head_dim`` in this API; at the
kernel entry the specs' keyword-only constants (``constants = ["HQ", "HKV"]``, with
HD = 2 * len(inv_freq)). The glue offers HQ, HKV and HD and run_kernel passes the ones the
entry declares, so a spec that adds HD needs no change here.
"""

from __future__ import annotations

import torch

from ._registry import _expect, _pkg, _stat_dtype, run_kernel
from ._rmsnorm import deferred_linear_grads


@torch.library.custom_op("coda_agent::rope_cos_sin", mutates_args=())
def _rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``theta[m, j] = positions[m] * inv_freq[j]``: positions (M,) int64,
    inv_freq (HD/2,) fp32 -> cos, sin, each (M, HD/2) in ``dtype``, angles in float64.

    A custom op so that ``torch.compile`` keeps this table *materialized*: traced, Inductor
    inlines the float64 sin/cos into the rotation's pointwise kernel and evaluates them once
    per element, (M, N) instead of (M, HD/2): 0.51 ms of GPU time at llama3-8b, M = 8192,
    against 0.22 ms for the standard definition's backward rotation
    (``probes/op_training_step.py --profile``, H200, 2026-12-01)."""
    theta = positions[:, None] * inv_freq.double()[None, :]  # int64 * float64 -> float64
    return theta.cos().to(dtype), theta.sin().to(dtype)


@_rope_cos_sin.register_fake
def _(positions, inv_freq, dtype):
    shape = (positions.shape[0], inv_freq.shape[0])
    return positions.new_empty(shape, dtype=dtype), positions.new_empty(shape, dtype=dtype)


def _traced() -> bool:
    """True while torch.compile traces the calling code. Dynamo sets
    ``torch.compiler.is_compiling()``; AOTAutograd's tracing of a custom op's registered
    backward shows on torch 2.11 (the H200's, measured) and 2.12 (its source has no compile
    session flag) only as an active proxy-tensor mode; 2.13 keeps the flag up for the whole
    compile."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return torch.compiler.is_compiling() or get_proxy_mode() is not None


def rope_rotate(
    t: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, n_rot: int, *, inverse: bool = False
) -> torch.Tensor:
    """Interleaved-pair RoPE (Meta Llama / RoFormer) of the first ``n_rot`` columns of ``t``
    (the query and key heads), the other columns (value heads) unchanged.

    t: (M, N) floating, N and ``n_rot`` whole heads of HD = 2 * len(inv_freq) columns;
    positions: (M,) integer; inv_freq: (HD/2,) floating (no gradient flows into it).
    Pair (2j, 2j+1) of every rotated head at row m turns by theta = positions[m] * inv_freq[j] (``inverse``:
    by -theta, i.e. R^T, the backward). Angles in float64 (:func:`_rope_cos_sin`), the
    rotation in fp32 (or wider), one rounding to ``t``'s dtype -- as the specs' references.
    Traced by ``torch.compile`` (:func:`_traced`) it is one pointwise expression over
    (M, heads, HD/2, 2) (the value heads selected by ``torch.where``, not concatenated), so
    Inductor emits a single bandwidth-bound kernel; eager, it rotates only the Q/K heads and
    concatenates (fewer full-width passes). The two forms give the same bits (tested); the
    code Inductor generates from the traced form may round differently (FMA contraction).

    Raises:
        ValueError: N or ``n_rot`` not a whole number of heads, ``n_rot`` outside [0, N], or
            an empty ``inv_freq``."""
    acc = _stat_dtype(t)
    half = inv_freq.shape[0]
    hd = 2 * half
    if hd == 0 or t.shape[1] % hd or n_rot % hd or not 0 <= n_rot <= t.shape[1]:
        raise ValueError(
            f"rope_rotate: N = {t.shape[1]} and n_rot = {n_rot} must be multiples of "
            f"head_dim = 2 * len(inv_freq) = {hd} > 0, with 0 <= n_rot <= N"
        )
    # the ops give inv_freq no gradient (documented): a trainable one gets none from here, and
    # the custom op needs no autograd formula (double backward works)
    cos, sin = _rope_cos_sin(positions, inv_freq.detach(), acc)
    cos, sin = cos[:, None, :], (-sin if inverse else sin)[:, None, :]
    if not _traced():  # eager: rotate only the Q/K heads, then concatenate
        x, y = t[:, :n_rot].to(acc).unflatten(1, (n_rot // hd, half, 2)).unbind(-1)
        rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).flatten(1)
        return torch.cat((rotated.to(t.dtype), t[:, n_rot:]), dim=1)
    pairs = t.to(acc).unflatten(1, (t.shape[1] // hd, half, 2))  # (M, heads, HD/2, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1)
    rotates = torch.arange(pairs.shape[1], device=t.device)[None, :, None, None] < n_rot // hd
    return torch.where(rotates, rotated, pairs).flatten(1).to(t.dtype)


def _consts(n_q_heads: int, n_kv_heads: int, head_dim: int) -> dict[str, int]:
    return {"HQ": n_q_heads, "HKV": n_kv_heads, "HD": head_dim}


def _check_rope(op, x, w, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, rstd=None, names=("x", "w_qkv")):
    """Shapes, head counts, dtypes (bf16 x / w, int64 positions, fp32 inv_freq and rstd),
    layout and device of a RoPE op's arguments; ValueError naming ``op`` (messages are
    built only on failure: see ``_expect``)."""
    _expect(
        head_dim > 0 and head_dim % 2 == 0 and n_q_heads > 0 and n_kv_heads > 0,
        op,
        lambda: (
            f"need positive head counts and an even head_dim, got n_q_heads={n_q_heads}, "
            f"n_kv_heads={n_kv_heads}, head_dim={head_dim}"
        ),
    )
    n = (n_q_heads + 2 * n_kv_heads) * head_dim
    _expect(
        x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1] and w.shape[0] == n,
        op,
        lambda: (
            f"need {names[0]} (M, K) and {names[1]} ((n_q_heads + 2 * n_kv_heads) * head_dim = {n}, K), "
            f"got {tuple(x.shape)} and {tuple(w.shape)}"
        ),
    )
    _expect(
        tuple(positions.shape) == (x.shape[0],),
        op,
        lambda: f"positions must be (M,) = ({x.shape[0]},), got {tuple(positions.shape)}",
    )
    _expect(
        tuple(inv_freq.shape) == (head_dim // 2,),
        op,
        lambda: f"inv_freq must be (head_dim / 2,) = ({head_dim // 2},), got {tuple(inv_freq.shape)}",
    )
    # inv_freq fp32: a model cast with .to(torch.bfloat16) turns an inv_freq buffer into bf16,
    # whose 8-bit mantissa puts angles at position ~8k off by whole turns
    tensors = {
        names[0]: (x, torch.bfloat16),
        names[1]: (w, torch.bfloat16),
        "positions": (positions, torch.int64),
        "inv_freq": (inv_freq, torch.float32),
    }
    if rstd is not None:
        _expect(
            tuple(rstd.shape) == (x.shape[0],),
            op,
            lambda: f"rstd must be (M,) = ({x.shape[0]},), got {tuple(rstd.shape)}",
        )
        tensors["rstd"] = (rstd, torch.float32)
    _pkg._check_layout(op, {"(n_q_heads + 2 * n_kv_heads) * head_dim (the output's columns)": n}, **tensors)
    _pkg._check_device(op, **{k: t for k, (t, _) in tensors.items()})


# --------------------------------------------------------------------------- kernel ops


@torch.library.custom_op("coda_agent::gemm_rope", mutates_args=())
def gemm_rope_op(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Fused QKV GEMM + RoPE (item 5). x (M, K) bf16, w_qkv ((HQ+2HKV)*HD, K) bf16,
    positions (M,) int64, inv_freq (HD/2,) fp32 -> qkv (M, (HQ+2HKV)*HD) bf16."""
    (qkv,) = run_kernel("gemm_rope", x, w_qkv, positions, inv_freq, **_consts(n_q_heads, n_kv_heads, head_dim))
    return qkv


@gemm_rope_op.register_fake
def _(x, w_qkv, positions, inv_freq, *, n_q_heads, n_kv_heads, head_dim):
    return x.new_empty((x.shape[0], w_qkv.shape[0]))


@torch.library.custom_op("coda_agent::gemm_rmsnorm_rope", mutates_args=())
def gemm_rmsnorm_rope_op(
    a: torch.Tensor,
    rstd: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Fused QKV GEMM + deferred rstd + RoPE (item 5). a (M, K) bf16, rstd (M,) fp32,
    w_qkv ((HQ+2HKV)*HD, K) bf16, positions (M,) int64, inv_freq (HD/2,) fp32 -> qkv bf16."""
    (qkv,) = run_kernel(
        "gemm_rmsnorm_rope", a, rstd, w_qkv, positions, inv_freq, **_consts(n_q_heads, n_kv_heads, head_dim)
    )
    return qkv


@gemm_rmsnorm_rope_op.register_fake
def _(a, rstd, w_qkv, positions, inv_freq, *, n_q_heads, n_kv_heads, head_dim):
    return a.new_empty((a.shape[0], w_qkv.shape[0]))


@torch.library.custom_op("coda_agent::rope_bwd", mutates_args=())
def rope_bwd_op(
    g: torch.Tensor,
    w: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """RoPE backward fused into the GEMM producing the gradient (CODA item 10), no autograd.

    ``dqkv = R^T (g @ w^T)``: the query/key column pairs (2j, 2j+1) of ``g @ w^T`` rotated by
    ``-positions[m] * inv_freq[j]`` (the transpose of :func:`qkv_rope`'s rotation), the
    value columns unchanged. Use it where the GEMM that produces the rotated-qkv gradient
    is your own (e.g. an attention backward): the result is the gradient w.r.t. the
    unrotated projection output.

    Args:
        g: (M, K) bf16, the producing GEMM's A operand, contiguous.
        w: ((n_q_heads + 2 * n_kv_heads) * head_dim, K) bf16, its B operand (nn.Linear layout).
        positions: (M,) int64 token positions (the forward's).
        inv_freq: (head_dim / 2,) fp32 RoPE inverse frequencies.
        n_q_heads, n_kv_heads, head_dim: keyword-only ints (the spec's HQ, HKV; HD = 2 * len(inv_freq)).
    Returns:
        dqkv (M, (n_q_heads + 2 * n_kv_heads) * head_dim) bf16.
    Raises:
        ValueError: inconsistent shapes / head counts, a wrong dtype (bf16; positions int64;
            inv_freq and rstd fp32), a non-contiguous tensor, rows not a multiple of 16 bytes,
            or tensors not on one CUDA device.
        ModuleNotFoundError: when rope_bwd is not accepted yet.
    A ``torch.library`` custom op (``coda_agent::rope_bwd``): one node under ``torch.compile``.
    """
    _check_rope("rope_bwd_op", g, w, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, names=("g", "w"))
    (dqkv,) = run_kernel("rope_bwd", g, w, positions, inv_freq, **_consts(n_q_heads, n_kv_heads, head_dim))
    return dqkv


@rope_bwd_op.register_fake
def _(g, w, positions, inv_freq, *, n_q_heads, n_kv_heads, head_dim):
    return g.new_empty((g.shape[0], w.shape[0]))


# --------------------------------------------------------------------------- qkv_rope


@torch.library.custom_op("coda_agent::qkv_rope", mutates_args=())
def _qkv_rope(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    return run_kernel("gemm_rope", x, w_qkv, positions, inv_freq, **_consts(n_q_heads, n_kv_heads, head_dim))[0]


@_qkv_rope.register_fake
def _(x, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    return x.new_empty((x.shape[0], w_qkv.shape[0]))


def _qkv_rope_setup(ctx, inputs, output):
    x, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim = inputs
    ctx.n_rot = (n_q_heads + n_kv_heads) * head_dim
    ctx.save_for_backward(x, w_qkv, positions, inv_freq)


def _qkv_rope_backward(ctx, dqkv):
    x, w_qkv, positions, inv_freq = ctx.saved_tensors
    dpre = rope_rotate(dqkv, positions, inv_freq, ctx.n_rot, inverse=True).to(x.dtype)
    need_x, need_w = ctx.needs_input_grad[:2]
    return dpre @ w_qkv if need_x else None, dpre.T @ x if need_w else None, None, None, None, None, None


_qkv_rope.register_autograd(_qkv_rope_backward, setup_context=_qkv_rope_setup)


def qkv_rope(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Fused QKV projection + rotary embedding (CODA item 5): ``RoPE(x @ w_qkv^T)``.

    Columns of the result: ``n_q_heads`` query heads, then ``n_kv_heads`` key heads, then
    ``n_kv_heads`` value heads, ``head_dim`` contiguous columns each. In every query and key
    head the pair (2j, 2j+1) at row m turns by ``theta = positions[m] * inv_freq[j]``:
    ``(x cos - y sin, x sin + y cos)`` (Meta Llama / RoFormer interleaved pairs; HF's
    rotate_half layout is the same after permuting w_qkv's rows per head); value heads pass
    through.

    Args:
        x: (M, K) bf16 activations, contiguous.
        w_qkv: ((n_q_heads + 2 * n_kv_heads) * head_dim, K) bf16, nn.Linear layout.
        positions: (M,) int64 token positions (no gradient).
        inv_freq: (head_dim / 2,) fp32 inverse frequencies, e.g. 1 / 500000^(2j / head_dim)
            (no gradient).
        n_q_heads, n_kv_heads, head_dim: keyword-only ints.
    Returns:
        qkv (M, (n_q_heads + 2 * n_kv_heads) * head_dim) bf16.
    Raises:
        ValueError: inconsistent shapes / head counts, a wrong dtype (bf16; positions int64;
            inv_freq and rstd fp32), a non-contiguous tensor, rows not a multiple of 16 bytes,
            or tensors not on one CUDA device.
        ModuleNotFoundError: when gemm_rope is not accepted yet.
    Forward: the ``gemm_rope`` kernel. Backward (plain torch): the inverse rotation R^T of the
    incoming gradient (fp32 math, float64 angles), then the dgrad / wgrad GEMMs. Gradients
    reach x and w_qkv; works under ``torch.compile``.
    """
    _check_rope("qkv_rope", x, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)
    return _qkv_rope(x, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)


# --------------------------------------------------------------------------- deferred_rmsnorm_qkv_rope


@torch.library.custom_op("coda_agent::deferred_rmsnorm_qkv_rope", mutates_args=())
def _deferred_qkv_rope(
    a: torch.Tensor,
    rstd: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    return run_kernel(
        "gemm_rmsnorm_rope", a, rstd, w_qkv, positions, inv_freq, **_consts(n_q_heads, n_kv_heads, head_dim)
    )[0]


@_deferred_qkv_rope.register_fake
def _(a, rstd, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    return a.new_empty((a.shape[0], w_qkv.shape[0]))


def _deferred_qkv_rope_setup(ctx, inputs, output):
    a, rstd, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim = inputs
    ctx.n_rot = (n_q_heads + n_kv_heads) * head_dim
    ctx.save_for_backward(a, rstd, w_qkv, positions, inv_freq)


def _deferred_qkv_rope_backward(ctx, dqkv):
    a, rstd, w_qkv, positions, inv_freq = ctx.saved_tensors
    dpre = rope_rotate(dqkv, positions, inv_freq, ctx.n_rot, inverse=True).to(a.dtype)
    da, drstd, dw = deferred_linear_grads(dpre, a, rstd, w_qkv, ctx.needs_input_grad)
    return da, drstd, dw, None, None, None, None, None


_deferred_qkv_rope.register_autograd(_deferred_qkv_rope_backward, setup_context=_deferred_qkv_rope_setup)


def deferred_rmsnorm_qkv_rope(
    a: torch.Tensor,
    rstd: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """QKV projection + RoPE on a deferred RMSNorm (CODA item 5):
    ``RoPE((a * rstd[:, None]) @ w_qkv^T)``, the rotation as in :func:`qkv_rope`.

    ``a = y * gamma`` and ``rstd`` come from :func:`residual_rmsnorm`, so the projection's
    input is ``RMSNorm(y)``; the row scale is applied to the GEMM's fp32 accumulator.

    Args:
        a: (M, K) bf16 (``normed_w`` of residual_rmsnorm), contiguous.
        rstd: (M,) fp32 row scale.
        w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim: as in :func:`qkv_rope`.
    Returns:
        qkv (M, (n_q_heads + 2 * n_kv_heads) * head_dim) bf16.
    Raises:
        ValueError: inconsistent shapes / head counts, a wrong dtype (bf16; positions int64;
            inv_freq and rstd fp32), a non-contiguous tensor, rows not a multiple of 16 bytes,
            or tensors not on one CUDA device.
        ModuleNotFoundError: when gemm_rmsnorm_rope is not accepted yet.
    Forward: the ``gemm_rmsnorm_rope`` kernel. Backward (plain torch): R^T of the incoming
    gradient, then ``da = (dq @ w) * rstd``, ``drstd = sum((dq @ w) * a, -1)``,
    ``dw = dq^T @ (a * rstd)``. Gradients reach a, rstd and w_qkv; works under ``torch.compile``.
    """
    _check_rope(
        "deferred_rmsnorm_qkv_rope",
        a,
        w_qkv,
        positions,
        inv_freq,
        n_q_heads,
        n_kv_heads,
        head_dim,
        rstd=rstd,
        names=("a", "w_qkv"),
    )
    return _deferred_qkv_rope(a, rstd, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)

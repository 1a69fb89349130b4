"""Accepted kernels as training ops: ``from coda_agent.kernels import swiglu, rmsnorm_linear, ...``.

``generated_kernels/<op>/kernel.py`` files are LLM-written and accepted by the verifier;
the ``_*.py`` modules of this package are the hand-reviewed glue that turns them into
autograd-capable, ``torch.compile``-compatible ops:

* each accepted kernel is wrapped as a ``torch.library`` custom op
  (``coda_agent::<kernel>``, Python name ``<kernel>_op``) with a fake (meta)
  implementation, so torch.compile treats it as one opaque node instead of tracing into
  CuTeDSL;
* every training op below is a composite custom op (``coda_agent::<op>``; ``swiglu``'s
  is ``coda_agent::swiglu_mlp``; one node under torch.compile) with
  ``register_autograd``: its backward runs the fused backward kernel
  where the catalogue has one, plain torch otherwise. The exception is ``rmsnorm_linear``:
  torch code (rstd, ``h * gamma``, which torch.compile traces and fuses) around the
  ``deferred_rmsnorm_linear`` custom op; and ``linear_fp8_quant``, not differentiable:
  argument checks around the ``gemm_fp8_quant`` custom op.

The kernel wrappers (``<kernel>_op``) check device, architecture, contiguity and 16-byte
base pointers of what they pass on; the training ops and ``rope_bwd_op`` / ``rms_bwd_op`` /
``swiglu_bwd_rms_op`` also check shapes and dtypes.

Kernel modules are imported lazily (first call), so ``import coda_agent.kernels`` works on
machines without a GPU, triton or quack. They are imported under their package path
(``coda_agent.kernels.<kernel>.kernel``): quack keys its compile cache by module +
function, so a stable import name lets compiled kernels be found again. Importing it binds
``coda_agent.kernels.<kernel>`` to the kernel's folder (a namespace package), so no Python
name in this package may equal a kernel folder's name: the kernel wrappers are ``<kernel>_op``.

Layout: ``_registry.py`` (``load``, ``accepted``, the argument checks, ``run_kernel``),
``_swiglu.py``, ``_rmsnorm.py``, ``_rope.py``, ``_qknorm.py``, ``_cross_entropy.py``,
``_fp8.py``, ``_chain.py`` (the chained layer). The family modules look
``load``, ``_check_device`` and ``_check_layout`` up through this package at call time, so
``monkeypatch.setattr(coda_agent.kernels, "load", ...)`` reaches every op (the CPU tests run
the specs' PyTorch baselines as stand-ins for the kernels that way).

All ops take bf16 contiguous 2-D activations / nn.Linear-layout weights (fp32 ``rstd`` and
``inv_freq``, int64 ``positions`` and ``target``) on one CUDA device and raise ``ValueError``
otherwise, naming the op and the argument (``ModuleNotFoundError`` naming the kernel when
one is not accepted yet); the kernel custom ops also refuse a GPU that is not sm_90
(compute capability 9.0). Every contiguous row a kernel reads or writes must be 16 bytes
aligned (TMA): in bf16 K, N, V, the SwiGLU width I and the QKV width multiples of 8 (M is
free): the domain the verifier checked the kernels on. The checks build their messages
only on failure, so under ``torch.compile`` they add guards but never specialize on M.
Backward passes skip the dgrad / wgrad GEMMs of inputs that do not require grad (frozen
weights, LoRA), except ``linear_cross_entropy``'s: its ``cross_entropy_bwd`` kernel computes
dh and dw_vocab in one call. CODA catalogue item numbers in brackets.

SwiGLU MLP -- ``swiglu(x, w1, w_down)`` [1 + 7]
    ``(silu(gate) * up) @ w_down^T`` with ``preact = x @ w1^T`` (M, 2I), gate/up interleaved
    (``gate = preact[:, 0::2]``, ``up = preact[:, 1::2]``). Forward: ``swiglu_fwd`` (GEMM +
    SwiGLU epilogue) then the down-projection GEMM; only ``preact`` is saved. Backward:
    ``swiglu_bwd`` fuses the down projection's dgrad GEMM with the SwiGLU backward and
    recomputes ``postact`` (for the down projection's wgrad); the other GEMMs are plain.
    The kernels' fast sigmoid (also ``gemm_rmsnorm_swiglu``'s) is 0 for gates below -87.34
    (sigmoid under 2^-126): silu and its derivative are then 0 instead of values below
    1.03e-36 in magnitude, far below bf16 rounding (``_swiglu.FLUSHED_GATE``).

Residual + RMSNorm statistics -- ``residual_rmsnorm(x, w_o, residual, gamma, *, eps=1e-6)`` [3]
    ``y = x @ w_o^T + residual`` -> ``(resid_out = y, normed_w = y * gamma,
    rstd = rsqrt(mean(y^2) + eps))``, rstd fp32, deferred to the next GEMM. Forward:
    ``gemm_residual_partial_rms`` (it finalizes rstd with 1e-6; another eps re-finalizes
    it exactly in one (M,) torch pass). Backward: plain torch through all three outputs
    (``d rstd / d y = -rstd^3 y / N``), then the dgrad / wgrad GEMMs.

RMSNorm -> linear -- ``rmsnorm_linear(h, gamma, w, *, eps=1e-6)`` [4]
    ``RMSNorm(h) @ w^T``, ``RMSNorm(h) = (h * rstd).to(h.dtype) * gamma``, stats fp32.
    Forward: rstd and ``h * gamma`` in torch, ``gemm_rmsnorm`` (rstd in the epilogue).
    Backward: plain torch (that of ``deferred_rmsnorm_linear``, then autograd through rstd).
    ``rms_bwd_op(dy, w, h, gamma, rstd, zdz, dresid)`` [8]: the ``rms_bwd`` kernel (dgrad
    GEMM + RMSNorm backward: dh, dgamma) as a plain custom op, for a caller whose producing
    backward emits ``zdz = sum_n dy * out / D``; with zdz computed in torch it is slower
    than the plain backward (measured: see ``rmsnorm_linear``'s docstring).

Deferred-RMSNorm consumers (inputs ``a = normed_w``, ``rstd`` of residual_rmsnorm)
    ``deferred_rmsnorm_linear(a, rstd, w) = (a * rstd) @ w^T`` [4]: forward ``gemm_rmsnorm``.
    ``deferred_rmsnorm_swiglu(normed_w, rstd, w1) -> (preact, postact)`` [2]: forward
    ``gemm_rmsnorm_swiglu``. Backward of both: plain torch (SwiGLU backward; ``da = (dy @ w) *
    rstd``, ``drstd = sum((dy @ w) * a, -1)``, ``dw = dy^T @ (a * rstd)``).
    ``deferred_rmsnorm_swiglu_mlp(normed_w, rstd, w1, w_down)`` [2 + 7]: the whole MLP,
    forward ``gemm_rmsnorm_swiglu`` then the down projection, backward ``swiglu_bwd`` (the
    down projection's dgrad + SwiGLU backward), then those deferred-rstd grads.

QKV + RoPE -- ``qkv_rope(x, w_qkv, positions, inv_freq, *, n_q_heads, n_kv_heads, head_dim)``,
``deferred_rmsnorm_qkv_rope(a, rstd, w_qkv, positions, inv_freq, *, ...)`` [5]
    ``RoPE(x @ w_qkv^T)`` / ``RoPE((a * rstd) @ w_qkv^T)``: columns = HQ query, HKV key, HKV
    value heads of HD; pair (2j, 2j+1) of each query/key head turns by
    ``positions[m] * inv_freq[j]`` (Meta interleaved convention), value heads pass through.
    Forward: ``gemm_rope`` / ``gemm_rmsnorm_rope``. Backward: plain torch, R^T of the
    incoming gradient (fp32, float64 angles), then the dgrad / wgrad GEMMs (and the
    deferred-rstd grads).
    ``rope_bwd_op(g, w, positions, inv_freq, *, ...) = R^T (g @ w^T)`` [10]: the ``rope_bwd``
    kernel as a plain custom op (no autograd), for the GEMM that produces the rotated-qkv
    gradient (an attention backward).

QK-norm QKV + RoPE -- ``deferred_rmsnorm_qknorm_rope(a, rstd, w_qkv, positions, inv_freq,
q_norm_w, k_norm_w, *, ..., eps, fused)`` (``_qknorm``; Qwen3)
    ``RoPE(HeadRMSNorm((a * rstd) @ w_qkv^T))``: every query / key head RMS-normalized over
    its HD columns (fp32 statistics) and weighted by ``q_norm_w`` / ``k_norm_w`` (HD,),
    both in the interleaved order, then rotated as in ``qkv_rope``. Forward:
    ``gemm_qknorm_rope`` (qkv, qkv_pre and the per-head rstd in one GEMM) where it is
    accepted for HD = 128 and eps = 1e-6 (``qknorm_kernel_ready``), else ``gemm_rmsnorm``
    and the norm and rotation in torch. Backward: plain torch from the saved qkv_pre and
    per-head rstd (R^T, the per-head norm backward, the norm weights' gradients), then the
    deferred-rstd grads. ``gemm_qknorm_rope_bwd_op(g, w, qkv_pre, rstd_heads, positions,
    inv_freq, q_norm_w, k_norm_w, corr, *, ...)``: the ``gemm_qknorm_rope_bwd`` kernel as a
    plain custom op, for the GEMM that produces the gradient of qkv (an attention backward,
    which emits the per-head ``corr``). Its qkv_pre is p interleaved: ``gemm_qknorm_rope``
    stores qkv_pre pair-split (even columns, then odd ones), ``interleave_pairs(qkv_pre)``
    restores p.

LM head + cross-entropy -- ``linear_cross_entropy(h, w_vocab, target)`` [6 + 9]
    per-row fp32 ``loss = logsumexp(h @ w_vocab^T) - logit[target]`` (reduction none; rows
    with ``target == ignore_index``, default -100, get 0 and no gradient), logits never
    materialized. Forward: ``gemm_cross_entropy`` (saves lse). Backward:
    ``cross_entropy_bwd`` (logits recomputed, softmax from lse, dh and dw_vocab GEMMs).

FP8 quantized projection -- ``linear_fp8_quant(x, w, *, eps=1e-4) -> (y_fp8, y_scale)`` (``_fp8``)
    ``y = x @ w^T`` in fp32 (never stored), quantized 1x128 blockwise for the next FP8 GEMM
    (DeepSeek-V3's activation recipe, DeepGEMM's per_token_cast_to_fp8): per row m and
    block b of 128 columns ``y_scale[m, b] = max(max |y[m, block b]|, eps) / 448`` (fp32,
    (M, N/128)) and ``y_fp8 = e4m3(y / y_scale)`` (float8_e4m3fn (M, N), round to nearest
    even, saturating at +-448). N a multiple of 128. Forward: ``gemm_fp8_quant`` (verified
    with eps = 1e-4). Not differentiable: with grad enabled, an input that requires grad is
    a ValueError; the FP8 consumer's recipe computes this projection's backward in bf16 from
    x, w and its own gradient. ``linear_fp8_quant_torch(x, w, eps)``: the same math in
    PyTorch; ``dequantize_blockwise(y_fp8, y_scale)``: the fp32 values ``y_fp8 * y_scale``.

Chained layer -- ``chained_layer``, ``chain_start``, ``chained_qkv_rope``, ``chained_out_proj``,
``chained_mlp`` [2 + 3 + 5 + 7 + 8] (``_chain``; CODA paper section 3)
    A decoder layer whose backward runs no RMSNorm backward and no rstd pass of its own:
    every norm backward is ``rms_bwd`` in the dgrad GEMM of the norm's consumer, with the
    per-row correction ``zdz = (1/D) sum_n dpre_n pre_n`` reduced by the backward that
    produced ``dpre``. Rules:
    ``normed_w = z * g`` and ``rstd`` hand-offs are not differentiable (the consuming op's
    backward is their norm's backward; z and g get their gradients as that op's inputs).
    ``chain_start(x, g1) -> (normed_w1, rstd1)``: the first layer's, in torch, once per model.
    ``chained_qkv_rope(x, normed_w1, rstd1, g1, w_qkv, positions, inv_freq, *, heads) ->
    (qkv, resid_port)``: forward ``gemm_rmsnorm_rope``; backward R^T of dqkv and
    ``zdz1 = (1/D) sum dqkv * qkv`` in one pass, ``rms_bwd`` (dx with dresid = the port's
    gradient, dg1), the wgrad.
    ``chained_out_proj(attn, w_o, x, g2, resid_port, *, eps) -> (x2, normed_w2, rstd2)``:
    forward ``gemm_residual_partial_rms``; backward the dgrad / wgrad, x's residual gradient
    dx2 returned to the port, so it reaches the QKV op's ``rms_bwd`` as dresid (no add pass).
    ``chained_mlp(x2, normed_w2, rstd2, g2, w1, w_down, g_next, *, eps) -> (x3, normed_w3,
    rstd3)``: forward ``gemm_rmsnorm_swiglu`` then ``gemm_residual_partial_rms`` into the
    next layer's norm (cuBLAS addmm when ``g_next`` is None: the last layer, whose x3 the
    model's final norm takes in torch); backward ``swiglu_bwd_rms`` (dpreact, postact,
    zdz2), the down wgrad, ``rms_bwd`` (dx2 with dresid = dx3, dg2), the gate/up wgrad.
    ``chained_layer(x, normed_w1, rstd1, g1, w_qkv, w_o, g2, w1, w_down, g_next, *, positions,
    inv_freq, seq_len, heads, eps, attention=None) -> (x3, normed_w3, rstd3)``: the four
    with SDPA (``causal_gqa_attention``, torch autograd) between; stack it by handing
    ``(x3, normed_w3, rstd3)`` on with ``g_next`` = the next layer's g1.
    ``swiglu_bwd_rms_op(dout, w_down, preact) -> (dpreact, postact, zdz)``: the
    ``swiglu_bwd_rms`` kernel (swiglu_bwd [7] that also reduces zdz) as a plain custom op.

Why some backwards are plain torch: the catalogue's backward kernels fuse into the GEMM
that *produces* the gradient (swiglu_bwd: the down projection's dgrad; rms_bwd: the
consumer's dgrad; rope_bwd: the attention backward's GEMM). Inside an op whose incoming
gradient is already materialized there is no such GEMM to fuse into, except where the
op itself contains it (swiglu, linear_cross_entropy; rmsnorm_linear contains it too, but
rms_bwd also needs a per-row input that only a producing kernel gives for free).
"""

from __future__ import annotations

from ._chain import (
    causal_gqa_attention,
    chain_start,
    chained_layer,
    chained_mlp,
    chained_out_proj,
    chained_qkv_rope,
)
from ._cross_entropy import cross_entropy_bwd_op, gemm_cross_entropy_op, linear_cross_entropy
from ._fp8 import dequantize_blockwise, gemm_fp8_quant_op, linear_fp8_quant, linear_fp8_quant_torch
from ._qknorm import (
    deferred_rmsnorm_qknorm_rope,
    gemm_qknorm_rope_bwd_op,
    gemm_qknorm_rope_op,
    interleave_pairs,
    qknorm_kernel_ready,
)
from ._registry import KERNELS_DIR, _check_device, _check_layout, accepted, load, run_kernel  # noqa: F401  (first)
from ._rmsnorm import (
    deferred_rmsnorm_linear,
    deferred_rmsnorm_swiglu,
    deferred_rmsnorm_swiglu_mlp,
    gemm_residual_partial_rms_op,
    gemm_rmsnorm_op,
    gemm_rmsnorm_swiglu_op,
    residual_rmsnorm,
    rms_bwd_op,
    rmsnorm_linear,
)
from ._rope import deferred_rmsnorm_qkv_rope, gemm_rmsnorm_rope_op, gemm_rope_op, qkv_rope, rope_bwd_op
from ._swiglu import swiglu, swiglu_bwd_op, swiglu_bwd_rms_op, swiglu_fwd_op
from .hf import apply_coda, remove_coda  # Hugging Face Llama / Mistral / Qwen3 patch; transformers imported lazily

__all__ = [
    "accepted",
    "apply_coda",
    "causal_gqa_attention",
    "chain_start",
    "chained_layer",
    "chained_mlp",
    "chained_out_proj",
    "chained_qkv_rope",
    "cross_entropy_bwd_op",
    "deferred_rmsnorm_linear",
    "deferred_rmsnorm_qknorm_rope",
    "deferred_rmsnorm_qkv_rope",
    "deferred_rmsnorm_swiglu",
    "deferred_rmsnorm_swiglu_mlp",
    "dequantize_blockwise",
    "gemm_cross_entropy_op",
    "gemm_fp8_quant_op",
    "gemm_qknorm_rope_bwd_op",
    "gemm_qknorm_rope_op",
    "gemm_residual_partial_rms_op",
    "gemm_rmsnorm_op",
    "gemm_rmsnorm_rope_op",
    "gemm_rmsnorm_swiglu_op",
    "gemm_rope_op",
    "interleave_pairs",
    "linear_cross_entropy",
    "linear_fp8_quant",
    "linear_fp8_quant_torch",
    "load",
    "qknorm_kernel_ready",
    "qkv_rope",
    "remove_coda",
    "residual_rmsnorm",
    "rms_bwd_op",
    "rmsnorm_linear",
    "rope_bwd_op",
    "swiglu",
    "swiglu_bwd_op",
    "swiglu_bwd_rms_op",
    "swiglu_fwd_op",
]

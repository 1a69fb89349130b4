"""Hugging Face Llama, Mistral and Qwen3 on the fused kernels in one line: ``apply_coda(model)``.

Usage (transformers 5.x; ``pip install 'coda-agent[hf]'``)::

    import torch
    from transformers import LlamaForCausalLM
    from coda_agent.kernels import apply_coda

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()
    apply_coda(model)              # in place, returns the model; before building the optimizer
    model = torch.compile(model)   # optional
    loss = model(input_ids, labels=labels).loss
    loss.backward()

What runs where (M = batch * sequence rows; "torch": plain PyTorch, which torch.compile
fuses when the model is compiled). Attention itself stays the model's own
(``config._attn_implementation``: SDPA by default; eager, flash and flex work the same way).

========================================  ================================  =================================
HF modules, per decoder layer             after ``apply_coda``              forward / backward kernels
========================================  ================================  =================================
input_layernorm, q/k/v_proj, RoPE         rstd in torch, then               ``gemm_rmsnorm_rope`` /
                                          ``deferred_rmsnorm_qkv_rope``     torch
Qwen3: the same with q_norm, k_norm       rstd in torch, then               ``gemm_qknorm_rope`` (else
before RoPE                               ``deferred_rmsnorm_qknorm_rope``  ``gemm_rmsnorm`` + torch) / torch
o_proj, residual add, statistics of       ``residual_rmsnorm``              ``gemm_residual_partial_rms``
post_attention_layernorm                                                    / torch
gate_proj, up_proj, SiLU * up, down_proj  ``deferred_rmsnorm_swiglu_mlp``   ``gemm_rmsnorm_swiglu`` /
                                          (``mlp="swiglu"``: ``swiglu``)    ``swiglu_bwd``
lm_head + loss (``fused_lm_head=True``,   ``linear_cross_entropy``          ``gemm_cross_entropy`` /
training mode, labels given)                                                ``cross_entropy_bwd``
embeddings, final norm, attention,        unchanged                         --
lm_head otherwise
========================================  ================================  =================================

The layer is :func:`coda_decoder_layer` (``benchmarks/llama_layer.py``'s ``coda_layer``,
``mlp="deferred_mlp"``: CODA paper section 3, a block as GEMM-epilogue programs), looked
up at call time, so a replacement (e.g. a chained backward) is one assignment to
``coda_agent.kernels.hf.coda_decoder_layer``.

This module holds the patched forwards and ``apply_coda``/``remove_coda``; the fused
weight layouts and the state-dict hooks are in ``_hf_layout.py``, the checks of what is
supported in ``_hf_checks.py``.

Parameters (fused, not packed per step). Each patched layer's ``self_attn.q_proj``,
``k_proj``, ``v_proj`` become one ``self_attn.qkv_proj`` (an ``nn.Linear`` without bias,
weight ((HQ + 2 HKV) HD, D): q rows, k rows, v rows, q and k rows permuted per head,
below) and ``mlp.gate_proj``, ``up_proj`` one ``mlp.gate_up_proj`` (weight (2I, D), row
2j = gate j, row 2j+1 = up j): the kernels read them as they are. Building them per
forward from the separate weights would copy them every step and copy their gradients
back: at llama3-8b widths 285 MB of weights, ~1.1 GB of traffic per layer and step, ~0.25
ms at the H200's bandwidth, against the fused layer's measured gain of ~0.64 ms per layer
(benchmarks/results/findings.md, ``benchmarks/llama_layer.py``, compiled).
``model.parameters()`` holds the fused weights instead of the five (no duplicates, same
element count); create the optimizer after ``apply_coda``. AdamW (elementwise) steps the
fused weight exactly as it would step the separate ones, and the global grad norm sums
the same elements.

RoPE layout. HF rotates pairs (j, j + HD/2) of each head (``rotate_half``), the kernels
pairs (2j, 2j+1) (Meta's interleaved convention). Permuting each q / k head's weight rows
by ``[0, HD/2, 1, HD/2 + 1, ...]`` (:func:`rope_row_permutation`) makes the kernel's
rotation equal to HF's up to that permutation of the head's columns; scores q . k are
invariant when q and k get the same permutation, so attention consumes the permuted q / k
as they are. v is untouched. The permutation is exact (a gather of whole rows) and
invertible. A KV cache written by a patched model holds permuted keys: use it only with
that patched model.

QK-norm (Qwen3). ``self_attn.q_norm`` / ``k_norm`` stay as they are (parameters under
HF's names); each forward reads their weights in the permuted column order
(:func:`~coda_agent.kernels._qknorm.interleave_head_weight`, a view: the per-head RMSNorm
is invariant under the permutation, the weight moves with its column). Whether the
projection runs on the ``gemm_qknorm_rope`` kernel is decided when the layer is patched:
where that kernel is accepted for the model's ``head_dim`` (128) and q_norm eps (1e-6)
(``qknorm_kernel_ready``), else on ``gemm_rmsnorm`` with the per-head norm and RoPE in
torch; ``model._coda.qk_norm_fused`` says which.

Checkpoints. ``state_dict()`` of a patched model has HF's keys, in HF's order, with HF's
shapes, dtypes and values (state-dict post-hooks unpack the fused weights: exact gathers;
those tensors are copies, so writing into them does not change the model: use
``load_state_dict``); ``load_state_dict`` takes HF's keys (load pre-hooks pack them; a
partial set of q/k/v or gate/up fills the rest from the model and reports the missing
HF keys under ``strict``). ``save_pretrained`` therefore writes an ordinary checkpoint;
``from_pretrained`` into an unpatched model gives bit-identical weights (tested). The HF
names stay attributes: ``self_attn.q_proj`` etc. are :class:`PackedPart` s, read-only
views whose ``.weight`` unpacks the fused weight (so DCP's ``get_model_state_dict``, which
walks key paths, works; tested). Pickling the whole module (``torch.save(model)``) is not
supported: call :func:`remove_coda` first (it restores the separate ``nn.Linear`` s,
exactly). Each patched layer keeps RoPE's inverse frequencies in a non-persistent fp32
buffer ``coda_inv_freq``: the rotary embedding's fp32 buffer as it is, or recomputed from the
config where that buffer was cast or is not materialized (a buffer further than
``INV_FREQ_RTOL`` from the config's values is refused); ``model.to(dtype)`` and
``to_empty`` (meta-device initialization) leave it fp32 and exact.

Supported (else ``ValueError`` naming the setting, or, with ``strict=False``, a warning
and that part left unpatched): ``config.model_type`` "llama", "mistral" or "qwen3"
(Mistral: the same layer, sliding window passed to attention as Mistral does; Qwen3: the
same layer with q_norm / k_norm, each layer's sliding window as its attention module
holds it; Qwen2 is not: its q/k/v projections have biases); ``hidden_act`` "silu";
``attention_bias`` and ``mlp_bias`` False; ``head_dim`` 64 or 128 (the RoPE kernels are verified for those);
``hidden_size`` and ``intermediate_size`` multiples of 8; ``rope_parameters['rope_type']``
"default", "linear" or "llama3" (they change inv_freq only; the kernels take inv_freq as
a tensor; "yarn" / "longrope" scale attention, "dynamic" changes frequencies with the
sequence length); bf16 weights (``dtype``), plain tensors (call ``apply_coda`` before
``fully_shard`` / tensor parallelism / quantization), transformers' own module classes;
with ``fused_lm_head``: a ``*ForCausalLM`` with ``vocab_size`` a multiple of 8, an
``lm_head`` without bias and the default loss (``loss_type`` "ForCausalLM").
``pretraining_tp`` is ignored, as transformers 5's Llama ignores it. At run time the ops
check that every tensor is on one sm_90 CUDA device (``ValueError`` otherwise).

Rows and masks: the kernels process the B * S flattened rows; positions are
``position_ids`` (any, e.g. packed sequences); the attention mask reaches attention
unchanged. ``output_attentions`` returns no attention weights (the attention module's
forward is not called).

LM head. ``fused_lm_head=None`` means :data:`DEFAULT_FUSED_LM_HEAD` (False): the plain
path (HF's ``lm_head`` then its loss) is faster compiled: a whole training step at
llama3-8b widths (8 layers, M = 8192, H200) takes 244.1 ms against 255.4 ms with the fused
head, which peaks 2.9 GiB lower (31.3 against 34.2 GiB); the head alone is 39.2 against
49.7 ms (``linear_cross_entropy`` recomputes the logits in its backward;
``benchmarks/results/2026-12-02-nvidia-h200-hf-llama.md``). So ``fused_lm_head=True`` is
the memory option: it never materializes the (M, V) fp32 logits (4.2 GB at M = 8192,
V = 128256) and returns ``logits=None``. It applies in training mode with ``labels`` (and
``logits_to_keep=0``); evaluation and generation take the plain path.

``torch.compile(model)``: the patched layer is torch code around ``torch.library`` custom
ops (no graph breaks in it; tested with ``fullgraph=True``). Gradient checkpointing
(``model.gradient_checkpointing_enable()``): the patched layer keeps HF's
``GradientCheckpointingLayer`` machinery (it is a subclass of the layer's class), the
custom ops recompute in the backward. FSDP2 (``fully_shard``, on paper and at world size
1 in the CPU tests): call ``apply_coda`` first. FSDP2 shards every parameter on dim 0, so
``qkv_proj.weight`` and ``gate_up_proj.weight`` are sharded across the fused rows like any
``nn.Linear`` weight; the all-gather before a layer's forward restores the full fused
weight, which is what the kernels read; gradients are reduce-scattered as usual. Sharding
is oblivious to the layout, so a rank's shard mixes permuted q, k and v rows: under
``state_dict()`` the hooks all-gather one fused weight at a time, unpack it and re-shard
each HF tensor like the fused one (``Shard(0)`` DTensors on the same mesh); loading
does the reverse (tested at world size 1: training step, ``state_dict``, DCP's
``get_model_state_dict`` / ``set_model_state_dict``). Meta-device initialization works
(patch on meta, ``fully_shard``, ``to_empty``, load). fp32 master weights (untested): patch
the bf16 model, then cast to fp32 and ``fully_shard`` with
``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``: the layers then see bf16 gathered
weights; without such a policy the ops refuse fp32 weights (``ValueError``). Tensor
parallelism (sharding q/k/v by heads) is not supported: the fused layout is not
head-aligned across q, k and v.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._hf_checks import (
    MODEL_TYPES,
    _base,
    _head_dim,
    _layer_problems,
    _lm_head_problems,
    _model_problems,
    _report,
    _require_transformers,
    _rope_problems,
)
from ._hf_layout import (  # noqa: F401  (PackedPart, unpack_*, rope_row_permutation: public through hf)
    _GATE_UP,
    PackedPart,
    _fuse_children,
    _qkv_fused,
    _unfuse_children,
    pack_gate_up,
    pack_qkv,
    rope_row_permutation,
    unpack_gate_up,
    unpack_qkv,
)
from ._qknorm import interleave_head_weight

# The package itself (partially initialized while its __init__ imports this module): the ops
# are looked up through it at call time, like the family modules' ``_pkg``.
assert __package__  # a submodule of coda_agent.kernels
K = importlib.import_module(__package__)

WEIGHT_DTYPE = torch.bfloat16
"""The dtype the kernels take for weights and activations."""

DEFAULT_FUSED_LM_HEAD = False
"""``apply_coda(fused_lm_head=None)``: the plain LM head (faster compiled; module docstring)."""

MLPS = ("deferred_mlp", "swiglu")
"""MLP wirings of :func:`coda_decoder_layer`: ``deferred_rmsnorm_swiglu_mlp`` on the deferred
norm (default), or ``swiglu`` on the normalized activations (``h2`` materialized)."""


# --------------------------------------------------------------------------- the layer's math


def coda_decoder_layer(
    x,
    g1,
    w_qkv,
    w_o,
    g2,
    w1,
    w_down,
    *,
    positions,
    inv_freq,
    attention: Callable,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    mlp: str = "deferred_mlp",
    q_norm_w: torch.Tensor | None = None,
    k_norm_w: torch.Tensor | None = None,
    qk_norm_eps: float = 1e-6,
    qk_norm_fused: bool = False,
):
    """One pre-norm Llama decoder layer through the fused ops (the wiring of
    ``benchmarks/llama_layer.py``'s ``coda_layer``); with ``q_norm_w`` / ``k_norm_w``, a
    QK-norm (Qwen3) layer.

    Args:
        x: (..., D) bf16 residual stream (flattened to M rows).
        g1, g2: (D,) bf16 input / post-attention RMSNorm weights.
        w_qkv: ((HQ + 2 HKV) HD, D) bf16 (:func:`pack_qkv` layout); w_o: (D, HQ HD) bf16.
        w1: (2I, D) bf16 gate/up interleaved (:func:`pack_gate_up`); w_down: (D, I) bf16.
        positions: (M,) int64; inv_freq: (HD/2,) fp32.
        attention: ``qkv (M, (HQ + 2 HKV) HD) -> (M, HQ HD)`` bf16, contiguous (the model's
            attention on the rotated, permuted heads).
        n_q_heads, n_kv_heads, head_dim: ints; eps: RMSNorm epsilon of both norms.
        mlp: one of :data:`MLPS`.
        q_norm_w, k_norm_w: None (Llama), or (HD,) bf16 per-head norm weights of the query
            and key heads in w_qkv's permuted column order: each query / key head of the
            projection is RMS-normalized (``qk_norm_eps``) and weighted before RoPE
            (:func:`~coda_agent.kernels.deferred_rmsnorm_qknorm_rope`, ``fused=qk_norm_fused``).
    Returns:
        x's shape, bf16, a new tensor (not a view: FSDP2 hooks layer outputs):
        ``x2 + MLP(RMSNorm(x2))`` with ``x2 = x + attention(RoPE(RMSNorm(x) W_qkv^T)) W_o^T``.
    Raises:
        ValueError: from the ops (dtypes, shapes, layout, device), or an unknown ``mlp``.
    """
    if mlp not in MLPS:
        raise ValueError(f"coda_decoder_layer: mlp must be one of {MLPS}, got {mlp!r}")
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    heads = {"n_q_heads": n_q_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    rstd = torch.rsqrt(x.to(torch.promote_types(x.dtype, torch.float32)).pow(2).mean(-1) + eps)
    if q_norm_w is None or k_norm_w is None:
        qkv = K.deferred_rmsnorm_qkv_rope(x * g1, rstd, w_qkv, positions, inv_freq, **heads)
    else:
        qkv = K.deferred_rmsnorm_qknorm_rope(
            x * g1, rstd, w_qkv, positions, inv_freq, q_norm_w, k_norm_w, **heads, eps=qk_norm_eps, fused=qk_norm_fused
        )
    x2, normed_w, rstd2 = K.residual_rmsnorm(attention(qkv), w_o, x, g2, eps=eps)
    if mlp == "deferred_mlp":
        y = K.deferred_rmsnorm_swiglu_mlp(normed_w, rstd2, w1, w_down)
    else:
        h2 = (normed_w.to(rstd2.dtype) * rstd2[:, None]).to(x.dtype)
        y = K.swiglu(h2, w1, w_down)
    return x2.view(shape) + y.view(shape)


# --------------------------------------------------------------------------- patched modules


@dataclass
class _LayerInfo:
    """What a patched decoder layer needs besides its modules (a plain attribute, not state)."""

    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    mlp: str
    inv_freq: torch.Tensor  # (HD/2,) fp32 on the CPU: the master copy of the buffer
    attention_kwargs: tuple  # passed to attention: the attention module's attribute, else the config's (sliding_window)
    new_cache_api: bool  # transformers >= 5.2x: ``cache.update(k, v, idx, kwargs=...)``
    qk_norm_eps: float | None = None  # Qwen3's q_norm / k_norm eps; None: no QK-norm
    qk_norm_fused: bool = False  # the QK-norm projection on the gemm_qknorm_rope kernel


def _layer_forward(self, hidden_states, attention_mask=None, position_ids=None, **kwargs):
    """The patched decoder layer's forward: HF's signature and return value ((B, S, D))."""
    info: _LayerInfo = self._coda
    attn, mlp = self.self_attn, self.mlp
    B, S = hidden_states.shape[:2]
    kwargs.pop("position_embeddings", None)  # HF's cos/sin: the kernels rotate from inv_freq
    cache = kwargs.pop("cache", None)
    legacy_cache = kwargs.pop("past_key_values", None)
    cache = cache if cache is not None else legacy_cache
    if position_ids is None:
        position_ids = torch.arange(S, device=hidden_states.device)
    positions = position_ids.to(torch.int64).expand(B, S).reshape(B * S)
    attn_kwargs = {**kwargs, "position_ids": position_ids}
    for name in info.attention_kwargs:  # Qwen3: per layer on the module; Mistral: the config's
        attn_kwargs[name] = getattr(attn, name) if hasattr(attn, name) else getattr(attn.config, name, None)
    qk_norm: dict[str, Any] = {}
    if info.qk_norm_eps is not None:
        qk_norm = dict(
            q_norm_w=interleave_head_weight(attn.q_norm.weight),
            k_norm_w=interleave_head_weight(attn.k_norm.weight),
            qk_norm_eps=info.qk_norm_eps,
            qk_norm_fused=info.qk_norm_fused,
        )
    hq, hkv, hd = info.n_q_heads, info.n_kv_heads, info.head_dim

    def attention(qkv):
        q, k, v = qkv.view(B, S, -1).split((hq * hd, hkv * hd, hkv * hd), dim=-1)
        q, k, v = (t.unflatten(-1, (-1, hd)).transpose(1, 2) for t in (q, k, v))  # (B, heads, S, HD)
        if cache is not None:
            if info.new_cache_api:
                k, v = cache.update(k, v, attn.layer_idx, kwargs=attn_kwargs)
            else:
                k, v = cache.update(k, v, attn.layer_idx, {"cache_position": attn_kwargs.get("cache_position")})
        interface = _attention_interface(attn)
        out, _ = interface(
            attn,
            q,
            k,
            v,
            attention_mask,
            dropout=attn.attention_dropout if attn.training else 0.0,
            scaling=attn.scaling,
            **attn_kwargs,
        )
        return out.reshape(B * S, hq * hd).contiguous()

    return coda_decoder_layer(  # a module global, looked up per call: swappable
        hidden_states,
        self.input_layernorm.weight,
        attn.qkv_proj.weight,
        attn.o_proj.weight,
        self.post_attention_layernorm.weight,
        mlp.gate_up_proj.weight,
        mlp.down_proj.weight,
        positions=positions,
        inv_freq=self.coda_inv_freq,
        attention=attention,
        n_q_heads=hq,
        n_kv_heads=hkv,
        head_dim=hd,
        eps=info.eps,
        mlp=info.mlp,
        **qk_norm,
    )


def _attention_interface(attn):
    """The model's attention function for ``config._attn_implementation`` (as HF's attention forward picks it)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # pyright: ignore[reportMissingImports]  (extra `hf`)

    eager = sys.modules[type(attn).__module__].eager_attention_forward
    impl = attn.config._attn_implementation
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):
        return ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)
    return eager if impl in (None, "eager") else ALL_ATTENTION_FUNCTIONS[impl]


def _layer_apply(cls: type):
    """``nn.Module._apply`` of the patched class ``cls``: afterwards ``coda_inv_freq`` is the
    fp32 master copy again, on the buffer's new device, whatever ``fn`` did
    (``model.to(torch.bfloat16)`` casts buffers; ``to_empty`` leaves them uninitialized)."""

    def _apply(self, fn, recurse=True):
        # cls is built at run time over an nn.Module layer class; pyright resolves this super() to object
        out = super(cls, self)._apply(fn, recurse)  # pyright: ignore[reportAttributeAccessIssue]
        buf = self._buffers.get("coda_inv_freq")
        if buf is not None:
            self._buffers["coda_inv_freq"] = self._coda.inv_freq.to(buf.device)
        return out

    return _apply


_PATCHED_CLASSES: dict[type, type] = {}


def _patched_class(base: type) -> type:
    """A subclass of the decoder layer class with the fused forward, one per base class. It
    keeps the base's ``__name__`` (``_no_split_modules`` and FSDP wrap policies match by
    name); transformers' ``GradientCheckpointingLayer`` wraps its forward like the base's."""
    cls = _PATCHED_CLASSES.get(base)
    if cls is None:
        cls = type(
            base.__name__,
            (base,),
            {
                "forward": _layer_forward,
                "_coda_base": base,
                "__module__": __name__,
                "__doc__": f"{base.__name__} patched by coda_agent.kernels.apply_coda (forward: coda_decoder_layer).",
            },
        )
        cls._apply = _layer_apply(cls)
        _PATCHED_CLASSES[base] = cls
    return cls


# --------------------------------------------------------------------------- LM head


def causal_lm_loss(
    hidden_states: torch.Tensor,
    w_vocab: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    shift_labels: torch.Tensor | None = None,
    num_items_in_batch=None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` through ``linear_cross_entropy`` (logits never stored).

    Args:
        hidden_states: (B, S, D) bf16 final hidden states (after the final norm).
        w_vocab: (V, D) bf16 LM-head weight, V a multiple of 8.
        labels: (B, S) int64; position s predicts ``labels[:, s + 1]`` (the last predicts
            nothing). Or give ``shift_labels`` (B, S), already shifted.
        num_items_in_batch: None (mean over the rows that are not ``ignore_index``; NaN when
            there are none, as F.cross_entropy's mean) or the divisor of the summed loss
            (int or tensor; gradient accumulation).
    Returns:
        () fp32 loss.
    Raises:
        ValueError: neither ``labels`` nor ``shift_labels``; else from ``linear_cross_entropy``.
    """
    if shift_labels is None:
        if labels is None:
            raise ValueError("causal_lm_loss: pass labels or shift_labels")
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    D = hidden_states.shape[-1]
    target = shift_labels.reshape(-1).to(device=hidden_states.device, dtype=torch.int64).contiguous()
    rows = K.linear_cross_entropy(hidden_states.reshape(-1, D).contiguous(), w_vocab, target, ignore_index=ignore_index)
    if num_items_in_batch is None:
        return rows.sum() / (target != ignore_index).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(rows.device)
    return rows.sum() / num_items_in_batch


@dataclass
class _LMInfo:
    params: tuple  # the original forward's parameter names, in order (after self)


def _causal_lm_forward(self, *args, **kwargs):
    """The patched ``*ForCausalLM.forward``: the fused LM head + loss in training with labels
    (``logits=None``), the class's own forward otherwise."""
    info: _LMInfo = self._coda_lm
    if len(args) > len(info.params):
        raise TypeError(f"forward() takes at most {len(info.params)} positional arguments, got {len(args)}")
    kwargs.update(zip(info.params, args, strict=False))
    labels = kwargs.get("labels")
    keep = kwargs.get("logits_to_keep", 0)
    if labels is None or not self.training or not (isinstance(keep, int) and keep == 0):
        return type(self).forward(self, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast  # pyright: ignore[reportMissingImports]  (extra `hf`)

    kwargs.pop("labels")
    kwargs.pop("logits_to_keep", None)
    return_dict = kwargs.pop("return_dict", None)
    loss_kw = {k: kwargs.pop(k) for k in ("shift_labels", "num_items_in_batch", "ignore_index") if k in kwargs}
    outputs = getattr(self, self.base_model_prefix)(**kwargs)
    loss = causal_lm_loss(outputs.last_hidden_state, self.lm_head.weight, labels, **loss_kw)
    fields = CausalLMOutputWithPast.__dataclass_fields__
    extra = {name: getattr(outputs, name, None) for name in ("cache", "past_key_values") if name in fields}
    out = CausalLMOutputWithPast(
        loss=loss, logits=None, hidden_states=outputs.hidden_states, attentions=outputs.attentions, **extra
    )
    if return_dict is False:
        return out.to_tuple()
    return out


# --------------------------------------------------------------------------- public API


@dataclass
class CodaPatch:
    """What :func:`apply_coda` did to a model (``model._coda``)."""

    layers: list[int] = field(default_factory=list)  # indices of the patched decoder layers
    fused_lm_head: bool = False
    mlp: str = "deferred_mlp"
    qk_norm_fused: bool | None = None  # QK-norm models: the projection on gemm_qknorm_rope; else None


def apply_coda(
    model: nn.Module, *, fused_lm_head: bool | None = None, strict: bool = True, mlp: str = "deferred_mlp"
) -> nn.Module:
    """Patch a transformers 5.x Llama (or Mistral, Qwen3) model in place to train on the fused kernels.

    Args:
        model: a ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen3ForCausalLM`` (or their base ``*Model``, or
            another head over that stack), bf16 weights, on any device (the forward needs one
            sm_90 CUDA device). Not yet patched, sharded or quantized.
        fused_lm_head: True: in training with labels, the LM head and loss run as
            ``linear_cross_entropy`` (no (M, V) logits; ``logits=None``). False: HF's LM head.
            None: :data:`DEFAULT_FUSED_LM_HEAD` (False, the faster; module docstring).
        strict: True: any unsupported setting raises before anything changes. False: each
            unsupported part (the whole model, one layer, the LM head) stays as it was, with
            a warning naming the setting.
        mlp: the MLP wiring, one of :data:`MLPS`.
    Returns:
        ``model`` itself; ``model._coda`` is a :class:`CodaPatch` naming what was patched.
    Raises:
        ValueError: (strict) an unsupported setting, named with its config field (module
            docstring: "Supported"); a model already patched; an unknown ``mlp``.
        ModuleNotFoundError: transformers is not installed.

    Every patched decoder layer's class becomes a subclass of its own with the fused forward
    (:func:`coda_decoder_layer`), its q/k/v and gate/up projections fused parameters
    (``self_attn.qkv_proj``, ``mlp.gate_up_proj``); state_dict / load_state_dict keep HF's
    keys, shapes, dtypes and values. Create the optimizer afterwards (new parameters).
    Undo with :func:`remove_coda`.
    """
    _require_transformers()
    if getattr(model, "_coda", None) is not None:
        raise ValueError("apply_coda: the model is already patched (remove_coda(model) undoes it)")
    if mlp not in MLPS:
        raise ValueError(f"apply_coda: mlp must be one of {MLPS}, got {mlp!r}")
    fused_lm_head = DEFAULT_FUSED_LM_HEAD if fused_lm_head is None else bool(fused_lm_head)
    config: Any = model.config  # HF's PretrainedConfig (nn.Module.__getattr__ is typed Tensor | Module)
    base = _base(model)
    problems = _model_problems(model, config, base)
    inv_freq = None
    if not problems:
        inv_freq, rope_problems = _rope_problems(config, base)
        problems += rope_problems
    if problems:
        _report(problems, strict, "the model is left unpatched")
        return model
    assert base is not None and inv_freq is not None  # else _model_problems / _rope_problems said why
    names = MODEL_TYPES[config.model_type]
    layer_problems = {i: _layer_problems(i, layer, config, names, WEIGHT_DTYPE) for i, layer in enumerate(base.layers)}
    lm_problems = _lm_head_problems(model, config, WEIGHT_DTYPE) if fused_lm_head else []
    if strict:
        _report([p for ps in layer_problems.values() for p in ps] + lm_problems, True, "")
    todo = [i for i, ps in layer_problems.items() if not ps]
    _report([p for ps in layer_problems.values() for p in ps], False, "these layers are left unpatched")
    _report(lm_problems, False, "the LM head is left unfused")

    patch = CodaPatch(layers=todo, fused_lm_head=fused_lm_head and not lm_problems, mlp=mlp)
    hq, hkv, hd = config.num_attention_heads, config.num_key_value_heads, _head_dim(config)
    if names[5] and todo:
        patch.qk_norm_fused = K.qknorm_kernel_ready(hd, base.layers[todo[0]].self_attn.q_norm.variance_epsilon)
    for i in todo:
        _patch_layer(base.layers[i], hq, hkv, hd, mlp, inv_freq, names[4], patch.qk_norm_fused)
    if patch.fused_lm_head:
        sig = inspect.signature(type(model).forward)
        params = tuple(
            n for n, p in list(sig.parameters.items())[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
        model._coda_lm = _LMInfo(params)  # pyright: ignore[reportArgumentType]  (torch types the value Tensor | Module)
        model.forward = types.MethodType(_causal_lm_forward, model)
    model._coda = patch  # pyright: ignore[reportArgumentType]  (torch types the value Tensor | Module)
    return model


def _patch_layer(
    layer, hq: int, hkv: int, hd: int, mlp: str, inv_freq: torch.Tensor, attn_kwargs: tuple, qk_norm_fused: bool | None
) -> None:
    """Fuse ``layer``'s projections and swap its class; ``qk_norm_fused`` None: no QK-norm
    (Llama, Mistral), else the QK-norm projection's path (:class:`CodaPatch`)."""
    attn, mlp_mod = layer.self_attn, layer.mlp
    attn_cls = type(attn)
    new_cache_api = "cache" in inspect.signature(attn_cls.forward).parameters
    with torch.no_grad():
        w_qkv = pack_qkv(
            attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, n_q_heads=hq, n_kv_heads=hkv, head_dim=hd
        )
        w1 = pack_gate_up(mlp_mod.gate_proj.weight, mlp_mod.up_proj.weight)
    _fuse_children(attn, _qkv_fused(hq, hkv, hd), w_qkv)
    _fuse_children(mlp_mod, _GATE_UP, w1)
    layer._coda = _LayerInfo(
        n_q_heads=hq,
        n_kv_heads=hkv,
        head_dim=hd,
        eps=float(layer.input_layernorm.variance_epsilon),
        mlp=mlp,
        inv_freq=inv_freq,
        attention_kwargs=attn_kwargs,
        new_cache_api=new_cache_api,
        qk_norm_eps=None if qk_norm_fused is None else float(attn.q_norm.variance_epsilon),
        qk_norm_fused=bool(qk_norm_fused),
    )
    layer.register_buffer("coda_inv_freq", inv_freq.to(layer.input_layernorm.weight.device), persistent=False)
    layer.__class__ = _patched_class(type(layer))


def remove_coda(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_coda` in place: the separate q/k/v and gate/up ``nn.Linear`` s come
    back (new parameters holding exactly the fused values, same requires_grad), the layer
    classes and the model's forward are the originals again. Returns ``model``. Not for a
    model sharded after patching (FSDP2 subclasses the layers). Create a new optimizer.
    Raises ValueError when ``model`` is not patched."""
    patch = getattr(model, "_coda", None)
    if patch is None:
        raise ValueError("remove_coda: the model is not patched by apply_coda")
    base = _base(model)
    for i in patch.layers:
        assert base is not None  # apply_coda patched layers of this decoder stack
        layer = base.layers[i]
        _unfuse_children(layer.self_attn)
        _unfuse_children(layer.mlp)
        del layer._buffers["coda_inv_freq"]
        del layer._coda
        layer.__class__ = type(layer)._coda_base
    if "forward" in model.__dict__:
        del model.forward
        del model._coda_lm
    del model._coda
    return model

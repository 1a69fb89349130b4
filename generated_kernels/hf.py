"""Hugging Face Llama on the fused kernels in one line: ``apply_coda(model)``.

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

========================================  ===============================  =============================
HF modules, per decoder layer             after ``apply_coda``             forward / backward kernels
========================================  ===============================  =============================
input_layernorm, q/k/v_proj, RoPE         rstd in torch, then              ``gemm_rmsnorm_rope`` /
                                          ``deferred_rmsnorm_qkv_rope``    torch
o_proj, residual add, statistics of       ``residual_rmsnorm``             ``gemm_residual_partial_rms``
post_attention_layernorm                                                   / torch
gate_proj, up_proj, SiLU * up, down_proj  ``deferred_rmsnorm_swiglu_mlp``  ``gemm_rmsnorm_swiglu`` /
                                          (``mlp="swiglu"``: ``swiglu``)   ``swiglu_bwd``
lm_head + loss (``fused_lm_head=True``,   ``linear_cross_entropy``         ``gemm_cross_entropy`` /
training mode, labels given)                                               ``cross_entropy_bwd``
embeddings, final norm, attention,        unchanged                        --
lm_head otherwise
========================================  ===============================  =============================

The layer is :func:`coda_decoder_layer` (``benchmarks/llama_layer.py``'s ``coda_layer``,
``mlp="deferred_mlp"``: CODA paper section 3, a block as GEMM-epilogue programs), looked
up at call time, so a replacement (e.g. a chained backward) is one assignment to
``coda_agent.kernels.hf.coda_decoder_layer``.

Parameters (fused, not packed per step). Each patched layer's ``self_attn.q_proj``,
``k_proj``, ``v_proj`` become one ``self_attn.qkv_proj`` (an ``nn.Linear`` without bias,
weight ((HQ + 2 HKV) HD, D): q rows, k rows, v rows, q and k rows permuted per head,
below) and ``mlp.gate_proj``, ``up_proj`` one ``mlp.gate_up_proj`` (weight (2I, D), row
2j = gate j, row 2j+1 = up j): the kernels read them as they are. Building them per
forward from the separate weights would copy them every step and copy their gradients
back: at llama3-8b widths 285 MB of weights, ~1.1 GB of traffic per layer and step, ~0.25
ms at the H200's bandwidth, against the fused layer's measured gain of ~0.64 ms per layer
(README, ``benchmarks/llama_layer.py``, compiled).
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
buffer ``coda_inv_freq``, recomputed from the config; ``model.to(dtype)`` and
``to_empty`` (meta-device initialization) leave it fp32 and exact.

Supported (else ``ValueError`` naming the setting, or, with ``strict=False``, a warning
and that part left unpatched): ``config.model_type`` "llama" or "mistral" (Mistral:
the same layer, sliding window passed to attention as Mistral does; Qwen2 is not: its
q/k/v projections have biases); ``hidden_act`` "silu"; ``attention_bias`` and
``mlp_bias`` False; ``head_dim`` 64 or 128 (the RoPE kernels are verified for those);
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
path (HF's ``lm_head`` then its loss) is faster compiled, 38.9 against 50.2 ms per step at
llama3-8b, M = 8192 (``linear_cross_entropy`` recomputes the logits in its backward;
``benchmarks/op_training_probe.py``, H200), so ``fused_lm_head=True`` is the memory option:
it never materializes the (M, V) fp32 logits (4.2 GB at M = 8192, V = 128256) and returns
``logits=None``. It applies in training mode with ``labels`` (and ``logits_to_keep=0``);
evaluation and generation take the plain path. ``benchmarks/hf_train.py --speed``
measures both ways.

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
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

# The package itself (partially initialized while its __init__ imports this module): the ops
# are looked up through it at call time, like the family modules' ``_pkg``.
K = importlib.import_module(__package__)

WEIGHT_DTYPE = torch.bfloat16
"""The dtype the kernels take for weights and activations."""

DEFAULT_FUSED_LM_HEAD = False
"""``apply_coda(fused_lm_head=None)``: the plain LM head (faster compiled; module docstring)."""

MLPS = ("deferred_mlp", "swiglu")
"""MLP wirings of :func:`coda_decoder_layer`: ``deferred_rmsnorm_swiglu_mlp`` on the deferred
norm (default), or ``swiglu`` on the normalized activations (``h2`` materialized)."""

HEAD_DIMS = (64, 128)
ROPE_TYPES = ("default", "linear", "llama3")
MODEL_TYPES = {
    # model_type: (decoder layer, attention, MLP, RMSNorm class names, extra attention kwargs from config)
    "llama": ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm", ()),
    "mistral": ("MistralDecoderLayer", "MistralAttention", "MistralMLP", "MistralRMSNorm", ("sliding_window",)),
}

_ATTN_PARTS = ("q_proj", "k_proj", "v_proj")
_MLP_PARTS = ("gate_proj", "up_proj")


# --------------------------------------------------------------------------- layouts

def rope_row_permutation(head_dim: int) -> torch.Tensor:
    """(head_dim,) int64: row i of a fused q / k head is HF row ``perm[i]`` of that head,
    ``perm = [0, HD/2, 1, HD/2 + 1, ..., HD/2 - 1, HD - 1]``: the kernel's rotated pair
    (2j, 2j+1) is HF's rotate_half pair (j, j + HD/2)."""
    half = head_dim // 2
    return torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).flatten()


def _head_rows(n_heads: int, head_dim: int, inverse: bool = False) -> torch.Tensor:
    perm = rope_row_permutation(head_dim)
    if inverse:
        perm = torch.argsort(perm)
    return (torch.arange(n_heads)[:, None] * head_dim + perm[None, :]).flatten()


def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, n_q_heads: int, n_kv_heads: int,
             head_dim: int) -> torch.Tensor:
    """HF's q_proj (HQ HD, D), k_proj (HKV HD, D), v_proj (HKV HD, D) weights -> the fused
    ((HQ + 2 HKV) HD, D) weight of ``deferred_rmsnorm_qkv_rope``: q and k rows permuted per
    head by :func:`rope_row_permutation`, v as is. A new contiguous tensor (dtype of the
    inputs, promoted). ValueError on shapes that do not match the head counts."""
    _check_rows("pack_qkv", {"q": (q, n_q_heads * head_dim), "k": (k, n_kv_heads * head_dim),
                             "v": (v, n_kv_heads * head_dim)})
    qi = _head_rows(n_q_heads, head_dim).to(q.device)
    ki = _head_rows(n_kv_heads, head_dim).to(k.device)
    return torch.cat((q[qi], k[ki], v), dim=0).contiguous()


def unpack_qkv(w_qkv: torch.Tensor, *, n_q_heads: int, n_kv_heads: int,
               head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_qkv`: (q, k, v) weights in HF's layout, new contiguous tensors."""
    nq, nk = n_q_heads * head_dim, n_kv_heads * head_dim
    _check_rows("unpack_qkv", {"w_qkv": (w_qkv, nq + 2 * nk)})
    qi = _head_rows(n_q_heads, head_dim, inverse=True).to(w_qkv.device)
    ki = _head_rows(n_kv_heads, head_dim, inverse=True).to(w_qkv.device)
    return w_qkv[:nq][qi], w_qkv[nq:nq + nk][ki], w_qkv[nq + nk:].clone()


def pack_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """HF's gate_proj and up_proj weights, (I, D) each -> the fused (2I, D) weight ``w1``
    (row 2j = gate j, row 2j+1 = up j). A new contiguous tensor."""
    if gate.shape != up.shape or gate.dim() != 2:
        raise ValueError(f"pack_gate_up: gate and up must be (I, D) of one shape, got {tuple(gate.shape)} and "
                         f"{tuple(up.shape)}")
    return torch.stack((gate, up), dim=1).flatten(0, 1)


def unpack_gate_up(w1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_gate_up`: (gate, up), new contiguous tensors."""
    if w1.dim() != 2 or w1.shape[0] % 2:
        raise ValueError(f"unpack_gate_up: w1 must be (2I, D), got {tuple(w1.shape)}")
    pairs = w1.unflatten(0, (w1.shape[0] // 2, 2))
    return pairs[:, 0].contiguous(), pairs[:, 1].contiguous()


def _check_rows(op: str, named: dict) -> None:
    for name, (t, rows) in named.items():
        if t.dim() != 2 or t.shape[0] != rows:
            raise ValueError(f"{op}: {name} must have {rows} rows (2-D), got shape {tuple(t.shape)}")


# --------------------------------------------------------------------------- the layer's math

def coda_decoder_layer(x, g1, w_qkv, w_o, g2, w1, w_down, *, positions, inv_freq, attention: Callable,
                       n_q_heads: int, n_kv_heads: int, head_dim: int, eps: float, mlp: str = "deferred_mlp"):
    """One pre-norm Llama decoder layer through the fused ops (the wiring of
    ``benchmarks/llama_layer.py``'s ``coda_layer``).

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
    qkv = K.deferred_rmsnorm_qkv_rope(x * g1, rstd, w_qkv, positions, inv_freq, **heads)
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
    inv_freq: torch.Tensor                 # (HD/2,) fp32 on the CPU: the master copy of the buffer
    attention_kwargs: tuple                # config fields passed to attention (Mistral: sliding_window)
    new_cache_api: bool                    # transformers >= 5.2x: ``cache.update(k, v, idx, kwargs=...)``


def _layer_forward(self, hidden_states, attention_mask=None, position_ids=None, **kwargs):
    """The patched decoder layer's forward: HF's signature and return value ((B, S, D))."""
    info: _LayerInfo = self._coda
    attn, mlp = self.self_attn, self.mlp
    B, S = hidden_states.shape[:2]
    kwargs.pop("position_embeddings", None)           # HF's cos/sin: the kernels rotate from inv_freq
    cache = kwargs.pop("cache", None)
    legacy_cache = kwargs.pop("past_key_values", None)
    cache = cache if cache is not None else legacy_cache
    if position_ids is None:
        position_ids = torch.arange(S, device=hidden_states.device)
    positions = position_ids.to(torch.int64).expand(B, S).reshape(B * S)
    attn_kwargs = {**kwargs, "position_ids": position_ids}
    for name in info.attention_kwargs:
        attn_kwargs[name] = getattr(attn.config, name, None)
    hq, hkv, hd = info.n_q_heads, info.n_kv_heads, info.head_dim

    def attention(qkv):
        q, k, v = qkv.view(B, S, -1).split((hq * hd, hkv * hd, hkv * hd), dim=-1)
        q, k, v = (t.unflatten(-1, (-1, hd)).transpose(1, 2) for t in (q, k, v))   # (B, heads, S, HD)
        if cache is not None:
            if info.new_cache_api:
                k, v = cache.update(k, v, attn.layer_idx, kwargs=attn_kwargs)
            else:
                k, v = cache.update(k, v, attn.layer_idx, {"cache_position": attn_kwargs.get("cache_position")})
        interface = _attention_interface(attn)
        out, _ = interface(attn, q, k, v, attention_mask, dropout=attn.attention_dropout if attn.training else 0.0,
                           scaling=attn.scaling, **attn_kwargs)
        return out.reshape(B * S, hq * hd).contiguous()

    return coda_decoder_layer(      # a module global, looked up per call: swappable
        hidden_states, self.input_layernorm.weight, attn.qkv_proj.weight, attn.o_proj.weight,
        self.post_attention_layernorm.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight, positions=positions,
        inv_freq=self.coda_inv_freq, attention=attention, n_q_heads=hq, n_kv_heads=hkv, head_dim=hd, eps=info.eps,
        mlp=info.mlp)


def _attention_interface(attn):
    """The model's attention function for ``config._attn_implementation`` (as HF's attention forward picks it)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

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
        out = super(cls, self)._apply(fn, recurse)
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
        cls = type(base.__name__, (base,), {
            "forward": _layer_forward, "_coda_base": base, "__module__": __name__,
            "__doc__": f"{base.__name__} patched by coda_agent.kernels.apply_coda (forward: coda_decoder_layer)."})
        cls._apply = _layer_apply(cls)
        _PATCHED_CLASSES[base] = cls
    return cls


# --------------------------------------------------------------------------- state-dict hooks

@dataclass(frozen=True)
class _Fused:
    """How one module's separate HF weights map to its fused one."""

    fused: str                       # child holding the fused weight ("qkv_proj" / "gate_up_proj")
    parts: tuple                     # HF children in state-dict order
    pack: Callable                   # (*part weights) -> fused
    unpack: Callable                 # fused -> tuple of part weights


def _qkv_fused(hq: int, hkv: int, hd: int) -> _Fused:
    h = {"n_q_heads": hq, "n_kv_heads": hkv, "head_dim": hd}
    return _Fused("qkv_proj", _ATTN_PARTS, lambda q, k, v: pack_qkv(q, k, v, **h), lambda w: unpack_qkv(w, **h))


_GATE_UP = _Fused("gate_up_proj", _MLP_PARTS, pack_gate_up, unpack_gate_up)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s values: a DTensor is all-gathered."""
    t = t.detach()
    return t.full_tensor() if _is_dtensor(t) else t


def _is_dtensor(t) -> bool:
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(t, dt.DTensor)


def _like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``full`` distributed like the DTensor ``ref`` (each rank keeps its own chunk; no
    communication), or ``full`` itself when ``ref`` is a plain tensor."""
    if not _is_dtensor(ref):
        return full
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(full.to(ref.device), ref.device_mesh, ref.placements, src_data_rank=None)


def _state_dict_post_hook(module, state_dict, prefix, local_metadata):
    """Replace ``prefix + fused.weight`` by the HF part weights, in HF's key order."""
    spec: _Fused = module._coda_fused
    key = f"{prefix}{spec.fused}.weight"
    if key not in state_dict:
        return
    mine = [k for k in state_dict if k.startswith(prefix)]   # this module's keys: the last ones inserted
    items = [(k, state_dict.pop(k)) for k in mine]
    for k, v in items:
        if k != key:
            state_dict[k] = v
            continue
        with torch.no_grad():
            parts = spec.unpack(_full(v))
        for name, p in zip(spec.parts, parts):
            state_dict[f"{prefix}{name}.weight"] = _like(p, v)


def _load_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                   error_msgs):
    """Replace HF's part keys by the fused key. Parts absent from ``state_dict`` keep the
    model's values (as the unpatched model would) and are reported as missing under ``strict``."""
    spec: _Fused = module._coda_fused
    names = [f"{prefix}{p}.weight" for p in spec.parts]
    if not any(n in state_dict for n in names):
        return
    fused_param = getattr(module, spec.fused).weight
    with torch.no_grad():
        current = spec.unpack(_full(fused_param))
        parts = []
        for n, cur in zip(names, current):
            if n in state_dict:
                given = _full(state_dict.pop(n))
                if given.shape != cur.shape:
                    error_msgs.append(f"size mismatch for {n}: copying a param with shape {tuple(given.shape)} "
                                      f"from checkpoint, the shape in current model is {tuple(cur.shape)}.")
                    return
                parts.append(given)
            else:
                if strict:
                    missing_keys.append(n)
                parts.append(cur)
        device = parts[0].device
        fused = spec.pack(*(p.to(device) for p in parts))
    state_dict[f"{prefix}{spec.fused}.weight"] = _like(fused, fused_param)


def _register_hooks(module, spec: _Fused) -> None:
    module._coda_fused = spec
    module._coda_handles = [module.register_state_dict_post_hook(_state_dict_post_hook),
                            module.register_load_state_dict_pre_hook(_load_pre_hook)]


class PackedPart:
    """Read-only stand-in for an HF projection folded into a fused weight (``self_attn.q_proj``
    of a patched layer): ``.weight`` is that projection's weight in HF's layout, computed
    from the fused parameter on each access (an inference tensor: writing into it raises;
    load weights with ``load_state_dict``). Not a module: it holds no parameter and is not
    in ``named_modules()``. It exists so that HF key paths resolve as attributes (DCP's
    ``get_model_state_dict`` walks them)."""

    def __init__(self, module: nn.Module, index: int):
        self._module, self._index = module, index

    @property
    def weight(self) -> torch.Tensor:
        spec: _Fused = self._module._coda_fused
        fused = getattr(self._module, spec.fused).weight
        with torch.no_grad():
            part = spec.unpack(_full(fused))[self._index]
        if _is_dtensor(fused):
            return _like(part, fused)
        with torch.inference_mode():
            return part.clone()

    def __repr__(self) -> str:
        spec: _Fused = self._module._coda_fused
        return f"PackedPart({spec.parts[self._index]} of {spec.fused}, read-only)"


def _fuse_children(module, spec: _Fused, weight: torch.Tensor) -> None:
    """Swap ``module``'s HF part children for one bias-free nn.Linear ``spec.fused`` holding
    ``weight``, at the first part's position (``_modules`` order = parameter order); the
    part names become :class:`PackedPart` attributes."""
    old = module._modules
    lin = _linear(weight, old[spec.parts[0]].weight.requires_grad)
    module._modules = {(spec.fused if n == spec.parts[0] else n): (lin if n == spec.parts[0] else m)
                       for n, m in old.items() if n not in spec.parts[1:]}
    _register_hooks(module, spec)
    for i, name in enumerate(spec.parts):
        setattr(module, name, PackedPart(module, i))


def _unfuse_children(module) -> None:
    spec: _Fused = module._coda_fused
    for h in module._coda_handles:
        h.remove()
    for name in spec.parts:
        delattr(module, name)
    fused = getattr(module, spec.fused).weight
    with torch.no_grad():
        parts = spec.unpack(fused.detach())
    linears = [_linear(p, fused.requires_grad) for p in parts]
    new = {}
    for n, m in module._modules.items():
        if n == spec.fused:
            new.update(zip(spec.parts, linears))
        else:
            new[n] = m
    module._modules = new
    del module._coda_fused, module._coda_handles


def _linear(weight: torch.Tensor, requires_grad: bool) -> nn.Linear:
    out_f, in_f = weight.shape
    lin = nn.Linear(in_f, out_f, bias=False, device="meta", dtype=weight.dtype)
    lin.weight = nn.Parameter(weight, requires_grad=requires_grad)
    return lin


# --------------------------------------------------------------------------- LM head

def causal_lm_loss(hidden_states: torch.Tensor, w_vocab: torch.Tensor, labels: torch.Tensor | None = None, *,
                   shift_labels: torch.Tensor | None = None, num_items_in_batch=None,
                   ignore_index: int = -100) -> torch.Tensor:
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
    rows = K.linear_cross_entropy(hidden_states.reshape(-1, D).contiguous(), w_vocab, target,
                                  ignore_index=ignore_index)
    if num_items_in_batch is None:
        return rows.sum() / (target != ignore_index).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(rows.device)
    return rows.sum() / num_items_in_batch


@dataclass
class _LMInfo:
    params: tuple                          # the original forward's parameter names, in order (after self)


def _causal_lm_forward(self, *args, **kwargs):
    """The patched ``*ForCausalLM.forward``: the fused LM head + loss in training with labels
    (``logits=None``), the class's own forward otherwise."""
    info: _LMInfo = self._coda_lm
    if len(args) > len(info.params):
        raise TypeError(f"forward() takes at most {len(info.params)} positional arguments, got {len(args)}")
    kwargs.update(zip(info.params, args))
    labels = kwargs.get("labels")
    keep = kwargs.get("logits_to_keep", 0)
    if labels is None or not self.training or not (isinstance(keep, int) and keep == 0):
        return type(self).forward(self, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs.pop("labels")
    kwargs.pop("logits_to_keep", None)
    return_dict = kwargs.pop("return_dict", None)
    loss_kw = {k: kwargs.pop(k) for k in ("shift_labels", "num_items_in_batch", "ignore_index") if k in kwargs}
    outputs = getattr(self, self.base_model_prefix)(**kwargs)
    loss = causal_lm_loss(outputs.last_hidden_state, self.lm_head.weight, labels, **loss_kw)
    fields = CausalLMOutputWithPast.__dataclass_fields__
    extra = {name: getattr(outputs, name, None) for name in ("cache", "past_key_values") if name in fields}
    out = CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=outputs.hidden_states,
                                 attentions=outputs.attentions, **extra)
    if return_dict is False:
        return out.to_tuple()
    return out


# --------------------------------------------------------------------------- checks

def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("apply_coda needs transformers 5.x: pip install 'coda-agent[hf]' "
                                  "(or 'transformers>=5,<6')") from e


def _base(model):
    """The decoder stack (``LlamaModel``) of ``model`` (itself or ``model.model``), or None."""
    for cand in (model, getattr(model, "base_model", None), getattr(model, "model", None)):
        if cand is not None and isinstance(getattr(cand, "layers", None), nn.ModuleList) and \
                hasattr(cand, "rotary_emb"):
            return cand
    return None


def _model_problems(model, config, base) -> list[str]:
    """Model-wide settings the fused layer does not implement (each names the config field)."""
    mt = getattr(config, "model_type", None)
    if mt not in MODEL_TYPES:
        hint = " (Qwen2's q/k/v projections have biases; the fused GEMMs have none)" if mt == "qwen2" else ""
        return [f"config.model_type = {mt!r} is not supported (supported: {sorted(MODEL_TYPES)}){hint}"]
    if base is None:
        return [f"{type(model).__name__} has no decoder stack (.layers and .rotary_emb) where a "
                f"{mt} model has one"]
    out = []
    if getattr(config, "hidden_act", None) != "silu":
        out.append(f"config.hidden_act = {config.hidden_act!r}: the fused MLP is SwiGLU, needs 'silu'")
    for name in ("attention_bias", "mlp_bias"):
        if getattr(config, name, False):
            out.append(f"config.{name} = True: the fused GEMMs have no bias")
    hd = _head_dim(config)
    if hd not in HEAD_DIMS:
        out.append(f"config.head_dim = {hd}: the RoPE kernels are verified for head_dim in {HEAD_DIMS}")
    for name in ("hidden_size", "intermediate_size"):
        n = getattr(config, name)
        if n % 8:
            out.append(f"config.{name} = {n} must be a multiple of 8 (16-byte bf16 rows for TMA)")
    if config.num_attention_heads % config.num_key_value_heads:
        out.append(f"config.num_attention_heads = {config.num_attention_heads} must be a multiple of "
                   f"config.num_key_value_heads = {config.num_key_value_heads}")
    return out


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_params(config) -> dict:
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rp) if isinstance(rp, dict) else {}


def _rope_problems(config, base) -> tuple[torch.Tensor | None, list[str]]:
    """(inv_freq (HD/2,) fp32 on the CPU, problems): inv_freq recomputed from the config as
    the model's rotary embedding computes it (exact even if the model's buffer was cast to
    bf16), checked against that buffer when it is fp32 and materialized."""
    rp = _rope_params(config)
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        return None, [f"config.rope_parameters['rope_type'] = {rope_type!r} is not supported (supported: "
                      f"{list(ROPE_TYPES)}: they change inv_freq only; yarn / longrope scale attention, dynamic "
                      f"changes the frequencies with the sequence length)"]
    rotary = base.rotary_emb
    if rope_type == "default":
        inv_freq, scaling = type(rotary).compute_default_rope_parameters(config)
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    inv_freq = inv_freq.detach().to("cpu", torch.float32)
    problems = []
    if float(scaling) != 1.0 or float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        problems.append(f"config.rope_parameters gives attention scaling {float(scaling)} != 1: not implemented")
    hd = _head_dim(config)
    if inv_freq.shape != (hd // 2,):
        problems.append(f"config.rope_parameters rotates {2 * inv_freq.numel()} of head_dim = {hd} dims "
                        f"(partial_rotary_factor): the kernels rotate whole heads")
    buf = getattr(rotary, "inv_freq", None)
    if (buf is not None and buf.dtype == torch.float32 and buf.device.type != "meta" and buf.shape == inv_freq.shape
            and not torch.equal(buf.detach().cpu(), inv_freq)):
        problems.append("model.rotary_emb.inv_freq differs from the inverse frequencies its config gives "
                        "(changed after construction?): refusing to guess which one is meant")
    return inv_freq, problems


def _layer_problems(i: int, layer, config, names) -> list[str]:
    """Why decoder layer ``i`` cannot be patched (empty: it can)."""
    layer_cls, attn_cls, mlp_cls, norm_cls, _ = names
    mod = sys.modules.get(type(layer).__module__)
    where = f"model layer {i}"
    if getattr(layer, "_coda", None) is not None:
        return [f"{where} is already patched by apply_coda"]
    if type(layer).__name__ != layer_cls or not type(layer).__module__.startswith("transformers.models."):
        return [f"{where}: {type(layer).__module__}.{type(layer).__qualname__} is not transformers' {layer_cls}"]
    expect = {"self_attn": attn_cls, "mlp": mlp_cls, "input_layernorm": norm_cls, "post_attention_layernorm": norm_cls}
    out = []
    for child, cls_name in expect.items():
        m = getattr(layer, child, None)
        if type(m) is not getattr(mod, cls_name, None):
            out.append(f"{where}: .{child} is {type(m).__name__}, not transformers' {cls_name}")
    if out:
        return out
    attn, mlp = layer.self_attn, layer.mlp
    hq, hkv, hd, D = config.num_attention_heads, config.num_key_value_heads, _head_dim(config), config.hidden_size
    I = config.intermediate_size  # noqa: E741
    linears = {"self_attn.q_proj": (attn.q_proj, (hq * hd, D)), "self_attn.k_proj": (attn.k_proj, (hkv * hd, D)),
               "self_attn.v_proj": (attn.v_proj, (hkv * hd, D)), "self_attn.o_proj": (attn.o_proj, (D, hq * hd)),
               "mlp.gate_proj": (mlp.gate_proj, (I, D)), "mlp.up_proj": (mlp.up_proj, (I, D)),
               "mlp.down_proj": (mlp.down_proj, (D, I))}
    for name, (lin, shape) in linears.items():
        if type(lin) is not nn.Linear:
            out.append(f"{where}: {name} is {type(lin).__name__}, not a plain nn.Linear (adapters / quantized "
                       f"layers are not supported)")
    if out:
        return out
    for name, (lin, shape) in linears.items():
        if lin.bias is not None:
            field_name = "attention_bias" if name.startswith("self_attn") else "mlp_bias"
            out.append(f"{where}: {name} has a bias (config.{field_name}): the fused GEMMs have none")
        if tuple(lin.weight.shape) != shape:
            out.append(f"{where}: {name}.weight has shape {tuple(lin.weight.shape)}, the config implies {shape}")
    for name in ("input_layernorm", "post_attention_layernorm"):
        w = getattr(layer, name).weight
        if tuple(w.shape) != (D,):
            out.append(f"{where}: {name}.weight has shape {tuple(w.shape)}, expected ({D},)")
    params = {n: p for n, p in layer.named_parameters()}
    for n, p in params.items():
        if p.dtype != WEIGHT_DTYPE:
            out.append(f"{where}: {n} is {p.dtype} (dtype): the fused kernels need {WEIGHT_DTYPE} weights "
                       f"(from_pretrained(..., dtype=torch.bfloat16) or model.to(torch.bfloat16) before apply_coda)")
            break
    for n, p in params.items():
        if type(p.data) is not torch.Tensor:
            out.append(f"{where}: {n} is a {type(p.data).__name__}: call apply_coda before sharding "
                       f"(fully_shard, tensor parallel) or quantizing the model")
            break
    for group in (_ATTN_PARTS, _MLP_PARTS):
        owner = attn if group is _ATTN_PARTS else mlp
        flags = {getattr(owner, p).weight.requires_grad for p in group}
        if len(flags) > 1:
            out.append(f"{where}: {', '.join(group)} differ in requires_grad: the fused weight has one flag")
    eps = {layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon}
    if len(eps) > 1:
        out.append(f"{where}: the two RMSNorms' eps differ ({sorted(eps)}): the fused layer takes one "
                   f"(config.rms_norm_eps)")
    return out


def _lm_head_problems(model, config) -> list[str]:
    lm = getattr(model, "lm_head", None)
    if not type(model).__name__.endswith("ForCausalLM") or not isinstance(lm, nn.Linear):
        return [f"fused_lm_head=True needs a *ForCausalLM model with an nn.Linear lm_head; got "
                f"{type(model).__name__}"]
    out = []
    if lm.bias is not None:
        out.append("lm_head has a bias: linear_cross_entropy has none")
    if config.vocab_size % 8 or lm.weight.shape[0] % 8:
        out.append(f"config.vocab_size = {config.vocab_size} must be a multiple of 8 for linear_cross_entropy "
                   f"(16-byte rows)")
    if lm.weight.dtype != WEIGHT_DTYPE:
        out.append(f"lm_head.weight is {lm.weight.dtype} (dtype): linear_cross_entropy needs {WEIGHT_DTYPE}")
    loss_type = getattr(model, "loss_type", "ForCausalLM")
    if loss_type not in (None, "ForCausalLM"):
        out.append(f"model.loss_type = {loss_type!r}: the fused LM head implements ForCausalLM's loss only")
    return out


def _report(problems: list[str], strict: bool, consequence: str) -> None:
    if not problems:
        return
    text = "\n  - ".join(problems)
    if strict:
        raise ValueError(f"apply_coda: unsupported setting(s):\n  - {text}\n"
                         f"(apply_coda(..., strict=False) leaves those parts unpatched with a warning)")
    warnings.warn(f"apply_coda: {consequence}:\n  - {text}", stacklevel=3)


# --------------------------------------------------------------------------- public API

@dataclass
class CodaPatch:
    """What :func:`apply_coda` did to a model (``model._coda``)."""

    layers: list[int] = field(default_factory=list)   # indices of the patched decoder layers
    fused_lm_head: bool = False
    mlp: str = "deferred_mlp"


def apply_coda(model: nn.Module, *, fused_lm_head: bool | None = None, strict: bool = True,
               mlp: str = "deferred_mlp") -> nn.Module:
    """Patch a transformers 5.x Llama (or Mistral) model in place to train on the fused kernels.

    Args:
        model: a ``LlamaForCausalLM`` / ``MistralForCausalLM`` (or their base ``*Model``, or
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
    config = model.config
    base = _base(model)
    problems = _model_problems(model, config, base)
    inv_freq = None
    if not problems:
        inv_freq, rope_problems = _rope_problems(config, base)
        problems += rope_problems
    if problems:
        _report(problems, strict, "the model is left unpatched")
        return model
    names = MODEL_TYPES[config.model_type]
    layer_problems = {i: _layer_problems(i, layer, config, names) for i, layer in enumerate(base.layers)}
    lm_problems = _lm_head_problems(model, config) if fused_lm_head else []
    if strict:
        _report([p for ps in layer_problems.values() for p in ps] + lm_problems, True, "")
    todo = [i for i, ps in layer_problems.items() if not ps]
    _report([p for ps in layer_problems.values() for p in ps], False, "these layers are left unpatched")
    _report(lm_problems, False, "the LM head is left unfused")

    patch = CodaPatch(layers=todo, fused_lm_head=fused_lm_head and not lm_problems, mlp=mlp)
    hq, hkv, hd = config.num_attention_heads, config.num_key_value_heads, _head_dim(config)
    for i in todo:
        _patch_layer(base.layers[i], hq, hkv, hd, mlp, inv_freq, names[4])
    if patch.fused_lm_head:
        sig = inspect.signature(type(model).forward)
        params = tuple(n for n, p in list(sig.parameters.items())[1:]
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        model._coda_lm = _LMInfo(params)
        model.forward = types.MethodType(_causal_lm_forward, model)
    model._coda = patch
    return model


def _patch_layer(layer, hq: int, hkv: int, hd: int, mlp: str, inv_freq: torch.Tensor, attn_kwargs: tuple) -> None:
    attn, mlp_mod = layer.self_attn, layer.mlp
    attn_cls = type(attn)
    new_cache_api = "cache" in inspect.signature(attn_cls.forward).parameters
    with torch.no_grad():
        w_qkv = pack_qkv(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                         n_q_heads=hq, n_kv_heads=hkv, head_dim=hd)
        w1 = pack_gate_up(mlp_mod.gate_proj.weight, mlp_mod.up_proj.weight)
    _fuse_children(attn, _qkv_fused(hq, hkv, hd), w_qkv)
    _fuse_children(mlp_mod, _GATE_UP, w1)
    layer._coda = _LayerInfo(n_q_heads=hq, n_kv_heads=hkv, head_dim=hd,
                             eps=float(layer.input_layernorm.variance_epsilon), mlp=mlp, inv_freq=inv_freq,
                             attention_kwargs=attn_kwargs, new_cache_api=new_cache_api)
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

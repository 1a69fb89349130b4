"""What :func:`~coda_agent.kernels.hf.apply_coda` refuses, before it changes anything.

Each check returns the problems it finds as sentences naming the config field or module
(an empty list: supported); :func:`_report` raises them (``strict``) or warns. The
supported settings are listed in :mod:`~coda_agent.kernels.hf`'s docstring ("Supported").
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from torch import nn

from ._hf_layout import _ATTN_PARTS, _MLP_PARTS

HEAD_DIMS = (64, 128)


ROPE_TYPES = ("default", "linear", "llama3")


MODEL_TYPES = {
    # model_type: (decoder layer, attention, MLP, RMSNorm class names, extra attention kwargs
    # (the attention module's attribute where it has one, else the config's), whether the
    # attention has per-head q_norm / k_norm before RoPE)
    "llama": ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm", (), False),
    "mistral": ("MistralDecoderLayer", "MistralAttention", "MistralMLP", "MistralRMSNorm", ("sliding_window",), False),
    "qwen3": ("Qwen3DecoderLayer", "Qwen3Attention", "Qwen3MLP", "Qwen3RMSNorm", ("sliding_window",), True),
}


def _require_transformers():
    try:
        import transformers  # pyright: ignore[reportMissingImports]  # noqa: F401  (extra `hf`)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "apply_coda needs transformers 5.x: pip install 'coda-agent[hf]' (or 'transformers>=5,<6')"
        ) from e


def _base(model) -> Any | None:
    """The decoder stack (``LlamaModel``) of ``model`` (itself or ``model.model``), or None."""
    for cand in (model, getattr(model, "base_model", None), getattr(model, "model", None)):
        if (
            cand is not None
            and isinstance(getattr(cand, "layers", None), nn.ModuleList)
            and hasattr(cand, "rotary_emb")
        ):
            return cand
    return None


def _model_problems(model, config, base) -> list[str]:
    """Model-wide settings the fused layer does not implement (each names the config field)."""
    mt = getattr(config, "model_type", None)
    if mt not in MODEL_TYPES:
        hint = " (Qwen2's q/k/v projections have biases; the fused GEMMs have none)" if mt == "qwen2" else ""
        return [f"config.model_type = {mt!r} is not supported (supported: {sorted(MODEL_TYPES)}){hint}"]
    if base is None:
        return [f"{type(model).__name__} has no decoder stack (.layers and .rotary_emb) where a {mt} model has one"]
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
        out.append(
            f"config.num_attention_heads = {config.num_attention_heads} must be a multiple of "
            f"config.num_key_value_heads = {config.num_key_value_heads}"
        )
    return out


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_params(config) -> dict:
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rp) if isinstance(rp, dict) else {}


# Rationale: a model built under ``torch.device("cuda")`` computes its inv_freq buffer on the
# GPU, whose pow differs from the CPU's by an ulp or two (tests/kernels/test_hf_patch.py,
# test_inv_freq_from_another_device_is_used_as_is_cpu). Within this relative distance the
# buffer is the same config computed elsewhere and is used as is; beyond it, it was changed.
INV_FREQ_RTOL = 1e-5


def _rope_problems(config, base) -> tuple[torch.Tensor | None, list[str]]:
    """(inv_freq (HD/2,) fp32 on the CPU, problems): the frequencies the unpatched model rotates
    with. Recomputed from the config as the model's rotary embedding computes it (exact even
    if the model's buffer was cast to bf16); where the buffer is fp32 and materialized, the
    buffer's own values, provided they are within ``INV_FREQ_RTOL`` of the recomputed ones."""
    rp = _rope_params(config)
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        return None, [
            f"config.rope_parameters['rope_type'] = {rope_type!r} is not supported (supported: "
            f"{list(ROPE_TYPES)}: they change inv_freq only; yarn / longrope scale attention, dynamic "
            f"changes the frequencies with the sequence length)"
        ]
    rotary = base.rotary_emb
    if rope_type == "default":
        inv_freq, scaling = type(rotary).compute_default_rope_parameters(config)
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # pyright: ignore[reportMissingImports]  (extra `hf`)

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    inv_freq = inv_freq.detach().to("cpu", torch.float32)
    problems = []
    if float(scaling) != 1.0 or float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        problems.append(f"config.rope_parameters gives attention scaling {float(scaling)} != 1: not implemented")
    hd = _head_dim(config)
    if inv_freq.shape != (hd // 2,):
        problems.append(
            f"config.rope_parameters rotates {2 * inv_freq.numel()} of head_dim = {hd} dims "
            f"(partial_rotary_factor): the kernels rotate whole heads"
        )
    buf = getattr(rotary, "inv_freq", None)
    if buf is not None and buf.dtype == torch.float32 and buf.device.type != "meta" and buf.shape == inv_freq.shape:
        buf = buf.detach().to("cpu")
        if torch.allclose(buf, inv_freq, rtol=INV_FREQ_RTOL, atol=0.0):
            inv_freq = buf.clone()  # bit-identical rotation to the unpatched model's
        else:
            err = ((buf - inv_freq).abs() / inv_freq.abs()).max().item()
            problems.append(
                f"model.rotary_emb.inv_freq differs from the inverse frequencies its config gives by up "
                f"to {err:.2e} relative (allowed {INV_FREQ_RTOL:.0e}; changed after construction?): "
                f"refusing to guess which one is meant"
            )
    return inv_freq, problems


def _layer_problems(i: int, layer, config, names, weight_dtype: torch.dtype) -> list[str]:
    """Why decoder layer ``i`` cannot be patched (empty: it can); its weights must be ``weight_dtype``."""
    layer_cls, attn_cls, mlp_cls, norm_cls, _, qk_norm = names
    mod = sys.modules.get(type(layer).__module__)
    where = f"model layer {i}"
    if getattr(layer, "_coda", None) is not None:
        return [f"{where} is already patched by apply_coda"]
    if type(layer).__name__ != layer_cls or not type(layer).__module__.startswith("transformers.models."):
        return [f"{where}: {type(layer).__module__}.{type(layer).__qualname__} is not transformers' {layer_cls}"]
    expect = {"self_attn": attn_cls, "mlp": mlp_cls, "input_layernorm": norm_cls, "post_attention_layernorm": norm_cls}
    if qk_norm:
        expect.update({"self_attn.q_norm": norm_cls, "self_attn.k_norm": norm_cls})
    out = []
    for child, cls_name in expect.items():
        m = layer.get_submodule(child) if _has_submodule(layer, child) else None
        if type(m) is not getattr(mod, cls_name, None):
            out.append(f"{where}: .{child} is {type(m).__name__}, not transformers' {cls_name}")
    if out:
        return out
    attn, mlp = layer.self_attn, layer.mlp
    hq, hkv, hd, D = config.num_attention_heads, config.num_key_value_heads, _head_dim(config), config.hidden_size
    I = config.intermediate_size  # noqa: E741
    linears = {
        "self_attn.q_proj": (attn.q_proj, (hq * hd, D)),
        "self_attn.k_proj": (attn.k_proj, (hkv * hd, D)),
        "self_attn.v_proj": (attn.v_proj, (hkv * hd, D)),
        "self_attn.o_proj": (attn.o_proj, (D, hq * hd)),
        "mlp.gate_proj": (mlp.gate_proj, (I, D)),
        "mlp.up_proj": (mlp.up_proj, (I, D)),
        "mlp.down_proj": (mlp.down_proj, (D, I)),
    }
    for name, (lin, _) in linears.items():
        if type(lin) is not nn.Linear:
            out.append(
                f"{where}: {name} is {type(lin).__name__}, not a plain nn.Linear (adapters / quantized "
                f"layers are not supported)"
            )
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
        if p.dtype != weight_dtype:
            out.append(
                f"{where}: {n} is {p.dtype} (dtype): the fused kernels need {weight_dtype} weights "
                f"(from_pretrained(..., dtype=torch.bfloat16) or model.to(torch.bfloat16) before apply_coda)"
            )
            break
    for n, p in params.items():
        if type(p.data) is not torch.Tensor:
            out.append(
                f"{where}: {n} is a {type(p.data).__name__}: call apply_coda before sharding "
                f"(fully_shard, tensor parallel) or quantizing the model"
            )
            break
    for group in (_ATTN_PARTS, _MLP_PARTS):
        owner = attn if group is _ATTN_PARTS else mlp
        flags = {getattr(owner, p).weight.requires_grad for p in group}
        if len(flags) > 1:
            out.append(f"{where}: {', '.join(group)} differ in requires_grad: the fused weight has one flag")
    eps = {layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon}
    if len(eps) > 1:
        out.append(
            f"{where}: the two RMSNorms' eps differ ({sorted(eps)}): the fused layer takes one (config.rms_norm_eps)"
        )
    if qk_norm:
        for name in ("q_norm", "k_norm"):
            w = getattr(attn, name).weight
            if tuple(w.shape) != (hd,):
                out.append(f"{where}: self_attn.{name}.weight has shape {tuple(w.shape)}, expected ({hd},)")
        head_eps = {attn.q_norm.variance_epsilon, attn.k_norm.variance_epsilon}
        if len(head_eps) > 1:
            out.append(f"{where}: q_norm's and k_norm's eps differ ({sorted(head_eps)}): the fused op takes one")
    return out


def _has_submodule(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _lm_head_problems(model, config, weight_dtype: torch.dtype) -> list[str]:
    """Why the LM head cannot be fused (empty: it can); its weight must be ``weight_dtype``."""
    lm = getattr(model, "lm_head", None)
    if not type(model).__name__.endswith("ForCausalLM") or not isinstance(lm, nn.Linear):
        return [f"fused_lm_head=True needs a *ForCausalLM model with an nn.Linear lm_head; got {type(model).__name__}"]
    out = []
    if lm.bias is not None:
        out.append("lm_head has a bias: linear_cross_entropy has none")
    if config.vocab_size % 8 or lm.weight.shape[0] % 8:
        out.append(
            f"config.vocab_size = {config.vocab_size} must be a multiple of 8 for linear_cross_entropy (16-byte rows)"
        )
    if lm.weight.dtype != weight_dtype:
        out.append(f"lm_head.weight is {lm.weight.dtype} (dtype): linear_cross_entropy needs {weight_dtype}")
    loss_type = getattr(model, "loss_type", "ForCausalLM")
    if loss_type not in (None, "ForCausalLM"):
        out.append(f"model.loss_type = {loss_type!r}: the fused LM head implements ForCausalLM's loss only")
    return out


def _report(problems: list[str], strict: bool, consequence: str) -> None:
    if not problems:
        return
    text = "\n  - ".join(problems)
    if strict:
        raise ValueError(
            f"apply_coda: unsupported setting(s):\n  - {text}\n"
            f"(apply_coda(..., strict=False) leaves those parts unpatched with a warning)"
        )
    warnings.warn(f"apply_coda: {consequence}:\n  - {text}", stacklevel=3)

"""The fused weight layouts of :mod:`~coda_agent.kernels.hf`, and the module surgery that
holds them.

``qkv_proj`` is q, k and v stacked, q and k rows permuted per head so that the kernels'
interleaved RoPE pairs (2j, 2j+1) rotate HF's ``rotate_half`` pairs (j, j + HD/2)
(:func:`rope_row_permutation`); ``gate_up_proj`` interleaves gate and up rows. Both are
exact gathers, invertible (:func:`unpack_qkv`, :func:`unpack_gate_up`). A patched module
swaps its HF children for the fused ``nn.Linear`` (:func:`_fuse_children`); its state dict
keeps HF's keys through a post-hook (unpack) and a load pre-hook (pack), DTensor-aware,
and the HF names stay attributes as read-only :class:`PackedPart` s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

_ATTN_PARTS = ("q_proj", "k_proj", "v_proj")


_MLP_PARTS = ("gate_proj", "up_proj")


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


def pack_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, n_q_heads: int, n_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """HF's q_proj (HQ HD, D), k_proj (HKV HD, D), v_proj (HKV HD, D) weights -> the fused
    ((HQ + 2 HKV) HD, D) weight of ``deferred_rmsnorm_qkv_rope``: q and k rows permuted per
    head by :func:`rope_row_permutation`, v as is. A new contiguous tensor (dtype of the
    inputs, promoted). ValueError on shapes that do not match the head counts."""
    _check_rows(
        "pack_qkv", {"q": (q, n_q_heads * head_dim), "k": (k, n_kv_heads * head_dim), "v": (v, n_kv_heads * head_dim)}
    )
    qi = _head_rows(n_q_heads, head_dim).to(q.device)
    ki = _head_rows(n_kv_heads, head_dim).to(k.device)
    return torch.cat((q[qi], k[ki], v), dim=0).contiguous()


def unpack_qkv(
    w_qkv: torch.Tensor, *, n_q_heads: int, n_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_qkv`: (q, k, v) weights in HF's layout, new contiguous tensors."""
    nq, nk = n_q_heads * head_dim, n_kv_heads * head_dim
    _check_rows("unpack_qkv", {"w_qkv": (w_qkv, nq + 2 * nk)})
    qi = _head_rows(n_q_heads, head_dim, inverse=True).to(w_qkv.device)
    ki = _head_rows(n_kv_heads, head_dim, inverse=True).to(w_qkv.device)
    return w_qkv[:nq][qi], w_qkv[nq : nq + nk][ki], w_qkv[nq + nk :].clone()


def pack_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """HF's gate_proj and up_proj weights, (I, D) each -> the fused (2I, D) weight ``w1``
    (row 2j = gate j, row 2j+1 = up j). A new contiguous tensor."""
    if gate.shape != up.shape or gate.dim() != 2:
        raise ValueError(
            f"pack_gate_up: gate and up must be (I, D) of one shape, got {tuple(gate.shape)} and {tuple(up.shape)}"
        )
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


@dataclass(frozen=True)
class _Fused:
    """How one module's separate HF weights map to its fused one."""

    fused: str  # child holding the fused weight ("qkv_proj" / "gate_up_proj")
    parts: tuple  # HF children in state-dict order
    pack: Callable  # (*part weights) -> fused
    unpack: Callable  # fused -> tuple of part weights


def _qkv_fused(hq: int, hkv: int, hd: int) -> _Fused:
    h = {"n_q_heads": hq, "n_kv_heads": hkv, "head_dim": hd}
    return _Fused("qkv_proj", _ATTN_PARTS, lambda q, k, v: pack_qkv(q, k, v, **h), lambda w: unpack_qkv(w, **h))


_GATE_UP = _Fused("gate_up_proj", _MLP_PARTS, pack_gate_up, unpack_gate_up)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s values: a DTensor is all-gathered."""
    t = t.detach()
    return t.full_tensor() if _is_dtensor(t) else t  # pyright: ignore[reportAttributeAccessIssue]  (a DTensor's)


def _is_dtensor(t) -> bool:
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(t, dt.DTensor)


def _like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``full`` distributed like the DTensor ``ref`` (each rank keeps its own chunk; no
    communication), or ``full`` itself when ``ref`` is a plain tensor."""
    if not _is_dtensor(ref):
        return full
    from torch.distributed.tensor import distribute_tensor

    mesh, placements = ref.device_mesh, ref.placements  # pyright: ignore[reportAttributeAccessIssue]  (a DTensor's)
    return distribute_tensor(full.to(ref.device), mesh, placements, src_data_rank=None)


def _state_dict_post_hook(module, state_dict, prefix, local_metadata):
    """Replace ``prefix + fused.weight`` by the HF part weights, in HF's key order."""
    spec: _Fused = module._coda_fused
    key = f"{prefix}{spec.fused}.weight"
    if key not in state_dict:
        return
    mine = [k for k in state_dict if k.startswith(prefix)]  # this module's keys: the last ones inserted
    items = [(k, state_dict.pop(k)) for k in mine]
    for k, v in items:
        if k != key:
            state_dict[k] = v
            continue
        with torch.no_grad():
            parts = spec.unpack(_full(v))
        for name, p in zip(spec.parts, parts, strict=False):
            state_dict[f"{prefix}{name}.weight"] = _like(p, v)


def _load_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
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
        for n, cur in zip(names, current, strict=False):
            if n in state_dict:
                given = _full(state_dict.pop(n))
                if given.shape != cur.shape:
                    error_msgs.append(
                        f"size mismatch for {n}: copying a param with shape {tuple(given.shape)} "
                        f"from checkpoint, the shape in current model is {tuple(cur.shape)}."
                    )
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
    module._coda_handles = [
        module.register_state_dict_post_hook(_state_dict_post_hook),
        module.register_load_state_dict_pre_hook(_load_pre_hook),
    ]


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
        spec: _Fused = self._module._coda_fused  # pyright: ignore[reportAssignmentType]  (nn.Module.__getattr__ is typed Tensor | Module)
        fused = getattr(self._module, spec.fused).weight
        with torch.no_grad():
            part = spec.unpack(_full(fused))[self._index]
        if _is_dtensor(fused):
            return _like(part, fused)
        with torch.inference_mode():
            return part.clone()

    def __repr__(self) -> str:
        spec: _Fused = self._module._coda_fused  # pyright: ignore[reportAssignmentType]  (nn.Module.__getattr__ is typed Tensor | Module)
        return f"PackedPart({spec.parts[self._index]} of {spec.fused}, read-only)"


def _fuse_children(module, spec: _Fused, weight: torch.Tensor) -> None:
    """Swap ``module``'s HF part children for one bias-free nn.Linear ``spec.fused`` holding
    ``weight``, at the first part's position (``_modules`` order = parameter order); the
    part names become :class:`PackedPart` attributes."""
    old = module._modules
    lin = _linear(weight, old[spec.parts[0]].weight.requires_grad)
    module._modules = {
        (spec.fused if n == spec.parts[0] else n): (lin if n == spec.parts[0] else m)
        for n, m in old.items()
        if n not in spec.parts[1:]
    }
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
            new.update(zip(spec.parts, linears, strict=False))
        else:
            new[n] = m
    module._modules = new
    del module._coda_fused, module._coda_handles


def _linear(weight: torch.Tensor, requires_grad: bool) -> nn.Linear:
    out_f, in_f = weight.shape
    lin = nn.Linear(in_f, out_f, bias=False, device="meta", dtype=weight.dtype)
    lin.weight = nn.Parameter(weight, requires_grad=requires_grad)
    return lin

"""Deterministic input generation for every verifier trial.

Why: the candidate worker and the reference worker are separate processes (the
reference must never share a process with untrusted code), so they cannot pass the
inputs to each other in memory; instead each regenerates them. Every tensor is drawn
from its own ``torch.Generator(device)`` seeded with a hash of ``(seed, tensor name)``,
in fp32 and then cast to the declared dtype, so two processes on the same device type
produce bit-identical inputs and adding an input never shifts another's values.
(CPU and CUDA generators differ: both workers always use the same device.)

Scales come from the spec's :class:`~coda_agent.verifier.spec.InitSpec` (``std``,
``low``, ``high`` are dim expressions like ``"1/sqrt(K)"``), chosen by the spec author
so that outputs are O(1) -- threat 8 in verifier-threats.md (degenerate references).
A ``derived`` input (what a forward saved for its backward: ``rstd``, ``lse``) is computed
from the inputs drawn before it by the spec's trusted ``reference.<fn>`` on the same
device, so both workers get the same values and the values are consistent.
"""

from __future__ import annotations

import hashlib
import inspect
from types import ModuleType
from typing import Any

import torch

from coda_agent.verifier.spec import KernelSpec, LoadedSpec, eval_expr

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int64": 8}
"""Element size in bytes of each spec dtype name."""


def _spec(spec: KernelSpec | LoadedSpec) -> KernelSpec:
    return spec.spec if isinstance(spec, LoadedSpec) else spec


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of tensor ``name`` in trial ``seed`` (63-bit, from sha256)."""
    digest = hashlib.sha256(f"coda-inputs:{int(seed)}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_inputs(
    spec: KernelSpec | LoadedSpec,
    dims: dict[str, int],
    seed: int,
    device: str | torch.device = "cuda",
    reference: ModuleType | None = None,
) -> dict[str, torch.Tensor]:
    """Draw every entry input of ``spec`` at ``dims`` for trial ``seed``.

    Returns ``{name: tensor}`` in the spec's input order, each of the declared shape and
    dtype on ``device``. ``normal``: ``mean + std * N(0,1)``; ``uniform``: ``U(low, high)``;
    ``randint``: integers in ``[low, high)``; ``derived``: ``reference.<fn>(**earlier)`` (plus ``dims=`` when the function
    takes a ``dims`` parameter, e.g. to build a RoPE frequency table of length HD/2).
    Floats are drawn in fp32 then cast.
    Raises ``ValueError`` when a scale expression names an unknown dim, when a derived
    input is requested without a :class:`LoadedSpec` (its reference module), or when the
    derived tensor has the wrong shape. ``reference``: the spec's already imported
    reference module (the workers hold one); without it a derived input imports
    ``reference.py`` afresh for this call.
    """
    s = _spec(spec)
    dev = torch.device(device)
    out: dict[str, torch.Tensor] = {}
    ref = reference
    for t in s.entry.inputs:
        shape = s.shape_of(t, dims)
        dtype = getattr(torch, t.dtype)
        if t.init.dist == "derived":
            if not isinstance(spec, LoadedSpec):
                raise ValueError(f"input {t.name!r} is derived (reference.{t.init.fn}): "
                                 "make_inputs needs the LoadedSpec, not the bare KernelSpec")
            ref = ref or spec.load_reference()
            fn = getattr(ref, t.init.fn)
            extra = {"dims": dict(dims)} if "dims" in inspect.signature(fn).parameters else {}
            with torch.no_grad():
                x = fn(**out, **extra)
            if tuple(x.shape) != tuple(shape):
                raise ValueError(f"reference.{t.init.fn} returned shape {tuple(x.shape)} for "
                                 f"input {t.name!r}, the spec declares {tuple(shape)}")
            out[t.name] = x.to(device=dev, dtype=dtype).contiguous()
            continue
        gen = torch.Generator(device=dev)
        gen.manual_seed(tensor_seed(seed, t.name))
        init = t.init
        if init.dist == "normal":
            std = float(eval_expr(init.std, dims))
            x = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32)
            x.mul_(std).add_(float(init.mean))
        elif init.dist == "uniform":
            low, high = float(eval_expr(init.low, dims)), float(eval_expr(init.high, dims))
            x = torch.rand(shape, generator=gen, device=dev, dtype=torch.float32)
            x.mul_(high - low).add_(low)
        else:  # randint
            low, high = int(eval_expr(init.low, dims)), int(eval_expr(init.high, dims))
            x = torch.randint(low, high, shape, generator=gen, device=dev, dtype=torch.int64)
        out[t.name] = x.to(dtype).contiguous()
    return out


def tensor_bytes(spec: KernelSpec | LoadedSpec, dims: dict[str, int], which: str = "all") -> int:
    """Bytes of the entry's tensors at ``dims``: ``which`` = "inputs", "outputs" or "all"."""
    s = _spec(spec)
    tensors: list[Any] = []
    if which in ("inputs", "all"):
        tensors += s.entry.inputs
    if which in ("outputs", "all"):
        tensors += s.entry.outputs
    total = 0
    for t in tensors:
        n = 1
        for d in s.shape_of(t, dims):
            n *= d
        total += n * DTYPE_BYTES[t.dtype]
    return total


def rotation_count(set_bytes: int, budget_bytes: int = 4 << 30, lo: int = 2, hi: int = 8) -> int:
    """How many distinct input sets to rotate through while timing.

    At least ``lo`` (so a cache keyed on the input pointer never hits on consecutive
    calls), at most ``hi``, and no more than ``budget_bytes`` of inputs unless ``lo``
    sets already exceed it.
    """
    if set_bytes <= 0:
        return hi
    return max(lo, min(hi, budget_bytes // set_bytes))


def upcast(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp32 copies of the floating inputs (integer inputs unchanged): the ref32 inputs."""
    return {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}

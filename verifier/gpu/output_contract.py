"""The output contract of one call's result, checked without running the result's own code.

Each returned value must be exactly ``torch.Tensor`` (checked with ``type(x) is``, before
touching it: a subclass could run code on any method call) with no instance attributes
(an attribute named like a method would shadow it), dense and strided, on the GPU, of the
declared shape and dtype, contiguous, owning the bytes its shape addresses, and sharing
storage with no input and no other output. Every tensor method used here was captured
before any candidate code ran (:mod:`~coda_agent.verifier.gpu.instruments`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..spec import KernelSpec, OutputSpec
from .instruments import _T, _S_data_ptr, _S_nbytes, _Tensor


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    st = _T["untyped_storage"](t)
    p = _S_data_ptr(st)
    return p, p + _S_nbytes(st)


def storage_holds(t: torch.Tensor, span: tuple[int, int]) -> bool:
    """Whether ``t``'s storage (``span``, from :func:`storage_span`) has the bytes its offset, shape
    and strides address (a storage resized to 0 after the call would make any read of
    ``t`` touch freed memory)."""
    shape, stride = tuple(t.shape), _T["stride"](t)
    if 0 in shape:
        return True
    last = _T["storage_offset"](t) + sum((n - 1) * st for n, st in zip(shape, stride, strict=False))
    return (last + 1) * _T["element_size"](t) <= span[1] - span[0]


def instance_attrs(o: Any) -> list[str]:
    """Names in ``o``'s instance ``__dict__`` (read without running ``o``'s own lookup)."""
    try:
        d = object.__getattribute__(o, "__dict__")
    except AttributeError:
        return []
    return [k if type(k) is str else "<non-str key>" for k in d] if type(d) is dict else ["__dict__"]


def gather(o: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``o``'s flat elements at ``idx`` (device), through the captured Tensor methods."""
    return _T["index_select"](_T["reshape"](_T["detach"](o), -1), 0, idx)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` through the captured Tensor methods."""
    return _T["to"](_T["detach"](t), "cpu", copy=True)


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[1] > a[0] and b[1] > b[0] and a[0] < b[1] and b[0] < a[1]


def check_output(
    spec: KernelSpec,
    spec_o: OutputSpec,
    o: Any,
    dims: dict[str, int],
    device: torch.device,
    in_spans: dict,
    out_spans: dict,
) -> list[dict[str, Any]]:
    """Violations of the output contract for one returned value ``o`` (output ``spec_o`` at
    ``dims``): see the module docstring. ``in_spans``: the inputs' storage spans;
    ``out_spans``: the earlier outputs' (this one's is added)."""
    name = spec_o.name
    if type(o) is not _Tensor:
        t = type(o)
        return [
            dict(
                kind="output-not-plain-tensor",
                output=name,
                message=f"{name}: returned a {t.__module__}.{t.__qualname__}, expected exactly torch.Tensor "
                "(no subclasses, wrappers or lazy objects)",
            )
        ]
    attrs = instance_attrs(o)
    if attrs:
        return [
            dict(
                kind="output-not-plain-tensor",
                output=name,
                message=f"{name}: carries instance attribute(s) {', '.join(sorted(attrs))[:200]}, which could "
                "shadow tensor methods; return a plain tensor",
            )
        ]
    if o.layout != torch.strided:
        return [
            dict(
                kind="output-not-plain-tensor",
                output=name,
                message=f"{name}: layout {o.layout}, expected a dense strided tensor",
            )
        ]
    if o.device.type != device.type:
        return [
            dict(
                kind="output-not-plain-tensor",
                output=name,
                message=f"{name}: lives on {o.device}, expected the GPU ({device})",
            )
        ]
    v: list[dict[str, Any]] = []
    want_shape = spec.shape_of(spec_o, dims)
    want_dtype = getattr(torch, spec_o.dtype)
    if tuple(o.shape) != want_shape:
        v.append(
            dict(
                kind="output-shape",
                output=name,
                message=f"{name}: shape {tuple(o.shape)}, expected {want_shape} ({spec_o.shape} at {dims})",
            )
        )
    if o.dtype != want_dtype:
        v.append(dict(kind="output-dtype", output=name, message=f"{name}: dtype {o.dtype}, expected {want_dtype}"))
    if not _T["is_contiguous"](o):
        v.append(
            dict(
                kind="output-shape",
                output=name,
                message=f"{name}: not contiguous (strides {tuple(_T['stride'](o))}); return a dense row-major tensor",
            )
        )
    span = storage_span(o)
    if not storage_holds(o, span):
        return v + [
            dict(
                kind="output-not-plain-tensor",
                output=name,
                message=f"{name}: its storage holds {span[1] - span[0]} bytes, fewer than its shape "
                "needs (a resized or freed storage): return a tensor that owns its data",
            )
        ]
    for k, s in in_spans.items():
        if spans_overlap(span, s):
            v.append(
                dict(
                    kind="output-aliases-input",
                    output=name,
                    message=f"{name}: shares storage with input {k!r}; outputs must be freshly allocated",
                )
            )
    for k, s in out_spans.items():
        if spans_overlap(span, s):
            v.append(
                dict(kind="output-aliases-output", output=name, message=f"{name}: shares storage with output {k!r}")
            )
    out_spans[name] = span
    return v

"""Which elements a sampled run compares, per output, and how an fp8 output's elements map
to the blocks of its scale.

A sampled run (a benchmark-shape check, a timed call's check: ``Run.sample``) saves only
some elements of each output; both workers pick them with :func:`output_samples`. An fp8
output is judged with its scale (``verifier/stages/numerics_fp8.py``), so its scale
output is sampled *paired*: the scale's j-th sample is the scale of the fp8 output's j-th
sampled element (:func:`scale_index`), and the parent reads both side by side.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..spec import scale_blocks
from .protocol import sample_index


def scale_index(flat: torch.Tensor, out_shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> torch.Tensor:
    """The flat index into the scale (of shape ``scale_shape``) of each flat element index
    ``flat`` (int64) of the fp8 output (of shape ``out_shape``): element ``(i0, i1, ...)``
    has scale ``(i0 // b0, i1 // b1, ...)`` for the blocks ``b`` of
    :func:`~coda_agent.verifier.spec.scale_blocks`. Raises ``ValueError`` when the shapes
    do not form whole blocks."""
    blocks = scale_blocks(tuple(out_shape), tuple(scale_shape))
    if blocks is None:
        raise ValueError(f"output shape {tuple(out_shape)} is not whole blocks of scale shape {tuple(scale_shape)}")
    if math.prod(scale_shape) == 1:
        return torch.zeros_like(flat)
    idx = torch.zeros_like(flat)
    rest = flat.clone()
    coords = []
    for d in reversed(out_shape):
        coords.append(rest % d)
        rest = rest // d
    coords.reverse()
    for c, b, s in zip(coords, blocks, scale_shape, strict=True):
        idx = idx * s + c // b
    return idx


def output_samples(spec: Any, dims: dict[str, int], n: int, seed: int) -> list[torch.Tensor]:
    """Per output position of ``spec.entry.outputs``, the flat element positions (CPU int64)
    a sampled run with ``n`` samples and ``seed`` compares: :func:`sample_index` for each
    output, except the scale of an fp8 output, which takes the scale index of each of that
    output's samples (:func:`scale_index`). Both workers call this."""
    outs = spec.entry.outputs
    shapes = {o.name: tuple(spec.shape_of(o, dims)) for o in outs}
    idx = [sample_index(math.prod(shapes[o.name]), n, seed, pos) for pos, o in enumerate(outs)]
    pos_of = {o.name: pos for pos, o in enumerate(outs)}
    for o in outs:
        if o.scale is not None:
            idx[pos_of[o.scale]] = scale_index(idx[pos_of[o.name]], shapes[o.name], shapes[o.scale])
    return idx


def expand_blocks(scale: torch.Tensor, out_shape: tuple[int, ...]) -> torch.Tensor:
    """``scale`` (one value per block) broadcast to every element of the fp8 output of
    shape ``out_shape`` (:func:`scale_index`'s block map). Raises ``ValueError`` when the
    shapes do not form whole blocks."""
    out_shape = tuple(out_shape)
    blocks = scale_blocks(out_shape, tuple(scale.shape))
    if blocks is None:
        raise ValueError(f"output shape {out_shape} is not whole blocks of scale shape {tuple(scale.shape)}")
    if scale.numel() == 1:
        return scale.reshape(()).expand(out_shape)
    x = scale
    for d, b in enumerate(blocks):
        x = x.repeat_interleave(b, dim=d)
    return x


def block_max(values: torch.Tensor, scale_shape: tuple[int, ...]) -> torch.Tensor:
    """The largest of ``values`` (an fp8 output's shape, finite) over each block of a scale
    of shape ``scale_shape``: a tensor of ``scale_shape``."""
    blocks = scale_blocks(tuple(values.shape), tuple(scale_shape))
    if blocks is None:
        raise ValueError(f"shape {tuple(values.shape)} is not whole blocks of scale shape {tuple(scale_shape)}")
    if math.prod(scale_shape) == 1:
        return values.amax().reshape(scale_shape) if values.numel() else torch.zeros(scale_shape, dtype=values.dtype)
    split = [v for s, b in zip(scale_shape, blocks, strict=True) for v in (s, b)]
    dims = tuple(range(1, 2 * len(scale_shape), 2))
    return values.reshape(split).amax(dim=dims)

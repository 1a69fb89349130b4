"""Whole-spec checks of the declarations a real op needs beyond one GEMM tile: fp8 outputs
and their scales, and the per-input secret draws. Called from
:meth:`~coda_agent.verifier.spec.models.KernelSpec._consistent` (once) and
``_check_values`` (at every shape case and every secret coverage shape); each raises
``ValueError`` naming the field and what was expected.
"""

from __future__ import annotations

import math
from typing import Any

from .tensors import FP8_DTYPES, OutputSpec


def check_fp8_outputs(outputs: list[OutputSpec]) -> None:
    """Every fp8 output's ``scale`` names another output that holds float32 values, is no
    gradient and no fp8 output itself, has the fp8 output's rank (or is one element: a
    per-tensor scale), and is not the scale of two outputs."""
    by_name = {o.name: o for o in outputs}
    used: dict[str, str] = {}
    for o in outputs:
        if o.scale is None:
            continue
        where = f"entry.outputs[{o.name}].scale"
        s = by_name.get(o.scale)
        if s is None or s is o:
            raise ValueError(f"{where} = {o.scale!r}: expected the name of another output ({sorted(by_name)})")
        if s.dtype != "float32" or s.gradient is not None:
            raise ValueError(
                f"{where} = {o.scale!r}: a scale output is a float32 value output (got dtype {s.dtype}"
                + (", a gradient" if s.gradient is not None else "")
                + ")"
            )
        if o.scale in used:
            raise ValueError(f"{where} = {o.scale!r}: already the scale of output {used[o.scale]!r}")
        used[o.scale] = o.name
        if len(s.shape) not in (len(o.shape), 0, 1):
            raise ValueError(
                f"{where} = {o.scale!r}: its shape {s.shape} must have the rank of {o.name}'s "
                f"{o.shape} (one scale per block) or be one element (one per tensor)"
            )


def scale_blocks(out_shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The block of output elements one scale element covers, per output dim: the quotients
    ``out_shape[i] / scale_shape[i]`` (every output dim for a one-element scale, which
    covers the whole tensor); None when a quotient is not an integer."""
    if math.prod(scale_shape) == 1 and len(scale_shape) != len(out_shape):
        return tuple(out_shape)
    if len(scale_shape) != len(out_shape):
        return None
    if any(s <= 0 or o % s for o, s in zip(out_shape, scale_shape, strict=True)):
        return None
    return tuple(o // s for o, s in zip(out_shape, scale_shape, strict=True))


def check_scale_blocks(where: str, shapes: dict[str, list[int]], outputs: list[OutputSpec]) -> None:
    """At one shape case (``shapes``: each entry tensor's evaluated shape): every fp8
    output's scale divides it into whole blocks (``scale_blocks``)."""
    for o in outputs:
        if o.scale is None:
            continue
        out, sc = tuple(shapes[o.name]), tuple(shapes[o.scale])
        if scale_blocks(out, sc) is None:
            raise ValueError(
                f"{where}: entry.outputs[{o.name}]: shape {out} is not a whole number of blocks of its "
                f"scale {o.scale} {sc} (each dim of the output must be a multiple of the scale's, "
                "or the scale has one element)"
            )


def check_draws(spec: Any) -> None:
    """Per input: ``draws`` may name ``nonfinite`` only when ``coverage.nonfinite`` is set, and
    an input in ``coverage.plain_inputs`` may not also list draws (it is drawn as declared)."""
    plain = set(spec.coverage.plain_inputs)
    for t in spec.all_inputs:
        if t.draws is None:
            continue
        where = f"{spec.input_field(t)}[{t.name}].draws"
        if "nonfinite" in t.draws and not spec.coverage.nonfinite:
            raise ValueError(f"{where}: 'nonfinite' needs coverage.nonfinite = true (the op propagates NaN/Inf)")
        if t.draws and t.name in plain:
            raise ValueError(f"{where}: {t.name!r} is in coverage.plain_inputs (always drawn as declared)")


__all__ = ["FP8_DTYPES", "check_draws", "check_fp8_outputs", "check_scale_blocks", "scale_blocks"]

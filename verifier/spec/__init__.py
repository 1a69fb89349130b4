"""Kernel specs: one fused op described completely, as validated data.

A spec lives in ``kernel_specs/<name>/`` as two files:

* ``spec.toml`` -- the data below (validated by pydantic: :class:`KernelSpec`);
* ``reference.py`` -- trusted PyTorch code: the op written from its *standard*
  (not reparameterized) definition, plus the baselines it is benchmarked against.

Design
------
The spec is the single contract shared by the agent (it renders it into the task
prompt), the verifier (it generates inputs, checks outputs and gradients, times the
benchmark shapes) and the regression (it hashes the spec so an accepted kernel is
re-verified when its contract changes).

Shapes are written in symbolic dims (``["M", "2*I"]``); a shape case binds each dim
to an integer. Dim expressions and input scales are tiny arithmetic expressions over
the dims (``"1/sqrt(K)"``), evaluated by :func:`eval_expr` -- never ``eval``.

Reference module contract (``reference.py``), all functions keyword-only over the
spec's input names -- the reference-only inputs (``[[reference.inputs]]``) and the entry's
-- plus the entry's keyword constants when the spec has any (``entry.constants``, ints;
``entry.float_constants``, floats), any dtype in/out (the verifier calls them with
fp32-upcast inputs for ``ref32``, with the low-precision inputs for ``ref_lowp`` and, for a
spec with an fp8 output, with float64-upcast inputs to measure ``ref32``'s own rounding):

* ``reference(**inputs) -> dict[str, Tensor]`` -- every output that is *not*
  declared as a gradient; for an fp8 output, its real value before the final rounding
  (e.g. the GEMM's output ``y``, whose quantized form is ``y / scale`` rounded to the fp8
  dtype: the verifier rounds, see ``verifier/stages/numerics_fp8.py``), in the inputs'
  precision;
* the function named by an output's ``gradient.of`` -- a differentiable forward
  ``f(**inputs_without_upstream) -> Tensor``; the output is checked against
  ``torch.autograd.grad(f(...), inputs[wrt], grad_outputs=inputs[upstream])``;
* ``baseline(**inputs) -> dict[str, Tensor]`` -- the standard unfused PyTorch code the
  fused kernel replaces (timed eager and under ``torch.compile``);
* ``bare_gemm(**inputs) -> Tensor`` -- the plain GEMM of the same M/N/K (the speed of
  light for an epilogue that hides under the mainloop);
* optionally ``quack_library(**inputs) -> dict`` -- quack's hand-written equivalent;
* optionally ``liger(**inputs) -> dict | Tensor`` -- Liger Kernel's equivalent (the
  ``liger`` baseline). It usually lives instead in an optional third file,
  ``kernel_specs/<name>/liger.py``, defining ``liger`` with the same calling convention
  (the reference's own ``liger`` wins when both exist). liger.py is deliberately *not*
  part of the spec hash (:func:`spec_hash` covers spec.toml and reference.py only): it
  is a comparison, not the definition, so adding or fixing an adapter never invalidates
  an accepted kernel. ``coda-agent bench`` times it when the file exists; liger-kernel
  is an optional dependency (``pip install coda-agent[bench]``) and a missing install
  is recorded as that baseline's error, never fatal.

Errors: :func:`load_spec` raises :class:`SpecError` whose message names the file,
the field path and what was expected.
"""

from .checks import scale_blocks
from .expressions import MAX_EXPONENT, MAX_EXPR_CHARS, MAX_INT_BITS, eval_expr, expr_names
from .loading import (
    LIGER_FILE,
    LIGER_MISSING,
    NO_LIGER,
    REFERENCE_FILE,
    REQUIRED_REFERENCE_FUNCS,
    SPEC_FILE,
    LoadedSpec,
    SpecError,
    diff_fields,
    find_specs,
    load_spec,
    resolve_spec,
    spec_hash,
)
from .models import (
    DEFAULT_FLOOR_ULPS,
    DEFAULT_QUANTILE_FACTOR,
    DEFAULT_ULPS,
    DTYPE_BYTES,
    DTYPES,
    FP8_DTYPES,
    LAUNCH_NAMES_KEPT,
    MAX_BAR,
    MAX_ULPS,
    RECHECK_ROW_DIM,
    WORKSPACE_FLOOR,
    BenchSpec,
    CoverageSpec,
    DimDraw,
    EntrySpec,
    GradientSpec,
    InitSpec,
    InputSpec,
    KernelSpec,
    OutputSpec,
    OutputTolerance,
    ReferenceSpec,
    ShapeCase,
    ShapesSpec,
    TensorSpec,
    ToleranceSpec,
)

__all__ = [
    "BenchSpec",
    "CoverageSpec",
    "DEFAULT_FLOOR_ULPS",
    "DEFAULT_QUANTILE_FACTOR",
    "DEFAULT_ULPS",
    "DTYPES",
    "DTYPE_BYTES",
    "FP8_DTYPES",
    "DimDraw",
    "EntrySpec",
    "GradientSpec",
    "InitSpec",
    "InputSpec",
    "KernelSpec",
    "LAUNCH_NAMES_KEPT",
    "LIGER_FILE",
    "LIGER_MISSING",
    "LoadedSpec",
    "MAX_BAR",
    "MAX_EXPONENT",
    "MAX_EXPR_CHARS",
    "MAX_INT_BITS",
    "MAX_ULPS",
    "NO_LIGER",
    "OutputSpec",
    "OutputTolerance",
    "RECHECK_ROW_DIM",
    "ReferenceSpec",
    "REFERENCE_FILE",
    "REQUIRED_REFERENCE_FUNCS",
    "SPEC_FILE",
    "ShapeCase",
    "ShapesSpec",
    "SpecError",
    "TensorSpec",
    "ToleranceSpec",
    "WORKSPACE_FLOOR",
    "diff_fields",
    "eval_expr",
    "expr_names",
    "find_specs",
    "load_spec",
    "resolve_spec",
    "scale_blocks",
    "spec_hash",
]

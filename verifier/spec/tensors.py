"""Tensor declarations of a spec: the dtypes a spec may use, how an input is drawn
(:class:`InitSpec`), the entry's inputs and outputs (:class:`InputSpec`,
:class:`OutputSpec`) and the inputs only the reference receives (:class:`ReferenceSpec`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .expressions import _check_expr

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
"""The fp8 dtype names a spec may use (OCP FP8: e4m3 without infinities, max 448; e5m2, max 57344)."""
DTYPES = ("bfloat16", "float16", "float32", "int32", "int64", *FP8_DTYPES)
"""dtype names a spec may use (torch attribute names)."""
DtypeName = Literal["bfloat16", "float16", "float32", "int32", "int64", "float8_e4m3fn", "float8_e5m2"]
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "int32": 4,
    "int64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
"""Element size in bytes of each spec dtype name."""
DRAW_NAMES = ("heavy", "outliers", "saturate", "tiny_rows", "nonfinite")
"""The secret coverage draws that change input values (``verifier/gpu/inputs.py``: ``DRAWS``)."""
DrawName = Literal["heavy", "outliers", "saturate", "tiny_rows", "nonfinite"]


class _Strict(BaseModel):
    # no inf/nan anywhere: `tolerance.floor = inf` would make every comparison pass
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class InitSpec(_Strict):
    """How an input tensor is drawn (fresh per trial, on the GPU, from a seeded generator).

    ``dist="normal"``: ``mean + std * N(0, 1)``; ``dist="uniform"``: U(low, high);
    ``dist="randint"``: integers in [low, high) (e.g. class indices). ``std``/``low``/``high``
    may be dim expressions (``"1/sqrt(K)"``) chosen so that outputs are O(1), never ~0.

    ``dist="derived"``: the tensor is a function of inputs declared *before* it, computed
    by ``reference.<fn>(**earlier_inputs)`` (trusted spec code; a ``dims`` parameter, if the
    function has one, receives the shape binding). This is how a backward
    spec receives what its forward saved -- e.g. ``rstd`` of the drawn ``h``, or the
    ``lse`` of the drawn logits -- consistent with the other inputs instead of random.
    """

    dist: Literal["normal", "uniform", "randint", "derived"] = "normal"
    mean: float = 0.0
    std: str | float = 1.0
    low: str | float = -1.0
    high: str | float = 1.0
    fn: str | None = Field(
        default=None,
        pattern=r"^[a-z_][a-z0-9_]*$",
        description="dist='derived': the reference.py function computing it",
    )

    _v = field_validator("std", "low", "high")(lambda cls, v: _check_expr(v))

    @model_validator(mode="after")
    def _fn_iff_derived(self) -> "InitSpec":
        if (self.dist == "derived") != (self.fn is not None):
            raise ValueError(
                "'fn' names the reference.py function of a dist='derived' input, and only such an input has one"
            )
        return self


class TensorSpec(_Strict):
    """One input or output tensor of the entry point.

    ``shape`` is a list of dim expressions (``["M", "2*I"]``); ``dtype`` a torch dtype name.
    ``partial``: the tensor is not a GEMM operand or tile (e.g. per-(row, 128-column block)
    scales ``["M", "N/128"]``, per-(row, head) statistics ``["M", "HQ+HKV"]``): the
    epilogue reads or writes it with plain loads and stores (a ``GroupedColStatsOut``, a
    reduce's finalize), never TMA, so its rows need not be a multiple of 16 bytes. Its dims
    must still be positive integers at every shape.
    """

    name: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    shape: list[str | int]
    dtype: DtypeName
    description: str = ""
    partial: bool = False

    _v = field_validator("shape")(lambda cls, v: [_check_expr(x) for x in v])


class GradientSpec(_Strict):
    """Declares an output to be a gradient, checked against ``torch.autograd``.

    The output must equal ``d f(**inputs) / d inputs[wrt]`` contracted with
    ``inputs[upstream]``, where ``f`` is ``reference.<of>`` (computed in fp32 from
    upcast inputs for the reference, and in the low precision for the tolerance).
    """

    of: str = Field(description="name of the differentiable forward in reference.py")
    wrt: str = Field(description="input the gradient is taken with respect to")
    upstream: str = Field(description="input holding the upstream gradient (grad_outputs)")


class InputSpec(TensorSpec):
    """An input: a tensor spec plus how to draw it.

    ``init`` is the declared draw (the public cases'); ``draws`` the secret coverage draws
    (:data:`DRAW_NAMES`) that may change this input, each input on its own: None (the
    default) is every draw that applies to its ``init``; ``[]`` draws it always as
    declared (the same as listing it in ``coverage.plain_inputs``); e.g. ``["outliers"]``
    for a norm weight whose trained values have a few large channels but no heavy tails.
    An fp8 input is drawn in fp32, clamped to the format's finite range and rounded
    to nearest even."""

    init: InitSpec = InitSpec()
    layout: str = Field(default="", description="free text for the prompt, e.g. 'gate/up interleaved along N'")
    draws: list[DrawName] | None = Field(
        default=None,
        description="secret coverage draws that may change this input (None: every one that applies)",
    )

    @field_validator("draws")
    @classmethod
    def _distinct_draws(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"draws must be distinct, got {v}")
        return v


class OutputSpec(TensorSpec):
    """An entry-point output; ``gradient`` set means it is checked through autograd.

    ``scale`` (fp8 outputs only, and required there): the name of the float32 output that
    holds its dequantization scales. The fp8 output's real value is ``out * scale``, each
    element with the scale of its block: the scale's shape divides the output's dim by
    dim (``["M", "N/128"]`` for 1x128 blocks of an (M, N) output: element (m, n) has scale
    (m, n // 128)), or the scale has one element (per tensor). The fp8 rule of
    ``verifier/stages/numerics_fp8.py`` judges it; ``reference()`` returns, for an fp8
    output, its real value before the final rounding (the verifier rounds it)."""

    gradient: GradientSpec | None = None
    scale: str | None = Field(default=None, description="fp8 outputs: the output holding their scales")

    @model_validator(mode="after")
    def _fp8_has_scale(self) -> "OutputSpec":
        fp8 = self.dtype in FP8_DTYPES
        if fp8 and self.scale is None:
            raise ValueError(
                f"output {self.name!r} is {self.dtype}: name the float32 output holding its "
                'dequantization scales (scale = "<output>")'
            )
        if not fp8 and self.scale is not None:
            raise ValueError(f"output {self.name!r}: 'scale' is for fp8 outputs ({', '.join(FP8_DTYPES)})")
        if fp8 and self.gradient is not None:
            raise ValueError(f"output {self.name!r}: a gradient output cannot be fp8 (its rules are the CODA rules)")
        return self


class ReferenceSpec(_Strict):
    """``[reference]``: what only the reference receives.

    ``inputs``: tensors drawn before the entry's inputs and passed to every ``reference.py``
    function, never to the entry: the op's standard definition reads them (the pre-norm
    ``y`` and the norm weight ``gamma`` of a deferred RMSNorm) while the kernel receives
    what an earlier kernel made of them (``a = y * gamma`` and ``rstd``: entry inputs
    ``derived`` from these). Drawn like the entry's inputs (``init``, ``draws``)."""

    inputs: list[InputSpec] = Field(default_factory=list)

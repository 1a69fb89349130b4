"""The spec's data model: pydantic models of ``spec.toml`` (:class:`KernelSpec` and its
parts), with the whole-spec checks that every shape case is legal at load time.
"""

from __future__ import annotations

import keyword
import math
from typing import Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from .checks import check_draws, check_fp8_outputs, check_scale_blocks
from .expressions import _check_expr, eval_expr, expr_names
from .tensors import (  # noqa: F401  (re-exported: the spec's public models)
    DTYPE_BYTES,
    DTYPES,
    FP8_DTYPES,
    GradientSpec,
    InitSpec,
    InputSpec,
    OutputSpec,
    ReferenceSpec,
    TensorSpec,
    _Strict,
)

WORKSPACE_FLOOR = 8 << 20
"""The smallest default workspace budget, bytes (see :meth:`KernelSpec.workspace_budget`)."""

RECHECK_ROW_DIM = "M"
"""The dim the post-timing recheck redraws at random (every catalogue spec's GEMM M, the
token rows: any value is legal for a correct kernel)."""

LAUNCH_NAMES_KEPT = 256
"""Kernel names a launch record keeps (the candidate worker's bench-shape record; the
correctness records keep all). ``entry.max_launches`` may not exceed it, so every launch
of a call within budget is named and its GEMMs can be counted
(:func:`~coda_agent.verifier.gpu.protocol.gemm_launches`)."""

MAX_BAR = 10.0
"""Largest bench.bar ratio (a bar of 1e300 is always met; the catalogue's are 1.0-1.1)."""
DEFAULT_ULPS = 3.0
"""Default per-element bound, in ulps of the output dtype (``ToleranceSpec.ulps``)."""
DEFAULT_FLOOR_ULPS = 2.0
"""Default per-element floor, in low-precision ulps at the row scale (``ToleranceSpec.floor_ulps``)."""
MAX_ULPS = 64.0
"""Largest ``ulps`` a spec may set (64 bf16 ulps is half the value: looser judges nothing)."""
DEFAULT_QUANTILE_FACTOR = 2.0
"""Default factor on the low-precision reference's error quantiles (``ToleranceSpec.quantile_factor``)."""


# --------------------------------------------------------------------------- models


class EntrySpec(_Strict):
    """The function the candidate module must export.

    ``function(*inputs in order, **constants) -> tuple(outputs in order)`` (a single output
    may be returned bare; ``constants`` are dims passed as keyword-only ints, then
    ``float_constants`` as keyword-only floats: :attr:`keyword_names`). ``max_launches``
    bounds the CUDA kernels one call may launch (counted with the profiler; CODA requires
    one launch per fused op), ``max_gemm_launches`` how many of them may be GEMMs. Raises
    (through pydantic) when ``max_gemm_launches`` exceeds ``max_launches``.
    """

    function: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    constants: list[str] = Field(
        default_factory=list,
        description="dims the entry (and every reference.py function) also receives, as "
        "keyword-only int arguments after the tensors -- what tensor shapes cannot tell, "
        "e.g. the number of query heads of a packed QKV projection",
    )
    float_constants: dict[str, float] = Field(
        default_factory=dict,
        description="keyword-only float arguments of the entry (and every reference.py function) "
        "after the int constants, with their values: what the op fixes but no shape tells, e.g. "
        "a norm's eps (float_constants = { eps = 1e-6 })",
    )
    max_launches: int = Field(default=1, ge=1, le=LAUNCH_NAMES_KEPT)
    max_gemm_launches: int = Field(
        default=1,
        ge=1,
        description="GEMM launches (quack GemmMod or cuBLAS kernels, protocol.gemm_launches) one call may "
        "make, within max_launches: the GEMMs of the spec's math (1 for one fused GEMM, e.g. 3 for a "
        "dgrad + wgrad pair behind a fused GEMM). Host prep may spend the rest of max_launches; a second "
        "pass over a GEMM's output through a dummy-K GEMM may not (tests/verifier/corpus/second_gemm_pass.py)",
    )
    max_workspace: str | int | None = Field(
        default=None,
        description="bytes of device memory one call may hold beyond its inputs and returned "
        "outputs, at its peak (a dim expression, e.g. '16*M*V/128'); default: half the largest "
        "declared tensor, at least 8 MiB (see KernelSpec.workspace_budget)",
    )
    allowed_torch: list[str] = Field(
        default_factory=list,
        description="torch functions/methods host code may call beyond allocation and "
        "views (e.g. 'rsqrt' for a finalize step)",
    )

    _ws = field_validator("max_workspace")(lambda cls, v: v if v is None else _check_expr(v))

    @property
    def keyword_names(self) -> list[str]:
        """Every keyword-only parameter of the entry, in order: the int constants, then the
        float constants."""
        return [*self.constants, *self.float_constants]

    @model_validator(mode="after")
    def _gemms_within_launches(self) -> "EntrySpec":
        if self.max_gemm_launches > self.max_launches:
            raise ValueError(
                f"max_gemm_launches = {self.max_gemm_launches} exceeds max_launches = "
                f"{self.max_launches}: every GEMM launch is a launch"
            )
        return self


class OutputTolerance(_Strict):
    """Per-output overrides of :class:`ToleranceSpec`'s numbers (``[tolerance.outputs.<name>]``);
    a field left out keeps the spec-wide value. Same bounds as there."""

    factor: float | None = Field(default=None, gt=0, le=16)
    floor: float | None = Field(default=None, ge=0, le=1e-2)
    ulps: float | None = Field(default=None, gt=0, le=MAX_ULPS)
    floor_ulps: float | None = Field(default=None, gt=0, le=MAX_ULPS)
    quantile_factor: float | None = Field(default=None, gt=0, le=16)


class ToleranceSpec(_Strict):
    """The acceptance rules for every output and gradient (``verifier/stages/numerics.py`` has
    the rationale of each).

    ``rule="coda"``: four rules, all of which must hold:

    * max-abs (CODA paper): ``max|out - ref32| <= factor * max|ref_lowp - ref32| + floor``;
    * per element: ``|out_i - ref32_i| <= ulps * ulp_out(|ref32_i|) + factor * |ref_lowp_i -
      ref32_i| + floor_ulps * ulp_low(scale of row i) + floor``, so small and medium
      elements count, not only the largest;
    * error quantiles: the 50/90/99th percentiles of ``|out - ref32|`` at most
      ``quantile_factor`` times those of ``|ref_lowp - ref32|`` plus ``ulp_low(scale) + floor``;
    * sign: where ``|ref32_i|`` is well above its rounding floor, ``out_i * ref32_i > 0``;
    * non-finite: NaN/Inf exactly where ``ref32`` has them.

    ``rule="abs"``: ``max|out - ref32| <= floor``. ``outputs`` overrides the numbers per
    output (:class:`OutputTolerance`), for an output whose honest error is of another kind
    than the rest (e.g. a long fp32 reduction).
    """

    rule: Literal["coda", "abs"] = "coda"
    # bounded: a finite but huge factor or floor (1e300) would pass every output
    factor: float = Field(default=2.0, gt=0, le=16)
    floor: float = Field(default=1e-6, ge=0, le=1e-2)
    ulps: float = Field(default=DEFAULT_ULPS, gt=0, le=MAX_ULPS)
    floor_ulps: float = Field(default=DEFAULT_FLOOR_ULPS, gt=0, le=MAX_ULPS)
    quantile_factor: float = Field(default=DEFAULT_QUANTILE_FACTOR, gt=0, le=16)
    outputs: dict[str, OutputTolerance] = Field(default_factory=dict)

    def for_output(self, name: str) -> "ToleranceSpec":
        """The rules for output ``name``: this spec's numbers with its override applied."""
        o = self.outputs.get(name)
        if o is None:
            return self
        upd = {k: v for k, v in o.model_dump().items() if v is not None}
        return self.model_copy(update={**upd, "outputs": {}})


class DimDraw(_Strict):
    """How the secret-shape draw picks one dim (``[coverage.dims.<D>]``).

    ``choices``: only these values. Else an integer in ``[low, high]`` (default: the
    smallest and largest value the spec's shape cases give the dim), log-uniform, a
    multiple of ``multiple_of``; the row dim M is drawn from 1 to twice the largest
    benchmark M unless bounded here. Every draw must also pass the spec's own checks at
    the drawn shape (TMA row alignment, positive dims), so a dim whose legal values are
    sparse needs ``choices`` or ``multiple_of``."""

    low: StrictInt | None = Field(default=None, ge=1)
    high: StrictInt | None = Field(default=None, ge=1)
    multiple_of: StrictInt = Field(default=1, ge=1)
    choices: list[StrictInt] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _range(self) -> "DimDraw":
        if self.choices is not None and (self.low is not None or self.high is not None):
            raise ValueError("give either choices or low/high, not both")
        if self.choices is not None and any(c <= 0 for c in self.choices):
            raise ValueError(f"choices must be positive, got {self.choices}")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low = {self.low} > high = {self.high}")
        return self


class CoverageSpec(_Strict):
    """What the verifier's secret draws may vary (``[coverage]``; ``verifier/gpu/coverage.py``).

    Every verification also runs the candidate at shapes drawn from a per-run secret and
    on inputs drawn in several ways (heavy tails, outlier rows/columns, saturating
    scales, near-zero rows; ``verifier/gpu/inputs.py``). This table states the limits of
    those draws for one spec:

    * ``fixed``: dims that keep the values the spec's shape cases use (e.g. a head dim
      the kernel is written for);
    * ``dims``: a range or choice list per dim (:class:`DimDraw`), e.g. an upper bound
      that keeps an input within a constraint (``S`` bounds the positions);
    * ``plain_inputs``: inputs always drawn exactly as declared (no rescaling);
    * ``nonfinite``: the op propagates NaN/Inf row-wise; the draws then include rows with
      NaN/Inf, and non-finite outputs must sit exactly where the reference's are;
    * ``constraints``: the input constraints in words, rendered into the prompt.
    """

    fixed: list[str] = Field(default_factory=list)
    dims: dict[str, DimDraw] = Field(default_factory=dict)
    plain_inputs: list[str] = Field(default_factory=list)
    nonfinite: bool = False
    constraints: list[str] = Field(default_factory=list)


class ShapeCase(_Strict):
    """One binding of the symbolic dims to integers; ``name`` labels benchmark rows."""

    name: str = ""
    dims: dict[str, StrictInt]

    @field_validator("dims")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: x for k, x in v.items() if x <= 0}
        if bad:
            raise ValueError(f"dims must be positive integers, got {bad}")
        return v


class ShapesSpec(_Strict):
    """Correctness shapes (small, at least one ragged: some dim not a multiple of 128)
    and benchmark shapes (Llama-3 sizes)."""

    correctness: list[ShapeCase] = Field(min_length=1)
    benchmark: list[ShapeCase] = Field(default_factory=list)
    seeds: list[StrictInt] = Field(default_factory=lambda: [0, 1], min_length=1)

    @model_validator(mode="after")
    def _ragged(self) -> "ShapesSpec":
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: must be distinct, got {self.seeds}")
        names = [c.name for c in self.benchmark]
        if any(not n for n in names) or len(set(names)) != len(names):
            raise ValueError(
                f"benchmark: every shape needs a distinct, non-empty name (result rows and checks "
                f"are keyed by it), got {names}"
            )
        if not any(any(x % 128 for x in c.dims.values()) for c in self.correctness):
            raise ValueError(
                "correctness shapes need at least one case whose dims are not all multiples of 128 (ragged tiles)"
            )
        return self


Baseline = Literal["torch_eager", "torch_compile", "bare_gemm", "quack_library", "liger", "quack_gemm"]


class BenchSpec(_Strict):
    """What the benchmark measures. ``flops`` is a dim expression (GEMM FLOPs: 2*M*N*K);
    bytes moved are computed from the inputs and outputs (each read/written once).
    ``bar`` maps a baseline to the largest acceptable time ratio fused/baseline
    (e.g. ``{bare_gemm = 1.03}``); it is reported, the prompt shows it."""

    flops: str | int | float
    baselines: list[Baseline] = Field(default_factory=lambda: ["torch_eager", "torch_compile", "bare_gemm"])
    bar: dict[Baseline, float] = Field(default_factory=dict)

    _v = field_validator("flops")(lambda cls, v: _check_expr(v))

    @model_validator(mode="after")
    def _bars_are_measured(self) -> "BenchSpec":
        unmeasured = sorted(set(self.bar) - set(self.baselines))
        if unmeasured:
            raise ValueError(
                f"bar: {unmeasured} not in baselines {list(self.baselines)} "
                "(a bar on a baseline that is not measured is never judged)"
            )
        return self

    @field_validator("bar")
    @classmethod
    def _positive_bar(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not 0 < x <= MAX_BAR}
        if bad:
            raise ValueError(f"bar ratios must be in (0, {MAX_BAR:g}] (fused/baseline time), got {bad}")
        return v


class KernelSpec(_Strict):
    """A fused op: math, entry point, reference, inputs, shapes, tolerance, baselines."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = Field(min_length=20)
    pattern: Literal["forward", "backward"]
    catalogue_item: int | None = None
    math: str = Field(min_length=10, description="the op's math, rendered into the prompt")
    entry: EntrySpec
    tolerance: ToleranceSpec = ToleranceSpec()
    coverage: CoverageSpec = CoverageSpec()
    shapes: ShapesSpec
    bench: BenchSpec
    hints: list[str] = Field(default_factory=list, description="extra notes for the prompt")
    timeout_s: float = Field(default=600.0, gt=0, description="wall-clock limit for the GPU stages")
    reference: ReferenceSpec = ReferenceSpec()

    @property
    def all_inputs(self) -> list[InputSpec]:
        """Every input in the order they are drawn: the reference-only inputs
        (``[reference]``), then the entry's. The reference functions receive all of them."""
        return [*self.reference.inputs, *self.entry.inputs]

    def input_field(self, t: TensorSpec) -> str:
        """Where input ``t`` is declared, for messages: ``entry.inputs`` or ``reference.inputs``."""
        return "reference.inputs" if any(r is t for r in self.reference.inputs) else "entry.inputs"

    @model_validator(mode="after")
    def _consistent(self) -> "KernelSpec":
        names = [t.name for t in self.entry.inputs] + [t.name for t in self.entry.outputs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"entry: duplicate tensor names {sorted(dup)}")
        ref_names = [t.name for t in self.reference.inputs]
        ref_dup = sorted({n for n in ref_names if n in names or ref_names.count(n) > 1})
        if ref_dup:
            raise ValueError(f"reference.inputs: names {ref_dup} are not distinct from every other tensor's")
        inputs = {t.name for t in self.all_inputs}
        for o in self.entry.outputs:
            g = o.gradient
            if g and (g.wrt not in inputs or g.upstream not in inputs):
                raise ValueError(
                    f"entry.outputs[{o.name}].gradient: wrt/upstream must name inputs "
                    f"{sorted(inputs)}, got wrt={g.wrt!r} upstream={g.upstream!r}"
                )
        seen: set[str] = set()
        outputs = {t.name for t in self.entry.outputs}
        keywords = self.entry.keyword_names
        bad = [
            c
            for c in keywords
            if not c.isidentifier() or keyword.iskeyword(c) or c == "dims" or c == self.entry.function
        ]
        clash = (set(keywords) & (inputs | outputs)) | set(bad)
        if clash or len(set(self.entry.constants)) != len(self.entry.constants):
            raise ValueError(
                f"entry.constants: must be distinct Python identifiers (not keywords, 'dims', "
                f"the entry's name or a tensor name), got "
                f"{self.entry.constants} (clashing: {sorted(clash)})"
            )
        both = sorted(set(self.entry.constants) & set(self.entry.float_constants))
        if both:
            raise ValueError(f"entry.float_constants: {both} are also int constants (entry.constants)")
        if "dims" in inputs:
            raise ValueError(
                "entry.inputs: 'dims' is reserved (derived-input functions receive the shape binding under that name)"
            )
        for t in self.all_inputs:
            if t.init.dist == "derived" and not seen:
                raise ValueError(
                    f"{self.input_field(t)}[{t.name}].init: a derived input needs earlier "
                    "inputs to derive from (declare it after them)"
                )
            seen.add(t.name)
        check_fp8_outputs(self.entry.outputs)
        check_draws(self)
        users: dict[str, list[str]] = {}  # dim -> where it is used
        for kind, tensors in (
            ("reference.inputs", self.reference.inputs),
            ("entry.inputs", self.entry.inputs),
            ("entry.outputs", self.entry.outputs),
        ):
            for t in tensors:
                for d in sorted(set().union(*(expr_names(s) for s in t.shape))):
                    users.setdefault(d, []).append(f"{kind}[{t.name}].shape")
        for c in self.entry.constants:
            users.setdefault(c, []).append("entry.constants")
        for t in self.all_inputs:
            for f in ("std", "low", "high"):
                for d in sorted(expr_names(getattr(t.init, f))):
                    users.setdefault(d, []).append(f"{self.input_field(t)}[{t.name}].init.{f}")
        if self.entry.max_workspace is not None:
            for d in expr_names(self.entry.max_workspace):
                users.setdefault(d, []).append("entry.max_workspace")
        self._check_coverage(inputs, outputs, set(users) | expr_names(self.bench.flops))
        flops_dims = expr_names(self.bench.flops)
        for group, cases in (("correctness", self.shapes.correctness), ("benchmark", self.shapes.benchmark)):
            for i, c in enumerate(cases):
                need = dict(users)
                if group == "benchmark":
                    for d in flops_dims:
                        need.setdefault(d, []).append("bench.flops")
                missing = sorted(set(need) - set(c.dims))
                if missing:
                    where = "; ".join(f"{d} by {', '.join(need[d])}" for d in missing)
                    raise ValueError(f"shapes.{group}[{i}] ({c.name!r}): dims {missing} are not bound (used: {where})")
                at = f"shapes.{group}[{i}] ({c.name!r})"
                self._check_values(at, c.dims, bench=group == "benchmark")
                if group == "correctness" and RECHECK_ROW_DIM in c.dims:
                    # the post-timing recheck redraws M in [ceil(M/2), 2M] (gpu/runs.py: recheck_rows)
                    m = c.dims[RECHECK_ROW_DIM]
                    for redrawn in (-(-m // 2), 2 * m):
                        self._check_values(
                            f"{at} at the recheck's {RECHECK_ROW_DIM} = {redrawn}",
                            {**c.dims, RECHECK_ROW_DIM: redrawn},
                            bench=False,
                        )
        return self

    def _check_coverage(self, inputs: set[str], outputs: set[str], dims: set[str]) -> None:
        """``tolerance.outputs`` names outputs; ``coverage`` names dims and inputs the spec has."""
        bad = sorted(set(self.tolerance.outputs) - outputs)
        if bad:
            raise ValueError(f"tolerance.outputs: {bad} are not outputs (outputs: {sorted(outputs)})")
        cov = self.coverage
        for field, names in (("coverage.fixed", cov.fixed), ("coverage.dims", list(cov.dims))):
            unknown = sorted(set(names) - dims)
            if unknown:
                raise ValueError(f"{field}: {unknown} are not dims of this spec (dims: {sorted(dims)})")
        both = sorted(set(cov.fixed) & set(cov.dims))
        if both:
            raise ValueError(f"coverage: {both} are both fixed and given a draw in coverage.dims")
        unknown = sorted(set(cov.plain_inputs) - inputs)
        if unknown:
            raise ValueError(f"coverage.plain_inputs: {unknown} are not inputs (inputs: {sorted(inputs)})")

    def _check_values(self, where: str, dims: dict[str, int], *, bench: bool) -> None:
        """Evaluate, at one shape case, what the verifier will evaluate there: every tensor
        dim must be a positive integer (``"I/3"`` at I = 10, ``"I-1000"``); inputs must be
        drawn from a spread (normal ``std`` > 0, uniform ``low`` < ``high``, randint at
        least two values: constant or all-zero inputs make a zero reference that excuses a
        zeros kernel); the workspace budget a finite number of bytes in [0, twice the
        declared tensors + the floor]; the benchmark's FLOPs finite and > 0. Raises
        ``ValueError`` naming the field, so a bad expression fails at load, not mid-run."""

        def value(field: str, expr: str | int | float) -> float:
            try:
                v = eval_expr(expr, dims)
                if isinstance(v, complex) or not math.isfinite(v):
                    raise ValueError(f"is {v}")
            except (ValueError, TypeError, ArithmeticError) as e:
                raise ValueError(f"{where}: {field} = {expr!r}: {e}") from None
            return v

        shapes: list[tuple[str, TensorSpec, list[int]]] = []  # every dim evaluated once
        for kind, tensors in (
            ("reference.inputs", self.reference.inputs),
            ("entry.inputs", self.entry.inputs),
            ("entry.outputs", self.entry.outputs),
        ):
            for t in tensors:
                dims_t = []
                for j, s in enumerate(t.shape):
                    v = value(f"{kind}[{t.name}].shape[{j}]", s)
                    if v <= 0 or v != int(v):
                        raise ValueError(
                            f"{where}: {kind}[{t.name}].shape[{j}] = {s!r} is {v}; a dim must be a positive integer"
                        )
                    dims_t.append(int(v))
                shapes.append((kind, t, dims_t))
        entry = [(kind, t, d) for kind, t, d in shapes if kind != "reference.inputs"]
        tensor_bytes = sum(DTYPE_BYTES[t.dtype] * math.prod(d) for _, t, d in entry)
        for kind, t, d in entry:  # after every dim is known positive: the more basic error first
            row = DTYPE_BYTES[t.dtype] * d[-1] if d else 0
            if len(d) >= 2 and row % 16 and not t.partial:
                # TMA needs 16-byte row strides; the CPU compile cannot see it, the GPU
                # launch fails, and that would read as the candidate's fault
                raise ValueError(
                    f"{where}: {kind}[{t.name}]: rows of {row} bytes (last dim "
                    f"{t.shape[-1]!r} x {DTYPE_BYTES[t.dtype]}); a GEMM operand or output "
                    "row must be a multiple of 16 bytes (8 bf16 / 4 fp32 / 16 fp8 elements; "
                    "a tensor no TMA touches, such as per-block scales, says partial = true)"
                )
        check_scale_blocks(where, {t.name: d for _, t, d in entry}, self.entry.outputs)
        for t in self.all_inputs:
            init, f = t.init, f"{self.input_field(t)}[{t.name}].init"
            if init.dist == "normal" and not value(f"{f}.std", init.std) > 0:
                raise ValueError(
                    f"{where}: {f}.std = {init.std!r} must be > 0 (constant inputs make a constant reference)"
                )
            if init.dist in ("uniform", "randint"):
                lo, hi = value(f"{f}.low", init.low), value(f"{f}.high", init.high)
                if not (hi > lo if init.dist == "uniform" else int(hi) - int(lo) >= 2):  # inputs.py: int(), [low, high)
                    raise ValueError(
                        f"{where}: {f}: low = {init.low!r} and high = {init.high!r} draw "
                        + ("no range" if init.dist == "uniform" else "fewer than two integers")
                        + " (constant inputs make a constant reference)"
                    )
        if self.entry.max_workspace is not None:
            ws = value("entry.max_workspace", self.entry.max_workspace)
            cap = 2 * tensor_bytes + WORKSPACE_FLOOR
            if not 0 <= ws <= cap:
                raise ValueError(
                    f"{where}: entry.max_workspace = {self.entry.max_workspace!r} is {ws:.6g} bytes; "
                    f"expected 0 to {cap} (twice the declared tensors' bytes plus the "
                    f"{WORKSPACE_FLOOR >> 20} MiB floor)"
                )
        if bench and not value("bench.flops", self.bench.flops) > 0:
            raise ValueError(f"{where}: bench.flops = {self.bench.flops!r} must be positive")

    # -- helpers used by the agent and the verifier -------------------------------
    def dims_of(self, case: ShapeCase) -> dict[str, int]:
        """The dims of a shape case (validated to bind every symbol)."""
        return dict(case.dims)

    def shape_of(self, t: TensorSpec, dims: dict[str, int]) -> tuple[int, ...]:
        """Concrete shape of tensor ``t`` under ``dims``."""
        return tuple(int(eval_expr(s, dims)) for s in t.shape)

    def workspace_budget(self, dims: dict[str, int]) -> tuple[int, str]:
        """``(bytes, rule)``: the device memory one call of the entry may hold at its peak
        beyond its inputs and the outputs it returns (measured by the candidate worker with
        the caching allocator's requested-bytes peak, ``verifier/gpu/device_memory.py``).

        ``entry.max_workspace`` when the spec sets it; else half the largest declared tensor
        (input or output) at ``dims``, at least :data:`WORKSPACE_FLOOR`. Why: a fused op's
        scratch is per-tile partials, O(M * N / tile_n) (the LSE partials of
        gemm_cross_entropy are 0.7 % of its logits at the Llama-3 vocab), while an op run
        unfused materializes a GEMM-sized (M, N) intermediate (keeping gemm_cross_entropy's
        fp32 logits and finishing in torch fits the launch budget:
        tests/verifier/corpus/materialized_logits.py),
        which at the benchmark shapes is larger than every operand the op declares. The
        floor covers the library's fixed scratch at the small correctness shapes."""
        if self.entry.max_workspace is not None:
            return int(eval_expr(self.entry.max_workspace, dims)), f"entry.max_workspace = {self.entry.max_workspace}"
        sizes = {
            t.name: DTYPE_BYTES[t.dtype] * math.prod(self.shape_of(t, dims))
            for t in (*self.entry.inputs, *self.entry.outputs)
        }
        big = max(sizes, key=sizes.__getitem__)
        budget = max(WORKSPACE_FLOOR, sizes[big] // 2)
        return (
            budget,
            f"half the largest declared tensor ({big}, {sizes[big]} bytes), at least {WORKSPACE_FLOOR >> 20} MiB",
        )

    def constants_of(self, dims: dict[str, int]) -> dict[str, int | float]:
        """The entry's keyword-only arguments under ``dims``: the int constants (dims), then
        the float constants with their declared values (``{}`` for most specs). Every call
        of the entry and of a ``reference.py`` function receives them."""
        return {**{c: int(dims[c]) for c in self.entry.constants}, **self.entry.float_constants}

    @property
    def low_precision(self) -> str:
        """The lowest floating precision among the inputs (the dtype ``ref_lowp`` is computed
        in; its ulp is the element rule's floor): bfloat16, float16 or float32."""
        floats = [t.dtype for t in self.all_inputs if t.dtype in ("bfloat16", "float16", "float32")]
        for d in ("bfloat16", "float16"):
            if d in floats:
                return d
        return "float32"

    @property
    def fp8_outputs(self) -> list[OutputSpec]:
        """The value outputs stored in an fp8 dtype (judged by their dequantized values)."""
        return [o for o in self.entry.outputs if o.dtype in FP8_DTYPES]

    @property
    def gradient_outputs(self) -> list[OutputSpec]:
        return [o for o in self.entry.outputs if o.gradient is not None]

    @property
    def value_outputs(self) -> list[OutputSpec]:
        return [o for o in self.entry.outputs if o.gradient is None]

    def signature(self) -> str:
        """The entry point as a Python signature with shapes in comments."""
        args = ", ".join(t.name for t in self.entry.inputs)
        if self.entry.keyword_names:
            args += ", *, " + ", ".join(
                [f"{c}: int" for c in self.entry.constants] + [f"{c}: float" for c in self.entry.float_constants]
            )
        outs = ", ".join(t.name for t in self.entry.outputs)
        return f"def {self.entry.function}({args}) -> ({outs})"

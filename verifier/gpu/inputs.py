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
so that outputs are O(1) -- threat 8 of docs/threat-model.md (degenerate references).
A ``derived`` input (what a forward saved for its backward: ``rstd``, ``lse``) is computed
from the inputs drawn before it by the spec's trusted ``reference.<fn>`` on the same
device, so both workers get the same values and the values are consistent.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from types import ModuleType
from typing import Any, cast

import torch

from ..spec import DTYPE_BYTES, FP8_DTYPES, KernelSpec, LoadedSpec, eval_expr
from ..spec import RECHECK_ROW_DIM as ROW_DIM

DRAWS = ("spec", "heavy", "outliers", "saturate", "tiny_rows", "nonfinite")
"""How a trial's inputs are drawn (``Run.draw``). ``spec``: as the spec declares. The others
start from that draw and change the floating inputs that are neither derived nor in
``coverage.plain_inputs``, to the values a training run produces and N(0, sigma) never does:

* ``heavy``: normal inputs from a Student-t with 3 degrees of freedom, rescaled to the
  declared std (heavy tails: a few values at 10-30 sigma);
* ``outliers``: about 1 % of the rows and 1 % of the columns of each 2-D input (1 % of the
  elements of a 1-D one) scaled by :data:`OUTLIER_SCALE` (|x| up to ~100 for a unit input);
* ``saturate``: normal inputs whose std is a plain number (activations, not weights scaled
  by a dim) rescaled to std :data:`SATURATE_STD`, so activations saturate (gates near
  +-90, logits in the hundreds);
* ``tiny_rows``: about 2 % of the rows of every 2-D input whose first dim is the row dim M
  scaled by 1e-3, and one of them set to 0 (near-zero-variance rows for a normalization);
* ``nonfinite``: one element of about 1 % of the rows of each such input set to NaN, +Inf
  or -Inf (only for a spec with ``coverage.nonfinite``).

The rows are the same in every input of one trial (one generator per trial and draw).
Derived inputs are computed from the changed inputs, so they stay consistent. An input
whose spec lists ``draws`` is changed only by those (``[]``: never)."""

SATURATE_STD = 40.0
"""The std ``saturate`` gives activation inputs (|x| near 90 at about 2 sigma)."""
OUTLIER_SCALE = 32.0
"""The factor ``outliers`` scales the chosen rows and columns by."""
TINY_ROW_SCALE = 1e-3
"""The factor ``tiny_rows`` scales the chosen rows by (mean square ~1e-6, the specs' eps)."""


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
    draw: str = "spec",
) -> dict[str, torch.Tensor]:
    """Draw every entry input of ``spec`` at ``dims`` for trial ``seed``.

    Returns ``{name: tensor}`` for every input in the spec's draw order (the reference-only
    inputs, then the entry's: :func:`entry_inputs` keeps the entry's), each of the declared
    shape and dtype on ``device``. ``normal``: ``mean + std * N(0,1)``; ``uniform``:
    ``U(low, high)``; ``randint``: integers in ``[low, high)``; ``derived``:
    ``reference.<fn>(**earlier)`` (plus ``dims=`` when the function takes a ``dims``
    parameter, e.g. to build a RoPE frequency table of length HD/2, and each keyword
    constant of the entry that it names as a parameter, e.g. ``eps``).
    Floats are drawn in fp32 then cast; fp8 dtypes after clamping to their finite range.
    Raises ``ValueError`` when a scale expression names an unknown dim, when a derived
    input is requested without a :class:`LoadedSpec` (its reference module), or when the
    derived tensor has the wrong shape. ``reference``: the spec's already imported
    reference module (the workers hold one); without it a derived input imports
    ``reference.py`` afresh for this call. ``draw``: one of :data:`DRAWS` (``ValueError``
    for another, and for ``nonfinite`` on a spec without ``coverage.nonfinite``).
    """
    s = _spec(spec)
    if draw not in DRAWS:
        raise ValueError(f"unknown input draw {draw!r} (known: {', '.join(DRAWS)})")
    if draw == "nonfinite" and not s.coverage.nonfinite:
        raise ValueError(f"spec {s.name} does not declare coverage.nonfinite: no NaN/Inf inputs are drawn for it")
    dev = torch.device(device)
    out: dict[str, torch.Tensor] = {}
    ref = reference
    rows = _row_choice(s, dims, seed, draw)
    consts = s.constants_of(dims)
    for t in s.all_inputs:
        shape = s.shape_of(t, dims)
        dtype = getattr(torch, t.dtype)
        if t.init.dist == "derived":
            if not isinstance(spec, LoadedSpec):
                raise ValueError(
                    f"input {t.name!r} is derived (reference.{t.init.fn}): "
                    "make_inputs needs the LoadedSpec, not the bare KernelSpec"
                )
            ref = ref or spec.load_reference()
            assert t.init.fn is not None  # InitSpec: a dist='derived' input names its fn
            fn = getattr(ref, t.init.fn)
            params = inspect.signature(fn).parameters
            extra = {k: v for k, v in {"dims": dict(dims), **consts}.items() if k in params}
            with torch.no_grad():
                x = fn(**out, **extra)
            if tuple(x.shape) != tuple(shape):
                raise ValueError(
                    f"reference.{t.init.fn} returned shape {tuple(x.shape)} for "
                    f"input {t.name!r}, the spec declares {tuple(shape)}"
                )
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
        varied = t.draws is None or draw in t.draws
        if draw != "spec" and init.dist != "randint" and t.name not in s.coverage.plain_inputs and varied:
            x = _vary(s, t, x, draw, dims, gen, rows)
        if t.dtype in FP8_DTYPES:
            fmax = torch.finfo(dtype).max  # e4m3fn has no inf: a cast beyond its range is NaN
            x = torch.where(torch.isfinite(x), x.clamp(-fmax, fmax), x)
        out[t.name] = x.to(dtype).contiguous()
    return out


def entry_inputs(spec: KernelSpec | LoadedSpec, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entry's inputs of :func:`make_inputs`'s result, in the entry's order (the
    reference-only inputs left out: the candidate never receives them)."""
    return {t.name: inputs[t.name] for t in _spec(spec).entry.inputs}


def _row_choice(s: KernelSpec, dims: dict[str, int], seed: int, draw: str) -> torch.Tensor | None:
    """The rows (CPU int64, sorted) that ``tiny_rows``/``nonfinite`` change in every input of
    one trial; None for the other draws. Drawn on the CPU so both workers agree."""
    if draw not in ("tiny_rows", "nonfinite"):
        return None
    m = int(dims.get(ROW_DIM, 0))
    if m <= 0:
        return torch.zeros(0, dtype=torch.int64)
    k = max(1, m // (50 if draw == "tiny_rows" else 100))
    g = torch.Generator().manual_seed(tensor_seed(seed, f"rows:{draw}"))
    return torch.randperm(m, generator=g)[:k].sort().values


def _vary(
    s: KernelSpec,
    t: Any,
    x: torch.Tensor,
    draw: str,
    dims: dict[str, int],
    gen: torch.Generator,
    rows: torch.Tensor | None,
) -> torch.Tensor:
    """Input ``t``'s spec draw ``x`` (fp32) changed as ``draw`` says (:data:`DRAWS`)."""
    init = t.init
    if draw == "heavy":
        if init.dist != "normal":
            return x
        std = float(eval_expr(init.std, dims))
        z = torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32)
        # a sum of tensors is a tensor (never sum()'s start value 0)
        chi2 = cast(
            torch.Tensor,
            sum(torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32) ** 2 for _ in range(3)),
        )
        # Student-t(3) has variance 3: divide by sqrt(3) for the declared std
        return z / torch.sqrt(chi2 / 3).clamp_min(1e-12) / 3**0.5 * std + float(init.mean)
    if draw == "saturate":
        if init.dist != "normal" or not isinstance(init.std, (int, float)):
            return x
        return (x - float(init.mean)) * (SATURATE_STD / float(init.std)) + float(init.mean)
    if draw == "outliers":
        mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
        for d in range(min(x.dim(), 2)):
            n = x.shape[d]
            pick = torch.randperm(n, generator=gen, device=x.device)[: max(1, n // 100)]
            if d == 0:
                mask[pick] = True
            else:
                mask[:, pick] = True
        return torch.where(mask, x * OUTLIER_SCALE, x)
    # tiny_rows / nonfinite: only 2-D inputs whose rows are the row dim
    if rows is None or x.dim() != 2 or str(t.shape[0]) != ROW_DIM or rows.numel() == 0:
        return x
    r = rows.to(x.device)
    x = x.clone()
    if draw == "tiny_rows":
        x[r] *= TINY_ROW_SCALE
        x[r[0]] = 0.0
        return x
    cols = torch.randint(0, x.shape[1], (r.numel(),), generator=gen, device=x.device)
    kinds = torch.tensor([math.nan, math.inf, -math.inf], device=x.device)
    x[r, cols] = kinds[torch.arange(r.numel(), device=x.device) % 3]
    return x


def tensor_bytes(spec: KernelSpec | LoadedSpec, dims: dict[str, int], which: str = "all") -> int:
    """Bytes of the entry's tensors at ``dims``: ``which`` = "inputs", "outputs" or "all" (which
    also counts the reference-only inputs: every tensor a trial holds)."""
    s = _spec(spec)
    tensors: list[Any] = []
    if which == "all":
        tensors += s.reference.inputs
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

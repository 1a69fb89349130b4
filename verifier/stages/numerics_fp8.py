"""The fp8 rule: an fp8 output judged by its dequantized values (CPU, pure).

An fp8 output (``float8_e4m3fn``, ``float8_e5m2``) stores ``q = y / scale`` rounded to the
fp8 grid, ``scale`` being another output the spec names (per block: 1x128 row blocks,
per head, per tensor). Its real value is ``q * scale``. The CODA rules do not fit: the
low-precision reference's error (bf16 rounding, 1/32 of an e4m3 step) says nothing about
a format 32 times coarser, and "a few ulps" of fp8 is a different number. What an honest
kernel can do is exact: compute ``y`` in fp32, divide by its scale, round to nearest even
(saturating), so the rule is exactness with one excuse:

* **fp8 rounding**: with ``x = y32 / s`` (``y32`` the fp32 reference's real value, ``s``
  the kernel's own scale of the element's block, both as stored), the kernel's code must
  be ``RNE(x)``, the fp8 value nearest to ``x`` (ties to even, beyond the largest finite
  value saturated to it). A code that is not may stand only where ``x`` is within
  ``delta`` of values that round to it, i.e. of the rounding midpoint to the next code:

      delta = BAND_FACTOR * band / |s| + BAND_ULPS * ulp_fp32(x)
      band  = max over the element's block of |y32 - y64|

  ``y64`` being the reference on float64-upcast inputs (the reference worker's
  ``fp8_band``): ``band`` is the fp32 reference's own rounding error on these very
  inputs, per block (a block shares its row, its K and its magnitudes). The kernel's
  fp32 value is another evaluation of the same sums, so the two can sit on either side
  of a midpoint only within a multiple of that error: BAND_FACTOR covers an accumulation
  that truncates instead of rounding (a tensor core's; emulated in
  ``tests/verifier/test_numerics_fp8.py``, it reaches ~76 x ``band`` at K = 4096, ~sqrt(K)
  times a rounding one's), ``BAND_ULPS`` fp32 ulps of ``x`` cover ``y * (1 / s)`` for
  ``y / s``. On gemm_fp8_quant at K = 4096 ``delta`` is ~0.035 in fp8 units (median):
  0.1 % of a step in e4m3's top binade, 1.7 % in [16, 32), 28 % in [1, 2), so where
  ``x`` is of its block's magnitude the rule is: the nearest code, or its one neighbour
  across a midpoint ``x`` sits near. Only for values so far below their
  block's scale that the GEMM's own fp32 error spans a step (e5m2's subnormals) may a
  code be more than one step from ``RNE(x)``, exactly as far as ``delta`` reaches. A
  wrong rounding (truncation, a missing saturation, another format's grid, a scale
  applied twice) is an error of a whole step at most of the elements.
* **non-finite**: the code is NaN exactly where ``x`` is (saturation never makes an Inf).

The scale is judged as the float32 output it is, by the CODA rules (a scale off by a
power of two, or taken over the wrong group, fails there); judging the codes with the
kernel's own scale keeps that one error from being reported twice. Using the kernel's
scale is also what "dequantized" means: ``q * s`` must be the fp8 grid point, scaled by
``s``, nearest to ``y32``.

Calibration (honest quantizers pass with margin, the wrong ones fail):
``benchmarks/results/numerics-calibration.md``; the CPU tests:
``tests/verifier/test_numerics_fp8.py`` and the fp8 files of
``tests/verifier/corpus_numerics/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .numerics import _index, ulp


@dataclass(frozen=True)
class Fp8Format:
    """An fp8 format's grid: mantissa bits, the exponent of its smallest normal, its largest
    finite value."""

    mantissa: int
    min_exp: int
    max: float


FORMATS = {
    "float8_e4m3fn": Fp8Format(mantissa=3, min_exp=-6, max=448.0),
    "float8_e5m2": Fp8Format(mantissa=2, min_exp=-14, max=57344.0),
}
"""The OCP FP8 formats a spec may store (e4m3fn: no infinities; e5m2: IEEE-like)."""
BAND_FACTOR = 512.0
"""How many times the fp32 reference's own block error (``band``) the kernel's value may be
from it at a rounding midpoint (the module doc; calibrated in
``benchmarks/results/numerics-calibration.md``)."""
BAND_ULPS = 4.0
"""fp32 ulps of ``x`` always inside the band (reciprocal multiply, the scale's rounding)."""
RULE_ORDER = ("nonfinite", "fp8_rounding")
"""The fp8 rules in the order failures are reported."""


def fp8_spacing(a: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """The grid spacing of ``fmt`` at the magnitudes ``a`` (fp64, >= 0, finite): ``2**(e -
    mantissa)`` for the binade ``e`` of ``a``, the subnormal spacing below the smallest
    normal."""
    _, e = torch.frexp(a)
    e = torch.where(a > 0, e - 1, torch.full_like(e, fmt.min_exp)).clamp_min(fmt.min_exp)
    return torch.ldexp(torch.ones_like(a), e - fmt.mantissa)


def round_fp8(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """``x`` rounded to the fp8 grid of ``dtype``, in fp64: round to nearest, ties to even,
    magnitudes beyond the largest finite value (Inf included) saturated to it, NaN kept.
    Computed exactly in fp64 (dividing by a power of two is exact), independent of
    torch's own float8 cast."""
    fmt = FORMATS[dtype]
    x = x.to(torch.float64)
    a = x.abs().clamp(max=2 * fmt.max)  # beyond the range: saturates below; Inf made finite
    step = fp8_spacing(a, fmt)
    q = (torch.round(a / step) * step).clamp(max=fmt.max)  # torch.round: ties to even
    return torch.where(torch.isnan(x), x, torch.copysign(q, x))


def _distance_to_code(x: torch.Tensor, c: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """How far ``x`` (fp64, finite) is from the values that round (nearest, saturating) to the
    fp8 code ``c`` (fp64, on the grid): 0 where ``c`` is ``RNE(x)``, else the distance from
    ``x`` to ``c``'s rounding interval, which reaches half a step to each neighbour (the
    step below a power of two is half the step above it; the largest finite value takes
    everything beyond it)."""
    a = c.abs()
    up = fp8_spacing(a, fmt)
    m, _ = torch.frexp(a)
    below_binade = (m == 0.5) & (a > math.ldexp(1.0, fmt.min_exp))  # a power of two above the subnormals
    down = torch.where(below_binade, up / 2, up)
    top = torch.where(a >= fmt.max, torch.full_like(a, math.inf), a + up / 2)
    bottom = torch.where(a > 0, a - down / 2, -up / 2)  # zero: half a subnormal step to each side
    lo = torch.where(c >= 0, bottom, -top)
    hi = torch.where(c >= 0, top, -bottom)
    return torch.maximum(torch.maximum(lo - x, x - hi), torch.zeros_like(x))


def fp8_check(
    out: torch.Tensor,
    scale: torch.Tensor,
    ref32: torch.Tensor,
    band: torch.Tensor,
    dtype: str,
) -> dict[str, Any]:
    """Judge an fp8 output by the rules of the module doc.

    ``out``: the kernel's fp8 output (its dtype, or any float tensor holding its values);
    ``scale``: the kernel's scale of each element's block, ``ref32``: the fp32 reference's
    real value (``y``, before scaling and rounding), ``band``: ``max |y32 - y64|`` over each
    element's block -- all of ``out``'s shape (a full output with its scales expanded, or
    paired samples). ``dtype``: the output's fp8 dtype name. Returns the keys of
    :func:`~coda_agent.verifier.stages.numerics.tolerance_check` in the dequantized
    domain (``got``/``expected`` are ``q * s`` and ``RNE(y32 / s) * s``), ``rules``
    (``nonfinite``, ``fp8_rounding``: ``ok``, ``ratio``, the counts and the worst element;
    an element's ratio is how far ``x`` is from the values that round to its code, over
    ``delta``: 0 for the nearest code, at most 1 for a flip the band excuses)
    and ``failed``. Raises ``ValueError`` on a shape mismatch or an unknown dtype."""
    if dtype not in FORMATS:
        raise ValueError(f"not an fp8 dtype: {dtype!r} (known: {', '.join(FORMATS)})")
    shape = out.shape
    if scale.shape != shape or ref32.shape != shape or band.shape != shape:
        raise ValueError(
            f"shape mismatch: out {tuple(shape)}, scale {tuple(scale.shape)}, ref32 {tuple(ref32.shape)}, "
            f"band {tuple(band.shape)}"
        )
    c = out.detach().cpu().to(torch.float32).to(torch.float64).reshape(-1)
    s = scale.detach().cpu().to(torch.float64).reshape(-1)
    y = ref32.detach().cpu().to(torch.float64).reshape(-1)
    b = band.detach().cpu().to(torch.float64).reshape(-1)
    x = y / s
    want = round_fp8(x, dtype)
    nan_x, nan_c = torch.isnan(x), torch.isnan(c)
    missing, extra = int((nan_x & ~nan_c).sum()), int((~nan_x & nan_c).sum())
    judged = ~nan_x & ~nan_c
    xf = torch.where(judged, x, 0.0)
    delta = BAND_FACTOR * torch.nan_to_num(b / s.abs(), nan=0.0, posinf=0.0) + BAND_ULPS * ulp(
        torch.nan_to_num(xf, posinf=0.0, neginf=0.0), "float32"
    )
    cj = torch.where(judged, c, 0.0)
    need = _distance_to_code(xf, cj, FORMATS[dtype])
    ratios = torch.where(judged, torch.where(need > 0, need / delta, 0.0), 0.0)
    bad = ratios > 1
    want_f = torch.where(judged, want, 0.0)
    step = fp8_spacing(want_f.abs(), FORMATS[dtype])
    flips = int((judged & (cj != want_f)).sum())
    n_bad = int(bad.sum())
    k = int(ratios.argmax()) if ratios.numel() else 0
    deq = lambda t: float(t[k] * s[k]) if ratios.numel() else 0.0  # noqa: E731
    worst = (
        {
            "index": _index(k, shape),
            "code": float(c[k]),
            "expected_code": float(want[k]),
            "x": float(x[k]),
            "delta": float(delta[k]),
            "steps": float((c[k] - want[k]).abs() / step[k]) if bool(judged[k]) else math.nan,
            "scale": float(s[k]),
        }
        if ratios.numel()
        else None
    )
    rounding = {
        "ok": n_bad == 0,
        "ratio": float(ratios[k]) if ratios.numel() else 0.0,
        "over": n_bad,
        "judged": int(judged.sum()),
        "flips": flips,
        "band_factor": BAND_FACTOR,
        "band_ulps": BAND_ULPS,
        "worst": worst,
    }
    nonfinite: dict[str, Any] = {
        "ok": not (missing or extra),
        "ratio": math.inf if (missing or extra) else 0.0,
        "finite_where_ref_not": missing,
        "nonfinite_where_ref_finite": extra,
        "ref_nonfinite": int(nan_x.sum()),
    }
    if missing or extra:
        nonfinite["first_index"] = _index(int((nan_x ^ nan_c).nonzero()[0]), shape)
    rules = {"nonfinite": nonfinite, "fp8_rounding": rounding}
    failed = [r for r in RULE_ORDER if not rules[r]["ok"]]
    err = torch.where(judged, (cj - want_f).abs() * s.abs(), 0.0)
    j = int(err.argmax()) if err.numel() else 0
    return {
        "rule": "fp8",
        "max_err": float(err[j]) if err.numel() else 0.0,
        "lowp_err": None,
        "allowed": 0.0,
        "ok": not failed,
        "ratio": rounding["ratio"] if nonfinite["ok"] else math.inf,
        "worst_index": _index(k, shape) if ratios.numel() else [],
        "got": deq(c),
        "expected": deq(want),
        "ref_absmax": float(torch.nan_to_num(y.abs(), nan=0.0, posinf=0.0).max()) if y.numel() else 0.0,
        "nonfinite": int(nan_c.sum()),
        "lowp_nonfinite": 0,
        "rules": rules,
        "failed": failed,
    }


def dequantized(out: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``out * scale`` in fp64 (``scale`` of ``out``'s shape): the real values of an fp8 output,
    for the error diagnosis."""
    return out.detach().cpu().to(torch.float32).to(torch.float64) * scale.detach().cpu().to(torch.float64)


def rule_message(res: dict[str, Any]) -> str:
    """What the first failing fp8 rule of ``res`` (:func:`fp8_check`) says: the rule, where,
    by how much, and the fix."""
    rule = res["failed"][0]
    r = res["rules"][rule]
    if rule == "nonfinite":
        return (
            f"rule non-finite: {r['finite_where_ref_not']} code(s) finite where y / scale is NaN and "
            f"{r['nonfinite_where_ref_finite']} NaN where it is finite (first at {r.get('first_index')}); "
            "store NaN only where the value is NaN, and saturate out-of-range values to the largest finite code"
        )
    w = r["worst"]
    return (
        f"rule fp8-rounding: {r['over']} of {r['judged']} codes are not y32 / scale rounded to nearest even "
        f"(one step allowed only within {BAND_FACTOR:g} x the fp32 reference's own error of a rounding "
        f"midpoint); worst at {w['index']}: code {w['code']:.6g}, expected {w['expected_code']:.6g} "
        f"({w['steps']:.3g} steps) for y32 / scale = {w['x']:.9g} (scale {w['scale']:.6g}, band "
        f"{w['delta']:.3g}). Divide the fp32 accumulator by the block's own stored scale and convert once "
        "with round-to-nearest-even and saturation (cvt.rn.satfinite)"
    )


def check_fp8_output(
    name: str,
    out: torch.Tensor,
    scale: torch.Tensor,
    ref32: torch.Tensor,
    band: torch.Tensor,
    dtype: str,
    label: str,
) -> tuple[tuple[str, str] | None, dict[str, Any]]:
    """One fp8 output of one trial, as ``correctness.check_output`` judges the others:
    ``((kind, message) or None, metrics)``, the kind being the first failing check of
    ``stale-memory`` (the allocator poison), ``nan-output``/``zero-output``/
    ``constant-output`` (of the dequantized values) and ``tolerance`` (an fp8 rule).
    ``scale`` and ``band`` are already of ``out``'s shape (see :func:`fp8_check`)."""
    from ..gpu.poison import poison_count
    from .numerics import describe_error, output_sanity

    res = fp8_check(out, scale, ref32, band, dtype)
    metrics = {k: res[k] for k in ("max_err", "allowed", "ratio", "ok", "lowp_err", "worst_index")}
    metrics["rules"] = {k: v["ratio"] for k, v in res["rules"].items()}
    metrics["flips"] = res["rules"]["fp8_rounding"]["flips"]
    n_poison = poison_count(out)
    metrics["poisoned"] = n_poison
    deq = dequantized(out, scale)
    if n_poison:
        return (
            "stale-memory",
            f"{name} [{label}]: {n_poison} of {out.numel()} elements still hold the NaN poison the verifier "
            f"filled free GPU memory with: the kernel never wrote them; {describe_error(deq, ref32)}",
        ), metrics
    bad = output_sanity(deq, ref32)
    if bad:
        return (bad[0], f"{name} [{label}]: {bad[1]}"), metrics
    if not res["ok"]:
        return ("tolerance", f"{name} [{label}]: {rule_message(res)}"), metrics
    return None, metrics

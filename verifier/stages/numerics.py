"""Numerical comparison of a candidate's outputs with the trusted references (CPU, pure).

Why this criterion: a fixed absolute or relative tolerance is either too loose (a
kernel that downgrades precision or skips work passes) or too tight (correct bf16
kernels fail). CODA derives the tolerance from the data: the low-precision PyTorch
reference ``ref_lowp`` shows how much error honest low-precision arithmetic makes on
*these* inputs, and the kernel may make at most ``factor`` times that, measured against
the fp32-upcast reference ``ref32``::

    max|out - ref32| <= factor * max|ref_lowp - ref32| + floor

Everything is computed in fp64 on the CPU. A failing output also gets a diagnosis
(:func:`describe_error`) saying *where* and *how* it is wrong, because "max error 3.1"
does not help a model repair its kernel but "only the ragged edge (rows >= 512) wrong"
does. :func:`output_sanity` rejects outputs that are trivially fake (all zeros,
constant, non-finite); memory the kernel never wrote is recognised by its poison
(``verifier/gpu/poison.py``).

The rules (:func:`judge`), each applied to every output and gradient, each with the reason
it exists; all must hold (``ToleranceSpec`` holds the numbers, per output if a spec needs):

* **max-abs** (CODA): ``max|out - ref32| <= factor * max|ref_lowp - ref32| + floor``. The
  paper's criterion; it is set by the largest elements, so alone it lets small and medium
  elements be wrong (``tests/verifier/corpus_numerics/``: zeroing every |v| < 0.04,
  flipping the sign of small gradients, snapping to a 0.08 grid all pass it).
* **per element**: ``|out_i - ref32_i| <= ulps * ulp_out(|ref32_i|) + factor * |ref_lowp_i
  - ref32_i| + floor_ulps * ulp_low(scale(row_i)) + floor``. ``ulp_out`` is the spacing of
  the output's dtype, so every element is judged at its own magnitude: a few ulps, the
  rounding any kernel makes. Where PyTorch's own low-precision result is off by more at
  that element (cancellation), the kernel may be too. ``ulp_low(scale(row))`` is the
  spacing of the spec's low precision (bf16) at the element's row scale
  (:func:`row_scale`: the row's rms, outliers clipped): values far below their row's scale
  are judged against the rounding of that scale, not their own (a 0 where the reference
  has -3e-37 is no error), and an fp32 output computed from bf16 data is not held to
  fp32 ulps. Rows, not the tensor, because tokens have scales of their own (outlier rows,
  near-zero rows).
* **error quantiles**: the 50th, 90th and 99th percentiles of ``|out - ref32|`` at most
  ``quantile_factor`` times those of ``|ref_lowp - ref32|`` plus ``ulp_low(scale(tensor))
  + floor``: a systematic degradation (a coarser grid, dropped mantissa bits, a cheaper
  approximation everywhere) moves the bulk of the error distribution even where each
  element stays inside its bound.
* **sign**: where ``|ref32_i|`` is above twice ``factor * |ref_lowp_i - ref32_i| +
  floor_ulps * ulp_low(scale(row_i)) + floor`` (well above rounding), ``out_i * ref32_i >
  0``: a zero or a flipped sign there is never rounding. (The per-element rule implies
  it; it is its own rule so that the finding says what happened.)
* **non-finite**: ``out`` is NaN/Inf exactly where ``ref32`` is (any kind); statistics are
  taken over the finite elements. A NaN or Inf where the reference is finite is an error
  of the element rule with an infinite ratio.

The calibration behind the numbers (every accepted kernel, quack's library kernels and
torch's own bf16 code pass with margin; the wrong-kernel corpus fails) is in
``benchmarks/results/numerics-calibration.md``.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def _abs_err(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| in fp64; equal values (incl. matching infs) give 0, NaN/inf mismatches give inf."""
    diff = (out - ref).abs()
    diff = torch.where(out == ref, torch.zeros_like(diff), diff)
    return torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)


def _index(flat_idx: int, shape: torch.Size) -> list[int]:
    idx = []
    for d in reversed(shape):
        idx.append(flat_idx % d)
        flat_idx //= d
    return list(reversed(idx))


def coda_check(
    out: torch.Tensor,
    ref32: torch.Tensor,
    ref_lowp: torch.Tensor,
    factor: float = 2.0,
    floor: float = 1e-6,
) -> dict[str, Any]:
    """The CODA criterion for one output.

    ``out`` (the candidate's, any float dtype), ``ref32`` (fp32 reference) and
    ``ref_lowp`` (low-precision reference) must have the same shape. Returns
    ``{"max_err", "lowp_err", "allowed", "ok", "ratio", "worst_index", "got", "expected",
    "ref_absmax", "nonfinite", "lowp_nonfinite"}`` where ``max_err = max|out-ref32|``,
    ``lowp_err = max|ref_lowp-ref32|`` over finite ``ref_lowp`` entries, ``allowed =
    factor*lowp_err + floor`` and ``ratio = max_err/allowed``. Raises ``ValueError`` on a
    shape mismatch.
    """
    if out.shape != ref32.shape or ref_lowp.shape != ref32.shape:
        raise ValueError(
            f"shape mismatch: out {tuple(out.shape)}, ref32 {tuple(ref32.shape)}, ref_lowp {tuple(ref_lowp.shape)}"
        )
    o, r, lo = _f64(out), _f64(ref32), _f64(ref_lowp)
    err = _abs_err(o, r)
    lowp_finite = torch.isfinite(lo)
    lerr = _abs_err(lo, r)
    lowp_err = float(lerr[lowp_finite].max()) if bool(lowp_finite.any()) else 0.0
    res = _summary(o, r, err)
    allowed = factor * lowp_err + floor
    res.update(
        rule="coda",
        lowp_err=lowp_err,
        allowed=allowed,
        ok=bool(res["max_err"] <= allowed),
        ratio=res["max_err"] / allowed if allowed > 0 else math.inf,
        lowp_nonfinite=int((~lowp_finite).sum()),
    )
    return res


def abs_check(out: torch.Tensor, ref32: torch.Tensor, floor: float) -> dict[str, Any]:
    """``rule="abs"``: ``max|out - ref32| <= floor``; same keys as :func:`coda_check`."""
    if out.shape != ref32.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)}, ref32 {tuple(ref32.shape)}")
    o, r = _f64(out), _f64(ref32)
    err = _abs_err(o, r)
    res = _summary(o, r, err)
    res.update(
        rule="abs",
        lowp_err=None,
        allowed=floor,
        ok=bool(res["max_err"] <= floor),
        ratio=res["max_err"] / floor if floor > 0 else (0.0 if res["max_err"] == 0 else math.inf),
        lowp_nonfinite=0,
    )
    return res


def tolerance_check(
    out: torch.Tensor,
    ref32: torch.Tensor,
    ref_lowp: torch.Tensor | None,
    tol: Any,
    dtype: str | None = None,
    lowp_dtype: str = "bfloat16",
) -> dict[str, Any]:
    """Every rule of a :class:`~coda_agent.verifier.spec.ToleranceSpec` for one output.

    ``rule="abs"`` (or no ``ref_lowp``): :func:`abs_check`. Else :func:`judge` with the
    output's spec ``dtype`` (default: ``out``'s own). Returns the keys of
    :func:`coda_check` where ``ok``/``ratio`` cover every rule, plus ``rules`` (per rule:
    ``ok``, ``ratio`` and its numbers) and ``failed`` (the failing rules' names, in the
    order of the module doc)."""
    if tol.rule == "abs" or ref_lowp is None:
        res = abs_check(out, ref32, tol.floor)
        res.update(rules={"abs": {"ok": res["ok"], "ratio": res["ratio"]}}, failed=[] if res["ok"] else ["abs"])
        return res
    return judge(out, ref32, ref_lowp, tol, dtype or _dtype_name(out.dtype), lowp_dtype)


# --------------------------------------------------------------------------- the rules

_MANTISSA = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 52, "float8_e4m3fn": 3, "float8_e5m2": 2}
_MIN_EXP = {
    "bfloat16": -126,
    "float16": -14,
    "float32": -126,
    "float64": -1022,
    "float8_e4m3fn": -6,
    "float8_e5m2": -14,
}
QUANTILES = (0.5, 0.9, 0.99)
"""The error percentiles the quantile rule compares."""
SIGN_MARGIN = 2.0
"""The sign rule judges elements whose |ref32| exceeds this many times their rounding floor."""


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return name if name in _MANTISSA else "float32"


def ulp(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """The spacing of ``dtype`` (bfloat16, float16, float32, float64, float8_e4m3fn,
    float8_e5m2) at ``|x|``, elementwise, in fp64: ``2**(floor(log2|x|) - mantissa bits)``,
    the subnormal spacing below the smallest normal (and at 0). ``x`` must be finite."""
    a = x.abs().to(torch.float64)
    _, e = torch.frexp(a)
    e = torch.where(a > 0, e - 1, torch.full_like(e, _MIN_EXP[dtype])).clamp_min(_MIN_EXP[dtype])
    return torch.ldexp(torch.ones_like(a), e - _MANTISSA[dtype])


def _quantiles(x: torch.Tensor, qs: tuple[float, ...] = QUANTILES) -> list[float]:
    """Lower ``q``-quantiles of a 1-D tensor (kthvalue: no size limit); zeros when empty."""
    n = x.numel()
    if n == 0:
        return [0.0 for _ in qs]
    return [float(x.kthvalue(min(n, max(1, math.ceil(q * n))))[0]) for q in qs]


def row_scale(r: torch.Tensor) -> torch.Tensor:
    """Per row of ``r`` (fp64; rows = the last dim, a 1-D tensor is one row) the root mean
    square of its finite values clipped at their 90th-percentile magnitude, shape (rows, 1)
    (0 for a row with no finite value): a scale that outlier elements (up to 10 % of a row)
    do not inflate. Rows are tokens with scales of their own (outlier rows, near-zero rows)."""
    r2 = r.reshape(-1, r.shape[-1]) if r.dim() >= 2 else r.reshape(1, -1)
    if r2.numel() == 0:
        return torch.zeros(r2.shape[0], 1, dtype=torch.float64)
    fin = torch.isfinite(r2)
    if bool(fin.all()):
        # Rationale: the common case without the sort. kthvalue picks the same element the
        # sort below indexes (the ceil(0.9 n)-th smallest), in linear time.
        a = r2.abs()
        k = int(torch.ceil(0.9 * torch.tensor([a.shape[1]])).long().clamp(1, a.shape[1])[0])
        q = a.kthvalue(k, dim=1, keepdim=True).values
        return (a.clamp(max=q).pow(2).sum(1, keepdim=True) / a.shape[1]).sqrt()
    a = torch.where(fin, r2.abs(), torch.full_like(r2, -1.0))  # non-finite sort first
    n = fin.sum(1, keepdim=True)
    srt = a.sort(dim=1).values
    idx = (a.shape[1] - n + torch.ceil(0.9 * n).long() - 1).clamp(0, a.shape[1] - 1)
    q = srt.gather(1, idx)
    clipped = torch.where(fin, a.clamp(max=q), torch.zeros_like(a))
    return (clipped.pow(2).sum(1, keepdim=True) / n.clamp_min(1)).sqrt()


def judge(
    out: torch.Tensor, ref32: torch.Tensor, ref_lowp: torch.Tensor, tol: Any, dtype: str, lowp_dtype: str = "bfloat16"
) -> dict[str, Any]:
    """Judge one output by every rule of the module doc.

    ``out`` (candidate, any float dtype), ``ref32``, ``ref_lowp``: same shape (ValueError
    otherwise), any device. ``tol``: a ToleranceSpec (``factor``, ``floor``, ``ulps``,
    ``floor_ulps``, ``quantile_factor``); ``dtype``: the output's declared dtype (its
    ulps judge each element); ``lowp_dtype``: the spec's low precision (its ulp at the
    row scale is the floor). Returns :func:`coda_check`'s keys (``ok`` and ``ratio`` over
    all rules) plus ``rules``: ``{"nonfinite", "max_abs", "elementwise", "quantiles",
    "sign"}`` each with ``ok`` and ``ratio`` (statistic / bound; > 1 fails) and the numbers
    behind it, and ``failed`` (failing rules in :data:`RULE_ORDER`)."""
    if out.shape != ref32.shape or ref_lowp.shape != ref32.shape:
        raise ValueError(
            f"shape mismatch: out {tuple(out.shape)}, ref32 {tuple(ref32.shape)}, ref_lowp {tuple(ref_lowp.shape)}"
        )
    shape = out.shape
    r2 = _f64(ref32).reshape(-1, shape[-1]) if len(shape) >= 2 else _f64(ref32).reshape(1, -1)
    o2, l2 = _f64(out).reshape(r2.shape), _f64(ref_lowp).reshape(r2.shape)
    fin = torch.isfinite(r2)
    all_fin = bool(fin.all())

    def on_finite(t: torch.Tensor) -> torch.Tensor:
        """``t`` where ref32 is finite, 0 elsewhere (no copy when ref32 is all finite)."""
        return t if all_fin else torch.where(fin, t, 0.0)

    o_fin = torch.isfinite(o2)
    # |out - ref32| where ref32 is finite (a NaN or inf there counts as an infinite error)
    e = on_finite(torch.nan_to_num((o2 - r2).abs(), nan=math.inf, posinf=math.inf))
    res = _summary(o2.reshape(shape), r2.reshape(shape), e.reshape(shape), o_fin=o_fin)
    # non-finite: out non-finite exactly where ref32 is
    missing = int((~fin & o_fin).sum())  # finite where the reference is not
    extra = int((fin & ~o_fin).sum())  # non-finite where the reference is finite
    nonfinite: dict[str, Any] = {
        "ok": not (missing or extra),
        "ratio": math.inf if (missing or extra) else 0.0,
        "finite_where_ref_not": missing,
        "nonfinite_where_ref_finite": extra,
        "ref_nonfinite": int((~fin).sum()),
    }
    if missing or extra:
        nonfinite["first_index"] = _index(int((fin ^ o_fin).reshape(-1).nonzero()[0]), shape)
    el = on_finite((l2 - r2).abs())
    lowp_ok = torch.isfinite(el)
    all_lowp_ok = bool(lowp_ok.all())
    if not all_lowp_ok:
        el = torch.where(lowp_ok, el, 0.0)
    ef = e.reshape(-1) if all_fin else e[fin]
    elf = el.reshape(-1) if all_fin and all_lowp_ok else el[fin & lowp_ok]
    # max-abs (CODA)
    lowp_err = float(elf.max()) if elf.numel() else 0.0
    max_err = float(ef.max()) if ef.numel() else 0.0
    allowed = tol.factor * lowp_err + tol.floor
    res.update(max_err=max_err, lowp_err=lowp_err, allowed=allowed, lowp_nonfinite=int((fin & ~lowp_ok).sum()))
    rules: dict[str, dict[str, Any]] = {
        "nonfinite": nonfinite,
        "max_abs": {
            "ok": max_err <= allowed,
            "ratio": _ratio(max_err, allowed),
            "max_err": max_err,
            "allowed": allowed,
        },
    }
    # per element
    u_row = ulp(row_scale(r2), lowp_dtype)
    base = tol.factor * el + tol.floor_ulps * u_row + tol.floor
    bound = tol.ulps * ulp(on_finite(r2), dtype) + base
    ratios = on_finite(e / bound)
    k = int(ratios.reshape(-1).argmax()) if ratios.numel() else 0
    n_over = int((ratios > 1).sum())
    flat = lambda t: float(t.reshape(-1)[k])  # noqa: E731
    rules["elementwise"] = {
        "ok": n_over == 0,
        "ratio": flat(ratios) if ratios.numel() else 0.0,
        "over": n_over,
        "judged": int(fin.sum()),
        "ulps": tol.ulps,
        "floor_ulps": tol.floor_ulps,
        "worst": {
            "index": _index(k, shape),
            "got": flat(o2),
            "expected": flat(r2),
            "err": flat(e),
            "bound": flat(bound),
        }
        if ratios.numel()
        else None,
    }
    # quantiles
    u_all = float(ulp(row_scale(r2.reshape(-1)), lowp_dtype).reshape(-1)[0]) if r2.numel() else 0.0
    qo, ql = _quantiles(ef), _quantiles(elf)
    qb = [tol.quantile_factor * q + u_all + tol.floor for q in ql]
    qr = [_ratio(a, b) for a, b in zip(qo, qb, strict=False)]
    rules["quantiles"] = {
        "ok": all(x <= 1 for x in qr),
        "ratio": max(qr),
        "q": list(QUANTILES),
        "out": qo,
        "lowp": ql,
        "bound": qb,
    }
    # sign
    judged = fin & (r2.abs() > SIGN_MARGIN * base)
    wrong = judged & ~(o2 * r2 > 0)
    n_wrong = int(wrong.sum())
    rules["sign"] = {
        "ok": n_wrong == 0,
        "ratio": math.inf if n_wrong else 0.0,
        "wrong": n_wrong,
        "judged": int(judged.sum()),
    }
    if n_wrong:
        j = int(wrong.reshape(-1).nonzero()[0])
        rules["sign"].update(
            first_index=_index(j, shape), got=float(o2.reshape(-1)[j]), expected=float(r2.reshape(-1)[j])
        )
    failed = [name for name in RULE_ORDER if not rules[name]["ok"]]
    finite = [rules[n]["ratio"] for n in ("max_abs", "elementwise", "quantiles")]
    res.update(
        rule="coda",
        rules=rules,
        failed=failed,
        ok=not failed,
        ratio=max(finite) if not (missing or extra or n_wrong) else math.inf,
    )
    return res


def _ratio(stat: float, bound: float) -> float:
    if bound > 0:
        return stat / bound
    return 0.0 if stat == 0 else math.inf


RULE_ORDER = ("nonfinite", "max_abs", "elementwise", "quantiles", "sign")
"""The order failing rules are reported in (the first is the finding's kind)."""


def _summary(o: torch.Tensor, r: torch.Tensor, err: torch.Tensor, o_fin: torch.Tensor | None = None) -> dict[str, Any]:
    if err.numel() == 0:
        return dict(max_err=0.0, worst_index=[], got=None, expected=None, ref_absmax=0.0, nonfinite=0)
    flat = int(err.reshape(-1).argmax())
    return dict(
        max_err=float(err.reshape(-1)[flat]),
        worst_index=_index(flat, err.shape),
        got=float(o.reshape(-1)[flat]),
        expected=float(r.reshape(-1)[flat]),
        ref_absmax=float(torch.nan_to_num(r.abs(), nan=0.0, posinf=0.0).max()),
        nonfinite=int((~(torch.isfinite(o) if o_fin is None else o_fin)).sum()),
    )


# --------------------------------------------------------------------------- sanity


def _first_rc(mask: torch.Tensor) -> tuple[int, int]:
    """(row, col) of the first True element, rows counted over all leading dims."""
    idx = _index(int(mask.reshape(-1).nonzero()[0]), mask.shape)
    if len(idx) == 0:
        return 0, 0
    if len(idx) == 1:
        return idx[0], 0
    return _row_of(idx, mask.shape), idx[-1]


def _row_of(idx: list[int], shape: torch.Size) -> int:
    row = 0
    for i, d in zip(idx[:-1], shape[:-1], strict=False):
        row = row * d + i
    return row


def output_sanity(out: torch.Tensor, ref: torch.Tensor | None = None) -> tuple[str, str] | None:
    """Reject trivially fake outputs; returns ``(kind, message)`` or ``None`` when sane.

    kinds: ``"nan-output"`` (NaN/inf where the reference, when given, is finite),
    ``"zero-output"`` (all zeros), ``"constant-output"`` (every element equal, more than
    one element). When ``ref`` is given, zero/constant are only reported if the reference
    itself is not zero/constant, and non-finite values where the reference has them are
    the non-finite rule's to judge (:func:`judge`).
    """
    if out.numel() == 0:
        return None
    o = out.detach().cpu()
    if o.is_floating_point():
        bad = ~torch.isfinite(o)
        if ref is not None and ref.shape == o.shape and ref.is_floating_point():
            bad &= torch.isfinite(ref.detach().cpu())
        if bool(bad.any()):
            n_nan = int(torch.isnan(o).sum())
            r, c = _first_rc(bad)
            what = "NaN" if n_nan else "inf"
            return (
                "nan-output",
                f"{what} present ({int(bad.sum())} of {o.numel()} non-finite, first at row {r} col {c})",
            )
    flat = o.reshape(-1)
    if bool((flat == 0).all()):
        if ref is None or not bool((ref.reshape(-1) == 0).all()):
            return "zero-output", f"all zeros ({o.numel()} elements)"
        return None
    if o.numel() > 1 and bool((flat == flat[0]).all()):
        rflat = None if ref is None else ref.detach().cpu().reshape(-1)
        if rflat is None or not bool((rflat == rflat[0]).all()):
            return "constant-output", f"constant output (every element = {float(flat[0]):.6g})"
    return None


# --------------------------------------------------------------------------- diagnosis


def _as2d(t: torch.Tensor) -> torch.Tensor:
    t = _f64(t)
    if t.dim() == 0:
        return t.reshape(1, 1)
    if t.dim() == 1:
        return t.reshape(-1, 1)
    return t.reshape(-1, t.shape[-1])


def _close(a: torch.Tensor, b: torch.Tensor, thr: float) -> bool:
    return a.shape == b.shape and bool((_abs_err(a, b) <= thr).all())


def _whole_tensor_pattern(o: torch.Tensor, r: torch.Tensor, thr: float) -> str | None:
    rmax = float(r.abs().max()) if r.numel() else 0.0
    if rmax <= thr:
        return None
    if _close(o, -r, thr):
        return "sign flipped (output = -expected everywhere)"
    if bool(torch.isfinite(o).all()):
        rr = float((r * r).sum())
        if rr > 0:
            s = float((o * r).sum()) / rr
            resid = float(((o - s * r) ** 2).sum()) ** 0.5 / rr**0.5
            if abs(s - 1) > 0.02 and resid < 0.02 and abs(s) > 1e-3:
                return f"whole tensor off by a constant factor ~{s:.4g} (output = {s:.4g} * expected)"
    R, C = o.shape
    if C >= 2 and C % 2 == 0:
        ev, od = r[:, 0::2], r[:, 1::2]
        if _close(o[:, 0::2], od, thr) and _close(o[:, 1::2], ev, thr):
            return (
                "adjacent column pairs swapped (gate/up interleaving reversed: column 2j holds "
                "what column 2j+1 should and vice versa)"
            )
        if _close(o, torch.cat([ev, od], dim=1), thr):
            return (
                "columns laid out as halves [even columns | odd columns] where interleaved "
                "columns were expected (gate/up blocked instead of interleaved)"
            )
        h = C // 2
        if _close(o[:, 0::2], r[:, :h], thr) and _close(o[:, 1::2], r[:, h:], thr):
            return (
                "columns interleaved where halves [first half | second half] were expected "
                "(gate/up interleaved instead of blocked)"
            )
    if R == C and R > 1 and _close(o, r.T, thr):
        return "output is the transpose of the expected tensor"
    return None


def describe_error(
    out: torch.Tensor,
    ref32: torch.Tensor,
    tile: tuple[int, int] = (128, 128),
    *,
    allowed: float | None = None,
) -> str:
    """Say where and how ``out`` differs from ``ref32`` (any shape; viewed as 2-D rows x last dim).

    An element is *wrong* when ``|out - ref32| > allowed`` (default ``1e-2 * max|ref32| +
    1e-6``). Recognised patterns: NaN present, all zeros, constant output, sign flipped,
    constant factor, gate/up swapped or blocked vs interleaved, transpose, only the ragged
    edge wrong, only rows/cols beyond the first tile wrong; otherwise how many ``tile``
    tiles are wrong and where the first is. Always ends with the worst element.
    """
    if out.shape != ref32.shape:
        return f"shape {tuple(out.shape)} but expected {tuple(ref32.shape)}"
    if out.numel() == 0:
        return "empty tensor"
    o, r = _as2d(out), _as2d(ref32)
    R, C = o.shape
    N = o.numel()
    thr = float(allowed) if allowed is not None else 1e-2 * float(torch.nan_to_num(r.abs(), nan=0.0).max()) + 1e-6
    err = _abs_err(o, r)
    wrong = err > thr
    n_wrong = int(wrong.sum())
    if n_wrong == 0:
        return f"no element beyond the allowed error {thr:.3g} (max err {float(err.max()):.3g})"
    parts: list[str] = []
    nan = torch.isnan(o)
    if bool(nan.any()):
        rr, cc = _first_rc(nan)
        parts.append(f"NaN present ({int(nan.sum())} of {N}, first at row {rr} col {cc})")
    if bool((o == 0).all()):
        parts.append("all zeros")
    elif N > 1 and bool((o == o.reshape(-1)[0]).all()):
        parts.append(f"constant output (every element = {float(o.reshape(-1)[0]):.6g})")
    else:
        pat = _whole_tensor_pattern(o, r, thr)
        if pat:
            parts.append(pat)
    parts.append(_location(wrong, tile))
    vals = o[wrong]
    if bool(torch.isnan(vals).all()):
        parts.append("every wrong element is NaN (never written? the allocator poison is NaN)")
    elif bool((vals == 0).all()):
        parts.append("every wrong element is 0 (never computed?)")
    flat = int(err.reshape(-1).argmax())
    wr, wc = divmod(flat, C)
    parts.append(
        f"{n_wrong} of {N} elements wrong; worst at row {wr} col {wc}: got {float(o[wr, wc]):.6g}, "
        f"expected {float(r[wr, wc]):.6g} (|err| {float(err[wr, wc]):.3g} > allowed {thr:.3g})"
    )
    return "; ".join(parts)


def _location(wrong: torch.Tensor, tile: tuple[int, int]) -> str:
    R, C = wrong.shape
    tm, tn = max(1, min(tile[0], R)), max(1, min(tile[1], C))
    full_r, full_c = (R // tm) * tm, (C // tn) * tn
    rows = wrong.any(1).nonzero().reshape(-1)
    cols = wrong.any(0).nonzero().reshape(-1)
    r0, c0 = int(rows[0]), int(cols[0])
    # tile grid
    Rt, Ct = -(-R // tm), -(-C // tn)
    pad = torch.zeros(Rt * tm, Ct * tn, dtype=torch.bool)
    pad[:R, :C] = wrong
    tw = pad.reshape(Rt, tm, Ct, tn).any(3).any(1)
    k, total = int(tw.sum()), Rt * Ct
    first = tw.reshape(-1).nonzero()[0]
    ti, tj = divmod(int(first), Ct)
    tiles = f"{k} of {total} tiles ({tm}x{tn}) wrong, first at tile ({ti}, {tj})"
    # ragged edge only
    edge = torch.zeros_like(wrong)
    edge_desc = []
    if R % tm and R > tm:
        edge[full_r:, :] = True
        edge_desc.append(f"rows >= {full_r}")
    if C % tn and C > tn:
        edge[:, full_c:] = True
        edge_desc.append(f"cols >= {full_c}")
    if edge_desc and not bool((wrong & ~edge).any()):
        fr = full_r if R % tm and R > tm else R
        fc = full_c if C % tn and C > tn else C
        need = [
            d
            for d in edge_desc
            if (d.startswith("rows") and bool(wrong[fr:, :fc].any()))
            or (d.startswith("cols") and bool(wrong[:fr, fc:].any()))
        ]
        joined = " or ".join(need) if need else " and ".join(edge_desc)  # nothing needed alone: the corner
        return (
            f"only the ragged edge ({joined}) wrong: the tensor is {R}x{C}, "
            f"not a multiple of the {tm}x{tn} tile; {tiles}"
        )
    if Rt * Ct > 1 and not bool(tw[0, 0]):
        if r0 >= tm and R > tm:
            return f"only rows beyond the first tile (rows >= {tm}) wrong; {tiles}"
        if c0 >= tn and C > tn:
            return f"only cols beyond the first tile (cols >= {tn}) wrong; {tiles}"
        if k == total - 1:
            return f"everything except the first tile wrong; {tiles}"
    frac_r, frac_c = len(rows) / R, len(cols) / C
    return f"{tiles}; wrong rows {len(rows)}/{R} (first {r0}), wrong cols {len(cols)}/{C} (first {c0})" + (
        "" if frac_r < 1 or frac_c < 1 else " (wrong everywhere)"
    )

"""verifier/stages/numerics.py: the five rules of ``judge`` on hand-made tensors, ``ulp``, ``row_scale``,
per-output tolerances, and the rule names ``check_output`` reports.

Each rule has a case that passes and a case that fails that rule alone (the others hold).
Shapes: 2 rows x 256 columns, so one deviating element is above no error percentile
(p99 of 512 errors is the 507th smallest).
"""

from __future__ import annotations

import math

import pytest
import torch

from coda_agent.verifier.spec import ToleranceSpec
from coda_agent.verifier.stages.correctness import check_output
from coda_agent.verifier.stages.numerics import RULE_ORDER, judge, row_scale, tolerance_check, ulp

TOL = ToleranceSpec()
U_BF16_SUB = 2.0**-133
"""The subnormal spacing of bf16 (fp32's exponent range, 7 mantissa bits): 2**(-126 - 7)."""


def _ref(seed: int = 0, rows: int = 2, cols: int = 256) -> torch.Tensor:
    """fp32 values in [1, 2) (every bf16 ulp is 2**-7 there), a fixed draw."""
    g = torch.Generator().manual_seed(seed)
    return 1 + torch.rand(rows, cols, generator=g)


def _failed(out, ref32, lowp, tol=TOL, dtype="bfloat16"):
    res = judge(out, ref32, lowp, tol, dtype)
    assert res["ok"] == (not res["failed"])
    return res["failed"], res


# --------------------------------------------------------------------------- one rule at a time


def _nonfinite(kind: str):
    r = _ref()
    r[0, 3], r[0, 4], r[1, 7] = math.nan, math.inf, -math.inf
    lo = r.clone()
    o = r.clone()
    if kind == "pass":  # any non-finite value where the reference has one
        o[0, 3], o[0, 4], o[1, 7] = math.inf, math.nan, math.nan
    else:  # a finite value where the reference is NaN
        o[0, 3] = 1.5
    return o, r, lo, TOL


def _max_abs(kind: str):
    r = _ref()
    lo = r.clone()  # the low-precision reference is exact: max-abs allows only the floor
    o = r.clone()
    # 1 bf16 ulp off at one element: inside the per-element bound (3 ulps + 2 ulps of the row)
    o[0, 5] = r[0, 5] + (2.0**-7 if kind == "fail" else 5e-7)
    return o, r, lo, TOL


def _elementwise(kind: str):
    r = _ref()
    lo = r.clone()
    lo[0, 0] = r[0, 0] + 0.5  # max-abs allows 2 x 0.5 everywhere
    o = r.clone()
    # the bound at [0, 5] (exact low-precision value there): 3 ulps + 2 row ulps = 5 x 2**-7 ~ 0.039
    o[0, 5] = r[0, 5] + (0.2 if kind == "fail" else 0.03)
    return o, r, lo, TOL


def _quantiles(kind: str):
    r = _ref()
    lo = r.clone()
    lo[0, 0] = r[0, 0] + 0.05  # max-abs allows 0.1; the low-precision percentiles are 0
    # every element off by the same amount, inside its per-element bound (~0.039); the
    # percentiles' bound is 2 x 0 + one bf16 ulp of the tensor's scale (2**-7 ~ 0.0078)
    o = r + (0.02 if kind == "fail" else 0.005)
    return o, r, lo, TOL


def _sign(kind: str):
    # Row 0 at bf16 subnormal magnitude, tolerance floor 0: an element of 4.5 subnormal
    # spacings u is judged by the sign rule (> 2 x its floor of 2 u) and may be 0 by the
    # per-element bound (3 u + 2 u). At normal magnitudes a zero or flipped sign always
    # breaks the per-element bound too (3 ulps are < 1/40 of the value).
    r = _ref()
    r[0] = 4.5 * U_BF16_SUB
    lo = r.clone()
    lo[1, 0] = r[1, 0] + 0.25  # row 1 gives max-abs an allowance of 0.5
    o = r.clone()
    o[0, 9] = 0.0 if kind == "fail" else 4.0 * U_BF16_SUB
    return o, r, lo, ToleranceSpec(floor=0.0)


CASES = {
    "nonfinite": _nonfinite,
    "max_abs": _max_abs,
    "elementwise": _elementwise,
    "quantiles": _quantiles,
    "sign": _sign,
}


def test_every_rule_has_its_cases():
    assert set(CASES) == set(RULE_ORDER)


@pytest.mark.parametrize("rule", RULE_ORDER)
def test_each_rule_passes_its_honest_case(rule):
    failed, res = _failed(*CASES[rule]("pass")[:3], CASES[rule]("pass")[3])
    assert failed == [], res["rules"]
    assert all(v["ratio"] <= 1 for v in res["rules"].values()), res["rules"]


@pytest.mark.parametrize("rule", RULE_ORDER)
def test_each_rule_alone_fails_its_case(rule):
    o, r, lo, tol = CASES[rule]("fail")
    failed, res = _failed(o, r, lo, tol)
    assert failed == [rule], res["rules"]
    assert res["rules"][rule]["ratio"] > 1
    assert all(v["ratio"] <= 1 for k, v in res["rules"].items() if k != rule), res["rules"]


def test_rule_numbers_of_the_failing_cases():
    _, res = _failed(*_nonfinite("fail")[:3])
    assert res["rules"]["nonfinite"]["finite_where_ref_not"] == 1
    assert res["rules"]["nonfinite"]["nonfinite_where_ref_finite"] == 0
    assert res["rules"]["nonfinite"]["ref_nonfinite"] == 3 and res["rules"]["nonfinite"]["first_index"] == [0, 3]
    _, res = _failed(*_max_abs("fail")[:3])
    assert res["max_err"] == pytest.approx(2.0**-7, rel=1e-6) and res["allowed"] == pytest.approx(1e-6)
    _, res = _failed(*_elementwise("fail")[:3])
    el = res["rules"]["elementwise"]
    assert el["over"] == 1 and el["worst"]["index"] == [0, 5] and el["judged"] == 512
    assert el["worst"]["err"] == pytest.approx(0.2, rel=1e-5)
    # 3 ulps at the element + 2 bf16 ulps of the row scale (rms of values in [1, 2)) + floor
    assert el["worst"]["bound"] == pytest.approx(5 * 2.0**-7 + 1e-6, rel=1e-6)
    _, res = _failed(*_quantiles("fail")[:3])
    q = res["rules"]["quantiles"]
    assert q["out"] == pytest.approx([0.02] * 3, rel=1e-4) and q["lowp"] == [0.0, 0.0, 0.0]
    assert q["bound"] == pytest.approx([2.0**-7 + 1e-6] * 3)
    o, r, lo, tol = _sign("fail")
    _, res = _failed(o, r, lo, tol)
    s = res["rules"]["sign"]
    # judged: all but [1, 0], whose low-precision error (0.25) puts its floor above half its value
    assert s["wrong"] == 1 and s["judged"] == 511 and s["first_index"] == [0, 9] and s["got"] == 0.0


def test_a_nan_where_the_reference_is_finite_is_also_an_element_error():
    r = _ref()
    o = r.clone()
    o[1, 2] = math.nan
    failed, res = _failed(o, r, r.clone())
    assert failed == ["nonfinite", "max_abs", "elementwise", "sign"]
    assert res["rules"]["nonfinite"]["nonfinite_where_ref_finite"] == 1
    assert res["rules"]["elementwise"]["ratio"] == math.inf and res["max_err"] == math.inf


def test_a_flipped_sign_at_normal_magnitude_fails_the_element_rule_too():
    r = _ref()
    o = r.clone()
    o[0, 1] = -r[0, 1]
    failed, _ = _failed(o, r, r.clone())
    assert failed == ["max_abs", "elementwise", "sign"]


def test_zero_where_the_reference_is_tiny_in_a_row_of_order_one_values():
    r = _ref()
    r[0, 17] = -3e-37
    lo = r.clone()
    lo[1, 0] = r[1, 0] + 0.01  # max-abs allows 0.02
    o = r.clone()
    o[0, 17] = 0.0
    # judged at the rounding of its row's scale (2 bf16 ulps of ~1.5), not its own ulps; the
    # sign rule does not judge it (far below rounding); with or without the absolute floor
    for tol in (TOL, ToleranceSpec(floor=0.0)):
        failed, res = _failed(o, r, lo, tol)
        assert failed == [], res["rules"]
        assert res["rules"]["sign"]["judged"] == 511
        assert res["rules"]["elementwise"]["ratio"] < 0.01
    # the same zero in a row whose own scale is 3e-37 is an error of that row
    r2 = r.clone()
    r2[0] = -3e-37
    o2 = r2.clone()
    o2[0, 17] = 0.0
    failed, _ = _failed(o2, r2, lo, ToleranceSpec(floor=0.0))
    assert failed == ["elementwise", "sign"]


def test_output_dtype_sets_the_element_ulps():
    r = _ref()
    o = r.clone()
    o[0, 5] = r[0, 5] + 2.0**-7  # 1 bf16 ulp; 2**16 fp32 ulps
    lo = r.clone()
    lo[1, 0] = r[1, 0] + 0.05  # max-abs allows 0.1
    assert _failed(o, r, lo, dtype="bfloat16")[0] == []
    # an fp32 output is still held to the low-precision (bf16) ulps of its row's scale
    assert _failed(o, r, lo, dtype="float32")[0] == []
    o[0, 5] = r[0, 5] + 3 * 2.0**-7
    assert _failed(o, r, lo, dtype="bfloat16")[0] == []  # 3 + 2 bf16 ulps
    assert _failed(o, r, lo, dtype="float32")[0] == ["elementwise"]  # only the 2 row ulps


# --------------------------------------------------------------------------- check_output messages

MESSAGE_RULE = {
    "nonfinite": "non-finite",
    "max_abs": "max-abs",
    "elementwise": "per-element",
    "quantiles": "error-quantiles",
    "sign": "sign",
}


@pytest.mark.parametrize("rule", RULE_ORDER)
def test_check_output_names_the_rule(rule):
    o, r, lo, tol = CASES[rule]("fail")
    bad, metrics = check_output("out", o, r, lo, tol, "case x, seed 1", "bfloat16", "bfloat16")
    assert bad is not None and bad[0] == "tolerance"
    assert bad[1].startswith(f"out [case x, seed 1]: rule {MESSAGE_RULE[rule]}: "), bad[1]
    assert metrics["ok"] is False and metrics["rules"][rule] > 1
    assert check_output("out", *CASES[rule]("pass")[:3], CASES[rule]("pass")[3], "c", "bfloat16")[0] is None


def test_first_failing_rule_names_the_finding():
    r = _ref()
    o = r.clone()
    o[0, :128] = 0.0  # max-abs, per-element, quantiles and sign all fail
    bad, m = check_output("postact", o, r, r.clone(), TOL, "c", "bfloat16")
    assert bad[0] == "tolerance" and ": rule max-abs: " in bad[1]
    assert {k for k, v in m["rules"].items() if v > 1} == {"max_abs", "elementwise", "quantiles", "sign"}


# --------------------------------------------------------------------------- ulp


@pytest.mark.parametrize(
    "dtype,x,expected",
    [
        ("bfloat16", 1.0, 2.0**-7),
        ("bfloat16", 1.99, 2.0**-7),
        ("bfloat16", 2.0, 2.0**-6),
        ("bfloat16", -3.0, 2.0**-6),
        ("bfloat16", 0.75, 2.0**-8),
        ("bfloat16", 1e30, 2.0 ** (99 - 7)),
        ("bfloat16", 2.0**-126, 2.0**-133),
        ("bfloat16", 1e-39, 2.0**-133),
        ("bfloat16", 0.0, 2.0**-133),
        ("float16", 1.0, 2.0**-10),
        ("float16", 1000.0, 2.0**-1),
        ("float16", 65504.0, 32.0),
        ("float16", 2.0**-14, 2.0**-24),
        ("float16", 3e-5, 2.0**-24),
        ("float16", 0.0, 2.0**-24),
        ("float32", 1.0, 2.0**-23),
        ("float32", 3.0, 2.0**-22),
        ("float32", -1e-3, 2.0**-33),
        ("float32", 1e-40, 2.0**-149),
        ("float32", 0.0, 2.0**-149),
    ],
)
def test_ulp_values(dtype, x, expected):
    got = ulp(torch.tensor([x], dtype=torch.float64), dtype)
    assert got.dtype == torch.float64 and float(got[0]) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ulp_is_the_spacing_above_each_value(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2000, generator=g) * torch.exp2(torch.randint(-10, 10, (2000,), generator=g).float())).to(dtype)
    x = x[x != 0]  # magnitudes 2**-10 .. 2**14 (fp16 subnormals among them)
    name = str(dtype).removeprefix("torch.")
    # the next representable value away from zero: one more in the raw bits (sign-magnitude)
    bits = x.view(torch.int16 if dtype != torch.float32 else torch.int32)
    up = (bits + 1).view(dtype)
    spacing = (up.double() - x.double()).abs()
    assert torch.equal(ulp(x.double(), name), spacing)


# --------------------------------------------------------------------------- row_scale


def test_row_scale_ignores_up_to_ten_percent_outliers():
    row = torch.ones(1, 100, dtype=torch.float64)
    with_outliers = row.clone()
    with_outliers[0, ::10] = 1000.0  # 10 of 100 elements
    assert float(row_scale(row)[0, 0]) == 1.0
    assert float(row_scale(with_outliers)[0, 0]) == 1.0
    too_many = row.clone()
    too_many[0, ::5] = 1000.0  # 20 %: the 90th percentile is an outlier
    assert float(row_scale(too_many)[0, 0]) > 400
    # the plain rms for comparison: the outliers would make it ~316
    assert float(with_outliers.pow(2).mean().sqrt()) > 300


def test_row_scale_is_per_row_and_a_1d_tensor_is_one_row():
    r = torch.tensor([[3.0, -4.0] * 5, [1e-30] * 10], dtype=torch.float64)
    s = row_scale(r)
    assert s.shape == (2, 1)
    assert float(s[0, 0]) == pytest.approx(math.sqrt(12.5)) and float(s[1, 0]) == pytest.approx(1e-30)
    assert row_scale(r[0]).shape == (1, 1) and float(row_scale(r[0])[0, 0]) == pytest.approx(math.sqrt(12.5))
    assert row_scale(r.reshape(2, 1, 10)).shape == (2, 1)  # leading dims are rows


def test_row_scale_is_the_rms_of_the_finite_values():
    # non-finite elements count neither in the mean nor in the 90th percentile
    r = torch.tensor([[1.0, 1.0, 1.0, math.nan], [2.0, math.inf, 2.0, 2.0]], dtype=torch.float64)
    assert row_scale(r).reshape(-1).tolist() == [1.0, 2.0]


# --------------------------------------------------------------------------- per-output tolerance


def test_per_output_tolerance_override():
    tol = ToleranceSpec(ulps=3, outputs={"postact": {"ulps": 8, "quantile_factor": 4}})
    p = tol.for_output("postact")
    assert (p.ulps, p.quantile_factor, p.factor, p.floor, p.floor_ulps) == (8, 4, 2.0, 1e-6, 2.0)
    assert p.outputs == {}
    assert tol.for_output("preact") is tol
    # the override decides the outcome: 6 bf16 ulps off at one element
    r = _ref()
    o = r.clone()
    o[0, 5] = r[0, 5] + 6 * 2.0**-7
    lo = r.clone()
    lo[1, 0] = r[1, 0] + 0.1
    assert tolerance_check(o, r, lo, tol.for_output("preact"), "bfloat16")["failed"] == ["elementwise"]
    assert tolerance_check(o, r, lo, tol.for_output("postact"), "bfloat16")["failed"] == []

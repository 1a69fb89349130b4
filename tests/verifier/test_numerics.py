"""verifier/stages/numerics.py: the CODA criterion, sanity checks, diagnoses; verifier/gpu/poison.py:
poison detection."""

import math

import pytest
import torch

from coda_agent.verifier.gpu.poison import POISON_WORD16, bitwise_equal, poison_count
from coda_agent.verifier.spec import ToleranceSpec
from coda_agent.verifier.stages.numerics import (
    abs_check,
    coda_check,
    describe_error,
    output_sanity,
    tolerance_check,
)


def _ref(rows=300, cols=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g)


def test_coda_criterion_pass_and_fail():
    r32 = _ref()
    lowp = r32.to(torch.bfloat16)
    res = coda_check(lowp, r32, lowp, factor=2.0, floor=1e-6)
    assert res["ok"] and res["ratio"] == pytest.approx(0.5, rel=1e-3)
    assert res["allowed"] == pytest.approx(2 * res["lowp_err"] + 1e-6)
    bad = lowp.float().clone()
    bad[5, 7] += 1.0
    res = coda_check(bad, r32, lowp, 2.0, 1e-6)
    assert not res["ok"] and res["worst_index"] == [5, 7]
    assert res["got"] == pytest.approx(float(bad[5, 7]))


def test_coda_nan_is_infinite_error_and_inf_matches():
    r32 = _ref()
    out = r32.clone()
    out[0, 0] = float("nan")
    res = coda_check(out, r32, r32.to(torch.bfloat16), 2.0, 1e-6)
    assert res["max_err"] == math.inf and not res["ok"] and res["nonfinite"] == 1
    r = torch.tensor([1.0, float("inf")])
    assert coda_check(r.clone(), r, r.clone(), 2.0, 0.0)["ok"]


def test_coda_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape mismatch"):
        coda_check(torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(3, 2))


def test_abs_rule_and_dispatch():
    r = torch.ones(4)
    assert abs_check(r + 1e-3, r, 1e-2)["ok"]
    assert not abs_check(r + 1e-1, r, 1e-2)["ok"]
    tol = ToleranceSpec(rule="abs", floor=1e-2)
    assert tolerance_check(r + 1e-3, r, None, tol)["rule"] == "abs"
    assert tolerance_check(r, r, r, ToleranceSpec())["rule"] == "coda"


def test_output_sanity():
    assert output_sanity(torch.zeros(4, 4))[0] == "zero-output"
    assert output_sanity(torch.full((4, 4), 3.0))[0] == "constant-output"
    t = torch.randn(4, 4)
    t[2, 3] = float("nan")
    kind, msg = output_sanity(t)
    assert kind == "nan-output" and "row 2 col 3" in msg
    assert output_sanity(torch.randn(4, 4)) is None
    # a reference that is itself zero/constant does not make a zero/constant output fake
    assert output_sanity(torch.zeros(3), ref=torch.zeros(3)) is None
    assert output_sanity(torch.ones(3), ref=torch.ones(3)) is None
    assert output_sanity(torch.ones(1)) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_poison_word_is_nan_and_counted(dtype):
    n_words = 16 * torch.empty((), dtype=dtype).element_size() // 2
    t = torch.full((n_words,), POISON_WORD16, dtype=torch.int16).view(dtype)
    assert torch.isnan(t).all()
    assert poison_count(t) == t.numel()
    computed = torch.tensor([float("nan")] * 4, dtype=dtype)  # arithmetic NaN: canonical payload
    assert poison_count(computed) == 0


def test_bitwise_equal():
    a = torch.randn(3, 5).bfloat16()
    assert bitwise_equal(a, a.clone())
    b = a.clone()
    b[1, 1] = -b[1, 1]
    assert not bitwise_equal(a, b)
    assert not bitwise_equal(a, a.float())
    n = torch.tensor([float("nan")])
    assert bitwise_equal(n, n.clone())


# --------------------------------------------------------------------------- diagnoses


def test_describe_nan_zero_constant():
    r = _ref()
    out = r.clone()
    out[10, 20] = float("nan")
    assert "NaN present (1 of 60000, first at row 10 col 20)" in describe_error(out, r, allowed=1e-3)
    assert "all zeros" in describe_error(torch.zeros_like(r), r, allowed=1e-3)
    assert "constant output" in describe_error(torch.full_like(r, 0.5), r, allowed=1e-3)


def test_describe_sign_and_factor():
    r = _ref()
    assert "sign flipped" in describe_error(-r, r, allowed=1e-3)
    d = describe_error(1.5 * r, r, allowed=1e-3)
    assert "constant factor ~1.5" in d


def test_describe_gate_up_swapped_and_blocked():
    r = _ref(64, 32)
    swapped = torch.empty_like(r)
    swapped[:, 0::2], swapped[:, 1::2] = r[:, 1::2], r[:, 0::2]
    assert "adjacent column pairs swapped" in describe_error(swapped, r, allowed=1e-4)
    blocked = torch.cat([r[:, 0::2], r[:, 1::2]], dim=1)
    assert "halves" in describe_error(blocked, r, allowed=1e-4)


def test_describe_ragged_edge_only():
    r = _ref(333, 200)
    out = r.clone()
    out[256:, :] = 0
    d = describe_error(out, r, allowed=1e-3)
    assert "only the ragged edge (rows >= 256) wrong" in d, d
    out = r.clone()
    out[:, 128:] += 1
    d = describe_error(out, r, allowed=1e-3)
    assert "ragged edge" in d and "cols >= 128" in d


def test_describe_beyond_first_tile():
    r = _ref(512, 256)
    out = r.clone()
    out[128:, :] = float("nan")
    d = describe_error(out, r, allowed=1e-3)
    assert "only rows beyond the first tile (rows >= 128) wrong" in d
    assert "never written" in d


def test_describe_scattered_tiles():
    r = _ref(512, 512)
    out = r.clone()
    out[300, 400] += 5
    d = describe_error(out, r, allowed=1e-3)
    assert "1 of 16 tiles (128x128) wrong, first at tile (2, 3)" in d
    assert "worst at row 300 col 400" in d


def test_describe_within_tolerance_and_1d():
    r = torch.randn(100)
    assert "no element beyond" in describe_error(r.clone(), r, allowed=1e-3)
    out = r.clone()
    out[99] += 1
    assert "row 99" in describe_error(out, r, allowed=1e-3)
    assert "shape" in describe_error(torch.zeros(3), torch.zeros(4))

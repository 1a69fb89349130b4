"""The fp8 rule (verifier/stages/numerics_fp8.py) on the CPU.

The grid: ``round_fp8`` is round-to-nearest-even with saturation, equal to torch's own
fp32 -> float8_e4m3fn cast on every fp32 midpoint and boundary of the format; a code's
rounding interval is what the rule measures distances to.

The rule, on gemm_fp8_quant's reference (y = x @ w^T, 1x128 block scales): honest
quantizers pass -- torch's fp32 GEMM in another reduction order, and an emulated tensor
core that truncates its fp32 accumulation every 16 products (the worst honest case the
band must cover) -- and the wrong-but-plausible ones fail: truncation instead of
rounding, values on the e5m2 grid, codes scaled twice, saturation missing (a static
per-tensor scale that values exceed), NaN codes. A scale off by a power of two or taken
over the wrong group fails the scale's own CODA rule.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from coda_agent.verifier.gpu.samples import block_max, expand_blocks, output_samples, scale_index
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.stages.numerics import tolerance_check
from coda_agent.verifier.stages.numerics_fp8 import (
    BAND_FACTOR,
    FORMATS,
    _distance_to_code,
    check_fp8_output,
    fp8_check,
    fp8_spacing,
    round_fp8,
)

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "kernel_specs" / "gemm_fp8_quant")
REF = SPEC.load_reference()
E4 = "float8_e4m3fn"
EPS = 1e-4


# --------------------------------------------------------------------------- the grid


def _grid(dtype: str) -> torch.Tensor:
    """Every finite non-negative value of the fp8 format (from its 256 bit patterns)."""
    t = getattr(torch, dtype)
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(t).float().double()
    return vals[torch.isfinite(vals) & (vals >= 0)].unique()


@pytest.mark.parametrize("dtype", sorted(FORMATS))
def test_grid_matches_the_format(dtype):
    g = _grid(dtype)
    assert float(g.max()) == FORMATS[dtype].max
    assert torch.equal(round_fp8(g, dtype), g)  # grid points round to themselves
    assert torch.equal(round_fp8(-g, dtype), -g)


@pytest.mark.parametrize("dtype", sorted(FORMATS))
def test_round_fp8_is_torchs_cast_at_every_midpoint(dtype):
    g = _grid(dtype)
    mids = (g[1:] + g[:-1]) / 2
    probes = torch.cat([g, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    probes = probes[probes <= FORMATS[dtype].max].float().double()  # fp32 inputs, as a kernel's
    probes = torch.cat([probes, -probes])
    want = probes.float().to(getattr(torch, dtype)).float().double()
    assert torch.equal(round_fp8(probes, dtype), want)
    # ties to even: the midpoint of 16 and 18 (e4m3, step 2) is 17 -> 16; of 18 and 20 -> 20
    if dtype == E4:
        assert round_fp8(torch.tensor([17.0, 19.0, -17.0]), dtype).tolist() == [16.0, 20.0, -16.0]


def test_the_ulp_table_knows_the_fp8_grids():
    """numerics.ulp of an fp8 dtype is the distance from each grid value to the next one."""
    from coda_agent.verifier.stages.numerics import ulp

    for dtype, fmt in FORMATS.items():
        g = _grid(dtype)
        assert torch.equal(ulp(g[:-1], dtype), g[1:] - g[:-1]), dtype
        assert torch.equal(ulp(g, dtype), fp8_spacing(g, fmt)), dtype


def test_round_fp8_saturates_and_keeps_nan():
    x = torch.tensor([463.0, 464.0, 1e9, math.inf, -math.inf, math.nan], dtype=torch.float64)
    got = round_fp8(x, E4)
    assert got[:5].tolist() == [448.0, 448.0, 448.0, 448.0, -448.0]
    assert math.isnan(float(got[5]))
    assert round_fp8(torch.tensor([1e9]), "float8_e5m2").tolist() == [57344.0]


def test_distance_to_code():
    fmt = FORMATS[E4]
    x = torch.tensor([17.2, 17.2, 17.2, 0.0009, 500.0, 3.999], dtype=torch.float64)
    c = torch.tensor([18.0, 16.0, 20.0, 0.0, 448.0, 4.0], dtype=torch.float64)
    d = _distance_to_code(x, c, fmt)
    # 17.2 rounds to 18 (step 2): no distance; to reach 16's interval [15.5, 17] it moves 0.2
    assert d.tolist() == pytest.approx([0.0, 0.2, 1.8, 0.0, 0.0, 0.0])
    # below a power of two the step halves: 4's interval is [3.875, 4.25]
    assert float(_distance_to_code(torch.tensor([3.8]).double(), torch.tensor([4.0]).double(), fmt)) == (
        pytest.approx(0.075)
    )


# --------------------------------------------------------------------------- the rule on gemm_fp8_quant


def _problem(m=192, n=512, k=4096, seed=0):
    """x, w (bf16), the fp32 and float64 references of y and the band per block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).bfloat16()
    r32 = REF.reference(x=x.float(), w=w.float(), eps=EPS)
    r64 = REF.reference(x=x.double(), w=w.double(), eps=EPS)
    y32, y64 = r32["y_fp8"], r64["y_fp8"]
    band = block_max((y32.double() - y64).abs(), (m, n // 128))
    rlp = REF.reference(x=x, w=w, eps=EPS)
    return x, w, y32, y64, band, r32["y_scale"], rlp["y_scale"]


def _quantize(y: torch.Tensor, eps: float = EPS, *, reciprocal: bool = False):
    """An honest quantizer of an fp32 y: block amax, scale = max(amax, eps) / 448, codes
    y / scale (or y * (448 / amax), DeepGEMM's form) cast with torch (RNE, saturating)."""
    m, n = y.shape
    blocks = y.float().reshape(m, n // 128, 128)
    amax = blocks.abs().amax(-1).clamp_min(eps)
    scale = amax / 448.0
    v = blocks * (448.0 / amax)[..., None] if reciprocal else blocks / scale[..., None]
    return v.to(torch.float8_e4m3fn).reshape(m, n), scale


def _tensor_core(x: torch.Tensor, w: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """An emulated tensor-core GEMM: each chunk of ``chunk`` products summed exactly, added to
    an fp32 accumulator rounded toward zero (truncation), K in order."""
    xd, wd = x.double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for k0 in range(0, x.shape[1], chunk):
        exact = acc.double() + xd[:, k0 : k0 + chunk] @ wd[:, k0 : k0 + chunk].T
        near = exact.float()
        toward_zero = torch.where(
            near.double().abs() > exact.abs(), torch.nextafter(near, torch.zeros_like(near)), near
        )
        acc = toward_zero
    return acc


def _judge(codes, scale, y32, band):
    shape = tuple(codes.shape)
    return fp8_check(codes, expand_blocks(scale, shape), y32, expand_blocks(band, shape), E4)


def test_honest_torch_quantizer_in_another_order_passes():
    x, w, y32, y64, band, s32, slp = _problem()
    # K reversed: another reduction order of the same fp32 sums
    y_other = x.float().flip(-1) @ w.float().flip(-1).T
    assert not torch.equal(y_other, y32)
    for reciprocal in (False, True):
        codes, scale = _quantize(y_other, reciprocal=reciprocal)
        res = _judge(codes, scale, y32, band)
        assert res["ok"], res["rules"]
        assert tolerance_check(scale, s32, slp, SPEC.spec.tolerance.for_output("y_scale"), "float32")["ok"]


def test_honest_truncating_tensor_core_passes_with_margin():
    x, w, y32, y64, band, s32, slp = _problem(k=4096)
    y_tc = _tensor_core(x, w)
    ratio = float(((y_tc.double() - y64).abs() / expand_blocks(band, tuple(y64.shape))).max())
    assert 10 < ratio < BAND_FACTOR / 4  # far beyond the reference's own error, well inside the band
    codes, scale = _quantize(y_tc)
    res = _judge(codes, scale, y32, band)
    assert res["ok"], res["rules"]["fp8_rounding"]
    assert res["rules"]["fp8_rounding"]["ratio"] < 0.5


def test_codes_equal_to_the_rounded_reference_pass_and_flips_are_rare():
    x, w, y32, y64, band, s32, slp = _problem()
    codes, scale = _quantize(y32)
    res = _judge(codes, scale, y32, band)
    assert res["ok"] and res["rules"]["fp8_rounding"]["flips"] == 0 and res["ratio"] == 0


def _truncate(v: torch.Tensor) -> torch.Tensor:
    """Round toward zero on the e4m3 grid (saturating)."""
    fmt = FORMATS[E4]
    a = v.double().abs().clamp(max=fmt.max)
    _, e = torch.frexp(a)
    e = torch.where(a > 0, e - 1, torch.full_like(e, fmt.min_exp)).clamp_min(fmt.min_exp)
    step = torch.ldexp(torch.ones_like(a), e - fmt.mantissa)
    return torch.copysign(torch.floor(a / step) * step, v.double()).float().to(torch.float8_e4m3fn)


WRONG = {
    "truncation": lambda v: _truncate(v),
    "e5m2_grid": lambda v: v.to(torch.float8_e5m2).float().to(torch.float8_e4m3fn),
    "scaled_twice": lambda v: (v * 0.5).to(torch.float8_e4m3fn),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_codes_fail_the_rounding_rule(name):
    x, w, y32, y64, band, s32, slp = _problem()
    m, n = y32.shape
    blocks = y32.reshape(m, n // 128, 128)
    scale = blocks.abs().amax(-1).clamp_min(EPS) / 448.0
    codes = WRONG[name]((blocks / scale[..., None]).reshape(m, n))
    res = _judge(codes, scale, y32, band)
    assert not res["ok"] and res["failed"] == ["fp8_rounding"]
    r = res["rules"]["fp8_rounding"]
    assert r["over"] > 0.05 * r["judged"], r  # a systematic error: many whole steps
    bad, _ = check_fp8_output("y_fp8", codes, expand_blocks(scale, (m, n)), y32, expand_blocks(band, (m, n)), E4, "t")
    assert bad is not None and bad[0] == "tolerance" and "rule fp8-rounding" in bad[1]


def test_missing_saturation_fails():
    """A static per-tensor scale (from a previous step's amax) that this step's values exceed:
    a saturating quantizer stores +-448 there, one without saturation NaN (e4m3fn has no Inf)."""
    x, w, y32, y64, band, _, _ = _problem()
    scale = torch.full((1, 1), float(y32.abs().max()) / 448.0 / 1.5)  # values up to 1.5 x the range
    v = y32 / scale
    sat = v.to(torch.float8_e4m3fn)  # torch's cast saturates
    nosat = torch.where(v.abs() > 464, torch.full_like(v, math.nan), v).to(torch.float8_e4m3fn)
    band1 = block_max((y32.double() - y64).abs(), (1, 1))
    shape = tuple(y32.shape)
    assert fp8_check(sat, expand_blocks(scale, shape), y32, expand_blocks(band1, shape), E4)["ok"]
    res = fp8_check(nosat, expand_blocks(scale, shape), y32, expand_blocks(band1, shape), E4)
    assert res["failed"] == ["nonfinite"] and res["rules"]["nonfinite"]["nonfinite_where_ref_finite"] > 0


@pytest.mark.parametrize("wrong", ["power_of_two", "group_256", "group_row"])
def test_a_wrong_scale_fails_the_scales_own_rule(wrong):
    x, w, y32, y64, band, s32, slp = _problem()
    m, n = y32.shape
    if wrong == "power_of_two":
        scale = s32 * 2
    elif wrong == "group_256":
        scale = y32.abs().reshape(m, n // 256, 256).amax(-1).clamp_min(EPS).repeat_interleave(2, dim=1) / 448.0
    else:
        scale = y32.abs().amax(-1, keepdim=True).clamp_min(EPS).expand(m, n // 128) / 448.0
    res = tolerance_check(scale, s32, slp, SPEC.spec.tolerance.for_output("y_scale"), "float32")
    assert not res["ok"], res["rules"]
    # codes computed consistently with the wrong scale pass the rounding rule: reported once, at the scale
    codes = (y32 / expand_blocks(scale, (m, n))).to(torch.float8_e4m3fn)
    assert _judge(codes, scale, y32, band)["ok"]


def test_nan_codes_fail_and_poison_is_named():
    x, w, y32, y64, band, s32, slp = _problem(m=64, n=256, k=512)
    codes, scale = _quantize(y32)
    raw = codes.view(torch.uint8).clone()
    raw[3, 10] = 0x7F  # NaN in e4m3fn
    res = _judge(raw.view(torch.float8_e4m3fn), scale, y32, band)
    assert res["failed"] == ["nonfinite"]
    poisoned = codes.view(torch.uint8).clone().reshape(-1)
    poisoned[:64] = torch.tensor([0xC1, 0x7F], dtype=torch.uint8).repeat(32)  # the allocator's 16-bit poison
    shape = tuple(codes.shape)
    bad, m = check_fp8_output(
        "y_fp8",
        poisoned.view(torch.float8_e4m3fn).reshape(shape),
        expand_blocks(scale, shape),
        y32,
        expand_blocks(band, shape),
        E4,
        "t",
    )
    assert bad is not None and bad[0] == "stale-memory" and m["poisoned"] == 64


# --------------------------------------------------------------------------- blocks and samples


def test_blocks_and_paired_samples():
    out_shape, scale_shape = (5, 512), (5, 4)
    flat = torch.arange(5 * 512)
    idx = scale_index(flat, out_shape, scale_shape)
    rows, cols = flat // 512, flat % 512
    assert torch.equal(idx, rows * 4 + cols // 128)
    s = torch.arange(20.0).reshape(scale_shape)
    assert torch.equal(expand_blocks(s, out_shape).reshape(-1), s.reshape(-1)[idx])
    v = torch.rand(out_shape)
    assert torch.equal(block_max(v, scale_shape), v.reshape(5, 4, 128).amax(-1))
    assert torch.equal(expand_blocks(torch.tensor([2.0]), (3, 4)), torch.full((3, 4), 2.0))
    # a sampled run: the scale's samples are the scales of the fp8 output's sampled elements
    dims = {"M": 333, "N": 384, "K": 264}
    picked = output_samples(SPEC.spec, dims, 1000, 7)
    assert picked[0].shape == picked[1].shape == (1000,)
    assert torch.equal(picked[1], scale_index(picked[0], (333, 384), (333, 3)))


@pytest.mark.slow
def test_calibration_script_judges_fp8_outputs_on_the_cpu(monkeypatch, capsys):
    """benchmarks/probes/numerics_rule_calibration.py on gemm_fp8_quant (public cases and one secret's
    coverage cases): no honest quantizer fails, every wrong one does (exit 0)."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "probes"))
    sys.modules.pop("numerics_rule_calibration", None)
    import numerics_rule_calibration

    assert numerics_rule_calibration.main(["--device", "cpu", "--secrets", "1", "--spec", "gemm_fp8_quant"]) == 0
    out = capsys.readouterr().out
    assert "| cpu_fp32_flip | 22 | 0 |" in out and "| fp8_truncated | 22 | 11 |" in out


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4096, 14336])
def test_quack_and_tensor_core_accumulation_pass_the_fp8_rule(k):
    """The band on the hardware the kernels run on: quack's identity-epilogue GEMM (fp32 D)
    and cuBLAS's bf16 -> fp32 tensor-core GEMM, quantized honestly, pass against the
    reference worker's fp32 (TF32 off) and float64 references with at least 2x margin."""
    from quack.epilogue.library import identity_epi

    from coda_agent.verifier.gpu.worker_reference import _exact_fp32

    _exact_fp32()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2048, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(4096, k, generator=g, device="cuda") / math.sqrt(k)).bfloat16()
    y32 = (x.float() @ w.float().T).cpu()
    y64 = (x.double() @ w.double().T).cpu()
    band = block_max((y32.double() - y64).abs(), (2048, 32))
    for y in (
        identity_epi(x, w.T, tuned=False, out_dtype=torch.float32)["D"],
        torch.mm(x, w.T, out_dtype=torch.float32),
    ):
        codes, scale = _quantize(y.cpu())
        res = _judge(codes, scale, y32, band)
        assert res["ok"] and res["rules"]["fp8_rounding"]["ratio"] < 0.5, res["rules"]["fp8_rounding"]

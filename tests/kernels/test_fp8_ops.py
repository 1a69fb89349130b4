"""coda_agent.kernels FP8 quantized projection: linear_fp8_quant (gemm_fp8_quant), its torch
path and dequantize_blockwise.

On the CPU the spec's ``reference`` stands in for the kernel: y = x @ w^T in fp32 (the
inputs upcast, as the verifier's ref32) and its scales, the codes rounded from y / scale
by the verifier's fp64 round-to-nearest-even (``numerics_fp8.round_fp8``, independent of
torch's float8 cast). The layout checks stay on. On a Hopper GPU the real kernel runs (``gpu``;
skipped until it is accepted).
"""

from __future__ import annotations

import pytest
import torch
from glue_helpers import reference_module, use_standins

import coda_agent.kernels as K
from coda_agent.verifier.stages.numerics_fp8 import BAND_FACTOR, FORMATS, fp8_spacing, round_fp8

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
BLOCK, EPS = 128, 1e-4


def standins() -> dict:
    ref = reference_module("gemm_fp8_quant").reference

    def gemm_fp8_quant(x, w, *, eps):
        r = ref(x=x.float(), w=w.float(), eps=eps)
        y, scale = r["y_fp8"], r["y_scale"]  # the reference's y_fp8 is y itself, unrounded
        codes = round_fp8(y.unflatten(1, (-1, BLOCK)) / scale[..., None], "float8_e4m3fn")
        return codes.to(E4M3).flatten(1), scale

    return {"gemm_fp8_quant": gemm_fp8_quant}


@pytest.fixture
def kernels(monkeypatch):
    return use_standins(monkeypatch, standins(), check_layout=True)


def inputs(device="cpu", M=33, K=72, N=384, seed=0):
    """x (M, K) bf16 ~ N(0, 1), w (N, K) bf16 ~ N(0, 1/K) (the spec's draws); M ragged."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device).to(BF16)
    w = (torch.randn(N, K, generator=g, device=device) / K**0.5).to(BF16)
    return x, w


def y32(x, w):
    return x.float() @ w.float().T


def half_step(v: torch.Tensor) -> torch.Tensor:
    """Half the float8_e4m3fn grid spacing at magnitudes |v| (fp64), the verifier's grid."""
    return fp8_spacing(v.double().abs(), FORMATS["float8_e4m3fn"]) / 2


def per_element(scale: torch.Tensor) -> torch.Tensor:
    return scale.repeat_interleave(BLOCK, dim=1)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


# --------------------------------------------------------------------------- CPU tests


def test_op_equals_the_torch_path_bit_exactly_cpu(kernels):
    x, w = inputs()
    q, s = K.linear_fp8_quant(x, w)
    assert kernels["gemm_fp8_quant"] == 1
    assert (q.dtype, tuple(q.shape), s.dtype, tuple(s.shape)) == (E4M3, (33, 384), torch.float32, (33, 3))
    qt, st = K.linear_fp8_quant_torch(x, w)
    assert torch.equal(bits(q), bits(qt)) and torch.equal(s, st)


def test_dequantized_values_are_within_half_an_e4m3_step_cpu(kernels):
    """|q * s - y| <= s * (half a step at |y / s| + the fp32 quotient's half ulp), with y the
    fp32 GEMM; the bound is tight (some element needs most of it)."""
    x, w = inputs(M=64, K=256, N=512)
    q, s = K.linear_fp8_quant(x, w)
    deq = K.dequantize_blockwise(q, s)
    se, y = per_element(s).double(), y32(x, w).double()
    assert torch.equal(deq, (q.double() * se).float())  # one fp32 rounding of the exact product
    v = y / se
    bound = se * (half_step(v) + v.abs() * 2.0**-24)
    err = (q.double() * se - y).abs()
    ratio = (err / bound).max().item()
    assert ratio <= 1.0, f"max err / bound {ratio:.4f}"
    assert ratio > 0.9, f"max err / bound {ratio:.4f}: the check is not exercising the rounding"


def test_block_maximum_maps_to_448_and_scale_is_amax_over_448_cpu(kernels):
    x, w = inputs()
    q, s = K.linear_fp8_quant(x, w)
    blocks = y32(x, w).unflatten(1, (-1, BLOCK))
    amax, where = blocks.abs().max(dim=-1)
    assert torch.equal(s, amax / 448.0)
    top = q.float().unflatten(1, (-1, BLOCK)).gather(-1, where[..., None])[..., 0]
    sign = blocks.gather(-1, where[..., None])[..., 0].sign()
    assert torch.equal(top, 448.0 * sign)
    assert q.float().abs().max().item() == 448.0


def test_an_all_zero_block_gets_scale_eps_over_448_and_zeros_cpu(kernels):
    x, w = inputs()
    w[BLOCK : 2 * BLOCK] = 0  # block 1 of every row is 0
    x[5] = 0  # every block of row 5 is 0
    q, s = K.linear_fp8_quant(x, w)
    floor = torch.tensor(EPS, dtype=torch.float32) / 448.0
    assert torch.equal(s[:, 1], floor.expand(33)) and torch.equal(s[5], floor.expand(3))
    assert not bits(q[:, BLOCK : 2 * BLOCK]).any() and not bits(q[5]).any()  # +0.0, no NaN
    assert (s[torch.arange(33) != 5][:, [0, 2]] > floor).all()


def test_argument_errors_name_the_op_and_the_argument_cpu(kernels):
    x, w = inputs()
    with pytest.raises(ValueError, match=r"^linear_fp8_quant: N = w.shape\[0\] = 200 must be a multiple of 128"):
        K.linear_fp8_quant(x, w[:200])
    with pytest.raises(ValueError, match=r"^linear_fp8_quant_torch: N = w.shape\[0\] = 200 must be a multiple"):
        K.linear_fp8_quant_torch(x, w[:200])
    with pytest.raises(ValueError, match=r"need x \(M, K\) and w \(N, K\) with one K, got \(33, 72\) and \(384, 64\)"):
        K.linear_fp8_quant(x, w[:, :64].contiguous())
    with pytest.raises(ValueError, match=r"^linear_fp8_quant: x must be torch.bfloat16, got torch.float32$"):
        K.linear_fp8_quant(x.float(), w)
    with pytest.raises(ValueError, match=r"^linear_fp8_quant: w must be contiguous"):
        K.linear_fp8_quant(x, w.T.contiguous().T)
    with pytest.raises(ValueError, match=r"verified with eps = 0.0001, got 0.001; use linear_fp8_quant_torch"):
        K.linear_fp8_quant(x, w, eps=1e-3)
    with pytest.raises(ValueError, match=r"^linear_fp8_quant_torch: eps must be > 0"):
        K.linear_fp8_quant_torch(x, w, eps=0.0)
    q, s = K.linear_fp8_quant(x, w)
    with pytest.raises(ValueError, match=r"^dequantize_blockwise: y_fp8 must be torch.float8_e4m3fn"):
        K.dequantize_blockwise(q.float(), s)
    with pytest.raises(ValueError, match=r"need y_fp8 \(M, N\).*got \(33, 384\) and \(33, 2\)"):
        K.dequantize_blockwise(q, s[:, :2])
    assert K.linear_fp8_quant_torch(x, w, eps=1e-3)[1].min() >= 1e-3 / 448  # the torch path takes any eps
    assert kernels["gemm_fp8_quant"] == 1


@pytest.mark.parametrize("fn", [K.linear_fp8_quant, K.linear_fp8_quant_torch], ids=lambda f: f.__name__)
def test_an_input_that_requires_grad_is_refused_not_dropped_cpu(fn, kernels):
    x, w = inputs()
    for name, args in (("x", (x.clone().requires_grad_(), w)), ("w", (x, torch.nn.Parameter(w.clone())))):
        with pytest.raises(
            ValueError,
            match=rf"^{fn.__name__}: {name} requires grad, but the FP8 quantization is not differentiable.*"
            rf"call it under torch.no_grad\(\) or pass {name}.detach\(\)",
        ):
            fn(*args)
        with torch.no_grad():
            q, _ = fn(*args)
        assert not q.requires_grad
        assert torch.equal(bits(fn(*(a.detach() for a in args))[0]), bits(q))


def test_not_accepted_and_off_cuda_cpu(monkeypatch, tmp_path):
    x, w = inputs()
    with pytest.raises(ValueError, match=r"^linear_fp8_quant: the fused kernels need all tensors on one CUDA"):
        K.linear_fp8_quant(x, w)
    monkeypatch.setattr(K, "KERNELS_DIR", tmp_path)  # no accepted kernels
    monkeypatch.setattr(K, "_check_device", lambda *a, **kw: None)
    with pytest.raises(ModuleNotFoundError, match=r"no accepted kernel 'gemm_fp8_quant'"):
        K.linear_fp8_quant(x, w)


def test_fake_impl_shapes_and_dtypes_cpu(kernels):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, s = K.gemm_fp8_quant_op(torch.empty(1000, 64, dtype=BF16), torch.empty(640, 64, dtype=BF16))
    assert (q.dtype, tuple(q.shape), s.dtype, tuple(s.shape)) == (E4M3, (1000, 640), torch.float32, (1000, 5))
    assert kernels["gemm_fp8_quant"] == 0
    torch.library.opcheck(K.gemm_fp8_quant_op, inputs(), {"eps": EPS})


@pytest.mark.slow
def test_under_torch_compile_fullgraph_cpu(kernels):
    """One opaque node (aot_eager, no graph break), the eager bits, and no recompile per M."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(K.linear_fp8_quant, fullgraph=True, backend=counter)
    for m in (16, 33, 40, 57):
        x, w = inputs(M=m)
        (q, s), (qe, se) = compiled(x, w), K.linear_fp8_quant(x, w)
        assert torch.equal(bits(q), bits(qe)) and torch.equal(s, se)
    assert counter.frame_count == 2  # static, then one dynamic-M graph
    torch._dynamo.reset()


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_on_gpu():
    """The real kernel (M = 1000, K = 1024, N = 1536) against linear_fp8_quant_torch: scales
    within fp32 accumulation error, dequantized values within half an e4m3 step of the fp32
    GEMM plus the verifier's excuse at a rounding midpoint (BAND_FACTOR x the fp32 GEMM's own
    block error), almost every code equal."""
    if "gemm_fp8_quant" not in K.accepted():
        pytest.skip("kernels not accepted yet: ['gemm_fp8_quant']")
    x, w = inputs("cuda", M=1000, K=1024, N=1536)
    q, s = K.linear_fp8_quant(x, w)
    qt, st = K.linear_fp8_quant_torch(x, w)
    assert (q.dtype, q.shape, s.dtype, s.shape) == (qt.dtype, qt.shape, st.dtype, st.shape)
    torch.testing.assert_close(s, st, rtol=1e-5, atol=1e-9)
    y = y32(x, w).double()
    band = (y - x.double() @ w.double().T).abs().unflatten(1, (-1, BLOCK)).amax(-1)
    se = per_element(s).double()
    v = y / se
    bound = se * (half_step(v) + 4 * v.abs() * 2.0**-23) + BAND_FACTOR * per_element(band)
    err = (K.dequantize_blockwise(q, s).double() - y).abs()
    assert (err <= bound).all(), f"max err / bound {(err / bound).max().item():.3f}"
    assert (bits(q) != bits(qt)).float().mean().item() < 1e-3

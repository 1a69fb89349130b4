"""Catalogue RoPE specs (items 5 and 10): gemm_rope, gemm_rmsnorm_rope, rope_bwd.

On the CPU: the specs load; the derived inv_freq is Llama 3's; the references agree with an
independent float64 computation written differently (complex multiplication by
torch.polar(1, theta), the inverse as multiplication by the conjugate); rope_bwd is the
adjoint of gemm_rope's rotation; the value columns pass through bit for bit; baselines
agree with the references; outputs are O(1) and the rotation is far from the identity;
and quack_library's parameterization (the float-float frequency table of
make_interleaved_inv_freq, negated for the backward) reproduces the references when the
kernel's angle math is emulated in float64.
"""

import math
from pathlib import Path

import pytest
import torch

from coda_agent.verifier.gpu.inputs import make_inputs, upcast
from coda_agent.verifier.spec import eval_expr, load_spec

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("gemm_rope", "gemm_rmsnorm_rope", "rope_bwd")
F64 = torch.float64


def _load(name):
    loaded = load_spec(ROOT / "kernel_specs" / name)
    return loaded, loaded.load_reference()


def _f64(inputs):
    return {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}


def _cases(name):
    loaded, _ = _load(name)
    return [(name, i) for i in range(len(loaded.spec.shapes.correctness))]


ALL_CASES = [c for n in NAMES for c in _cases(n)]


def _inputs(loaded, case, seed=0):
    dims = loaded.spec.shapes.correctness[case].dims
    return dims, make_inputs(loaded, dims, seed, device="cpu")


def _heads(dims):
    """The spec's constants: keyword ints every reference.py function receives."""
    return {"HQ": dims["HQ"], "HKV": dims["HKV"]}


def _n_rot(dims):
    return (dims["HQ"] + dims["HKV"]) * dims["HD"]


# --------------------------------------------------------------------------- independent math


def _cis(positions, dims, conj=False):
    """(M, HQ+HKV, HD/2) complex128 e^{i theta}, theta = pos * 500000^(-2j/HD), from scratch."""
    hd = dims["HD"]
    inv = torch.pow(torch.tensor(500000.0, dtype=F64), -torch.arange(0, hd, 2, dtype=F64) / hd)
    inv = inv.float().double()  # the spec's input is this float32 table
    theta = positions.double()[:, None] * inv[None, :]
    z = torch.polar(torch.ones_like(theta), theta)
    z = z.conj() if conj else z
    return z[:, None, :].expand(-1, dims["HQ"] + dims["HKV"], -1)  # every Q and K head


def _complex_rope(qkv, positions, dims, inverse=False):
    """RoPE (or its inverse) of a float64 qkv as complex multiplication of the column pairs."""
    m, r = qkv.shape[0], _n_rot(dims)
    pairs = torch.view_as_complex(qkv[:, :r].reshape(m, -1, dims["HD"] // 2, 2).contiguous())
    rotated = torch.view_as_real(pairs * _cis(positions, dims, conj=inverse)).reshape(m, r)
    return torch.cat([rotated, qkv[:, r:]], dim=1)


def _projection(name, x):
    """The GEMM output before the rotation (float64, or the inputs' dtype)."""
    if name == "gemm_rope":
        return x["x"] @ x["w_qkv"].T
    if name == "gemm_rmsnorm_rope":
        h = x["a"] * x["rstd"][:, None]
        if x["a"].dtype != F64:  # the normalized activation is bf16, as nn.RMSNorm's output
            h = (x["a"].float() * x["rstd"][:, None]).to(x["a"].dtype)
        return h @ x["w_qkv"].T
    return x["g"] @ x["w"].T


def _out_name(name):
    return "dqkv" if name == "rope_bwd" else "qkv"


# --------------------------------------------------------------------------- spec fields


@pytest.mark.parametrize("name", NAMES)
def test_spec_loads(name):
    loaded, ref = _load(name)
    s = loaded.spec
    assert s.name == name and s.entry.function == name
    assert (s.catalogue_item, s.pattern) == ((10, "backward") if name == "rope_bwd" else (5, "forward"))
    ins = [t.name for t in s.entry.inputs]
    assert ins[-2:] == ["positions", "inv_freq"]
    assert (
        ins[:-2]
        == {"gemm_rope": ["x", "w_qkv"], "gemm_rmsnorm_rope": ["a", "rstd", "w_qkv"], "rope_bwd": ["g", "w"]}[name]
    )
    [out] = s.entry.outputs
    assert out.name == _out_name(name) and out.dtype == "bfloat16" and out.gradient is None
    pos, inv = s.entry.inputs[-2], s.entry.inputs[-1]
    assert pos.dtype == "int64" and pos.init.dist == "randint" and pos.init.high == "S"
    assert inv.dtype == "float32" and inv.init.dist == "derived" and inv.init.fn == "llama3_inv_freq"
    assert inv.shape == ["HD/2"]
    assert s.entry.allowed_torch == ["float"]
    assert s.entry.constants == ["HQ", "HKV"]
    assert all(s.constants_of(c.dims) == _heads(c.dims) for c in s.shapes.correctness)
    assert s.signature().endswith(f"positions, inv_freq, *, HQ: int, HKV: int) -> ({out.name})")
    assert (s.tolerance.rule, s.tolerance.factor, s.tolerance.floor) == ("coda", 2.0, 1e-6)
    assert s.bench.baselines == ["torch_eager", "torch_compile", "bare_gemm", "quack_library"]
    assert s.bench.bar == {"bare_gemm": 1.05, "quack_library": 1.03}
    assert eval_expr(s.bench.flops, {"M": 3, "K": 5, "HQ": 4, "HKV": 2, "HD": 8}) == 2 * 3 * 64 * 5
    for fn in ("reference", "baseline", "bare_gemm", "quack_library", "llama3_inv_freq"):
        assert callable(getattr(ref, fn)), fn
    bench = s.shapes.benchmark
    assert {c.dims["M"] for c in bench} == {8192, 16384}
    assert {(c.dims["K"], c.dims["HQ"], c.dims["HKV"], c.dims["HD"]) for c in bench} == {
        (2048, 32, 8, 64),
        (4096, 32, 8, 128),
        (8192, 64, 8, 128),
    }
    assert {c.dims["S"] for c in bench} == {8192}
    corr = s.shapes.correctness
    assert {c.dims["HD"] for c in corr} == {64, 128}
    assert any(c.dims["M"] % 128 and c.dims["K"] % 128 for c in corr)
    assert max(c.dims["S"] for c in corr) >= 131072  # long positions: angle precision
    for c in corr + bench:  # TMA: 16-byte rows of bf16 (K and N multiples of 8)
        n = (c.dims["HQ"] + 2 * c.dims["HKV"]) * c.dims["HD"]
        assert c.dims["K"] % 8 == 0 and n % 8 == 0, c


def test_launch_budgets():
    """GEMM (1) + positions.float() (1) + make_interleaved_inv_freq's 9 kernels, for the
    backward too (R^T is applied in the epilogue, not by a negated table). Counted on the
    H200 with the verifier's method (profiler CUDA kernels, memcpys excluded) at every
    shape case (launch census); see the spec comments."""
    budget = {n: _load(n)[0].spec.entry.max_launches for n in NAMES}
    assert budget == {"gemm_rope": 11, "gemm_rmsnorm_rope": 11, "rope_bwd": 11}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_static_accepts_the_host_prep_the_budget_counts(name):
    """The entry takes HQ/HKV keyword-only; positions.float() and quack's table builder
    (negated for the backward) pass the static stage."""
    from coda_agent.verifier.static import check_static

    loaded, _ = _load(name)
    args = ", ".join(t.name for t in loaded.spec.entry.inputs)
    src = (
        "import torch\n"
        "from quack.epilogue.rotary import make_interleaved_inv_freq\n\n\n"
        f"def {name}({args}, *, HQ, HKV):\n"
        "    hd = 2 * inv_freq.shape[0]\n"
        "    pos = positions.float()\n"
        "    freq = -make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)\n"
        "    return pos, freq\n"
    )
    kinds = {f.kind for f in check_static(loaded.spec, src).findings}
    assert not kinds & {"entry-signature", "precision-cast", "torch-math", "torch-api", "banned-attribute"}, kinds
    wrong = src.replace(", *, HQ, HKV)", ")")
    assert "entry-signature" in {f.kind for f in check_static(loaded.spec, wrong).findings}


@pytest.mark.parametrize("name", NAMES)
def test_derived_inv_freq_is_llama3(name):
    loaded, _ = _load(name)
    for i in range(len(loaded.spec.shapes.correctness)):
        dims, inp = _inputs(loaded, i)
        inv = inp["inv_freq"]
        hd = dims["HD"]
        assert inv.shape == (hd // 2,) and inv.dtype == torch.float32
        want = 500000.0 ** (-torch.arange(0, hd, 2, dtype=F64) / hd)
        torch.testing.assert_close(inv.double(), want, rtol=2e-7, atol=0)
        assert inv[0] == 1.0 and inv[-1] < 1e-4
        # every seed gets the same table (it is a function of the dims only)
        assert torch.equal(make_inputs(loaded, dims, 7, device="cpu")["inv_freq"], inv)
        assert 0 <= int(inp["positions"].min()) and int(inp["positions"].max()) < dims["S"]


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("name,case", ALL_CASES)
def test_reference_matches_complex_rotation(name, case):
    loaded, ref = _load(name)
    dims, inp = _inputs(loaded, case)
    x = _f64(inp)
    with torch.no_grad():  # as the verifier calls it (rope_bwd re-enables grad itself)
        out = ref.reference(**x, **_heads(dims))[_out_name(name)]
    want = _complex_rope(_projection(name, x), x["positions"], dims, inverse=name == "rope_bwd")
    assert out.dtype == F64 and out.shape == want.shape
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,case", ALL_CASES)
def test_value_columns_pass_through_bit_exactly(name, case):
    loaded, ref = _load(name)
    dims, inp = _inputs(loaded, case)
    r = _n_rot(dims)
    for x in (inp, upcast(inp), _f64(inp)):
        out = ref.reference(**x, **_heads(dims))[_out_name(name)]
        assert out.dtype == x["w" if name == "rope_bwd" else "w_qkv"].dtype
        assert torch.equal(out[:, r:], _projection(name, x)[:, r:])


def test_rope_bwd_is_the_adjoint_of_gemm_rope():
    """<R u, v> = <u, R^T v>: the backward's rotation is the transpose of the forward's."""
    (_, rf), (bwd, rb) = _load("gemm_rope"), _load("rope_bwd")
    dims, inp = _inputs(bwd, 2)
    x = _f64(inp)
    gen = torch.Generator().manual_seed(5)
    u = torch.randn(dims["M"], dims["K"], dtype=F64, generator=gen)
    v_proj = x["g"] @ x["w"].T
    hk = _heads(dims)
    ru = rf.reference(x=u, w_qkv=x["w"], positions=x["positions"], inv_freq=x["inv_freq"], **hk)["qkv"]
    rtv = rb.reference(**x, **hk)["dqkv"]
    lhs = (ru * v_proj).sum()
    rhs = ((u @ x["w"].T) * rtv).sum()
    assert abs(lhs - rhs) < 1e-9 * (ru.abs() * v_proj.abs()).sum()
    # and the backward undoes the forward: R^T R = I
    w = x["w"]
    fwd_out = rf.reference(x=x["g"], w_qkv=w, positions=x["positions"], inv_freq=x["inv_freq"], **hk)["qkv"]
    eye = torch.eye(w.shape[0], dtype=F64)
    back = rb.reference(g=fwd_out, w=eye, positions=x["positions"], inv_freq=x["inv_freq"], **hk)["dqkv"]
    torch.testing.assert_close(back, x["g"] @ w.T, rtol=1e-10, atol=1e-10)


def test_rope_bwd_matches_the_written_out_inverse():
    """The autograd gradient equals the catalogue's [x cos + y sin, -x sin + y cos]."""
    loaded, ref = _load("rope_bwd")
    dims, inp = _inputs(loaded, 1)
    x = _f64(inp)
    d = x["g"] @ x["w"].T
    r, half = _n_rot(dims), dims["HD"] // 2
    theta = x["positions"].double()[:, None, None] * x["inv_freq"].double()[None, None, :]
    c, s = theta.cos(), theta.sin()
    p = d[:, :r].reshape(d.shape[0], -1, half, 2)
    dx, dy = p[..., 0], p[..., 1]
    want = torch.stack([dx * c + dy * s, -dx * s + dy * c], -1).reshape(d.shape[0], r)
    out = ref.reference(**x, **_heads(dims))["dqkv"]
    torch.testing.assert_close(out[:, :r], want, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_baseline_agrees_with_reference(name):
    loaded, ref = _load(name)
    o = _out_name(name)
    for i in range(len(loaded.spec.shapes.correctness)):
        dims, inp = _inputs(loaded, i, seed=1)
        hk = _heads(dims)
        want, got = ref.reference(**_f64(inp), **hk), ref.baseline(**_f64(inp), **hk)
        assert set(got) == {o}
        # baselines rotate in fp32 as deployed code does: fp32-level agreement
        torch.testing.assert_close(got[o], want[o], rtol=1e-5, atol=1e-5, check_dtype=False)
        # in the inputs' precision both round the same fp32 rotation of the same bf16 GEMM
        lp_want, lp_got = ref.reference(**inp, **hk)[o], ref.baseline(**inp, **hk)[o]
        assert lp_got.dtype == lp_want.dtype == torch.bfloat16
        torch.testing.assert_close(lp_got.float(), lp_want.float(), rtol=1e-2, atol=1e-2)
        assert ref.bare_gemm(**inp, **hk).shape == lp_want.shape


@pytest.mark.parametrize("name", NAMES)
def test_outputs_are_order_one_and_rotated(name):
    loaded, ref = _load(name)
    for i in range(len(loaded.spec.shapes.correctness)):
        dims, inp = _inputs(loaded, i)
        x = _f64(inp)
        out = ref.reference(**x, **_heads(dims))[_out_name(name)]
        assert out.shape == loaded.spec.shape_of(loaded.spec.entry.outputs[0], dims)
        assert torch.isfinite(out).all()
        rms = out.pow(2).mean().sqrt().item()
        assert 0.5 < rms < 3, rms
        assert 0.5 < out.std().item() < 3
        # the rotation is far from the identity (positions spread over [0, S))
        r = _n_rot(dims)
        moved = (out[:, :r] - _projection(name, x)[:, :r]).abs().mean().item()
        assert moved > 0.3, moved


# --------------------------------------------------------------------------- quack_library


@pytest.mark.slow
def test_quack_library_functions_resolve():
    import quack.epilogue.rotary as rotary

    for fn in ("rope_posfreq_epi", "rstd_rope_posfreq_epi", "make_interleaved_inv_freq"):
        assert callable(getattr(rotary, fn)), fn
    for name in NAMES:
        _, ref = _load(name)
        assert callable(ref.quack_library) and callable(ref.quack_freq_table)


def _emulate_posfreq(acc, positions, freq):
    """rope_posfreq_epi's math in float64: angle = pos * (hi + lo) turns per column pair,
    D = (x1 cos - x2 sin, x1 sin + x2 cos)."""
    turns = positions.double()[:, None] * (freq[0::2].double() + freq[1::2].double())[None, :]
    c, s = torch.cos(2 * math.pi * turns), torch.sin(2 * math.pi * turns)
    x1, x2 = acc[:, 0::2], acc[:, 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(acc.shape)


@pytest.mark.parametrize("name,case", ALL_CASES)
def test_quack_library_parameterization_reproduces_reference(name, case):
    loaded, ref = _load(name)
    dims, inp = _inputs(loaded, case)
    x = _f64(inp)
    n, r = (dims["HQ"] + 2 * dims["HKV"]) * dims["HD"], _n_rot(dims)
    freq = ref.quack_freq_table(inp["inv_freq"], dims["HQ"], dims["HKV"])
    assert freq.shape == (n,) and freq.dtype == torch.float32
    assert torch.equal(freq[r:], torch.zeros(n - r))  # V: zero frequency, angle 0
    hi, lo = freq[0:r:2].double(), freq[1:r:2].double()
    assert (lo.abs() <= hi.abs() * 2.0**-23).all()  # a float-float split
    sign = -1.0 if name == "rope_bwd" else 1.0
    per_col = (inp["inv_freq"].double() / (2 * math.pi)).repeat(dims["HQ"] + dims["HKV"])
    torch.testing.assert_close(hi + lo, sign * per_col, rtol=1e-14, atol=0)
    acc = x["a"] @ x["w_qkv"].T * x["rstd"][:, None] if name == "gemm_rmsnorm_rope" else None
    if acc is None:
        acc = _projection(name, x)
    got = _emulate_posfreq(acc, inp["positions"].float(), freq)
    want = _complex_rope(acc, x["positions"], dims, inverse=name == "rope_bwd")
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert torch.equal(got[:, r:], acc[:, r:])

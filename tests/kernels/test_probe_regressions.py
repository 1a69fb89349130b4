"""Numerics of the ops at the edges of their domain: one token row, gates where the kernels'
fast sigmoid flushes, non-finite rows (``benchmarks/probes/op_domain_edges.py`` measures the same
on an H200).

* Deferred-rstd backward at small M (``_rmsnorm.deferred_linear_grads``, shared by
  deferred_rmsnorm_linear / _swiglu / _swiglu_mlp and deferred_rmsnorm_qkv_rope): for one
  upstream gradient it is PyTorch's bf16 autograd arithmetic through the standard
  definition (tested bit for bit). The ops' upstream gradients differ from PyTorch's by
  rounding, so per row drstd's error is a sample of the same size as PyTorch's bf16 error
  in that row, not bounded by it. "Within twice PyTorch's bf16 error" is a criterion over
  many rows: on a single row an equally valid PyTorch formulation of the same math fails
  it on about a third of the rows (tested), so small M is judged pooled over >= 32 rows.
* Fast sigmoid: silu and its derivative are 0 for gates below ``_swiglu.FLUSHED_GATE``
  (-87.34) instead of values below 1.03e-36 in magnitude; the verifier's numerics
  (``coda_agent.verifier.stages.numerics.judge``) accept that and reject a real error there.
* Non-finite rows: a NaN / Inf in one row of an input leaves every output and gradient
  non-finite exactly where PyTorch's standard computation is (residual_rmsnorm's eps
  re-finalization included).

On the CPU, models of the kernels' arithmetic stand in for them (fp32 epilogue, each output
rounded once to bf16, quack's fast sigmoid); ``gpu`` tests run the accepted kernels.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from glue_helpers import use_standins
from test_rmsnorm_ops import (
    torch_deferred_linear,
    torch_deferred_swiglu,
    torch_deferred_swiglu_mlp,
    torch_residual_rmsnorm,
)

import coda_agent.kernels as K
from coda_agent.kernels import _swiglu
from coda_agent.verifier.spec import ToleranceSpec
from coda_agent.verifier.stages.numerics import judge

BF16, FP32 = torch.bfloat16, torch.float32
LOG2E = math.log2(math.e)
FP32_TINY = 2.0**-126  # smallest normal fp32


# --------------------------------------------------------------------------- models of the kernels


def fast_sigmoid(g: torch.Tensor) -> torch.Tensor:
    """quack.activation.sigmoid on fp32 values: ``rcp.approx.ftz(ex2.approx(-g log2 e) + 1)``;
    the approximations' last-ulp errors left out, the flush of subnormal results kept."""
    s = 1.0 / (torch.exp2(-g * LOG2E) + 1.0)
    return torch.where(s < FP32_TINY, torch.zeros_like(s), s)


def model_gemm_rmsnorm(a, rstd, w):
    return (rstd[:, None] * (a.float() @ w.float().T)).to(a.dtype)


def model_gemm_rmsnorm_swiglu(normed_w, rstd, w1):
    acc = rstd[:, None] * (normed_w.float() @ w1.float().T)
    g, u = acc[:, 0::2], acc[:, 1::2]
    return acc.to(normed_w.dtype), (g * fast_sigmoid(g) * u).to(normed_w.dtype)


def model_swiglu_fwd(x, w1):
    return model_gemm_rmsnorm_swiglu(x, torch.ones(x.shape[0]), w1)


def model_swiglu_bwd(dout, w_down, preact):
    """The swiglu_bwd kernel's epilogue (generated_kernels/swiglu_bwd/kernel.py) in fp32."""
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = fast_sigmoid(g)
    silu = g * s
    dsilu = s + silu * (1.0 - s)
    dpre = torch.stack((dpost * u * dsilu, dpost * silu), dim=-1).flatten(1)
    return dpre.to(preact.dtype), (silu * u).to(preact.dtype)


RESIDUAL_TILE_N = 256  # generated_kernels/gemm_residual_partial_rms/kernel.py's CFG.tile_n


def model_gemm_residual_partial_rms(x, w_o, residual, gamma, tile_n=RESIDUAL_TILE_N):
    """The kernel's arithmetic, ragged last N tile included: TMA zero-fills the rows of w_o
    (B) and the columns of residual (C) past N, the accumulator's lanes there are x @ 0
    (``Inf * 0 = NaN`` in a row of x holding an Inf, elementwise products here, as the tensor
    cores make them), and the partial sums of squares run over every lane of the tile."""
    n = w_o.shape[0]
    pad = -(-n // tile_n) * tile_n - n
    wp = F.pad(w_o.float(), (0, 0, 0, pad))
    y = (x.float()[:, None, :] * wp[None, :, :]).sum(-1) + F.pad(residual.float(), (0, pad))
    rstd = torch.rsqrt((y * (1.0 / n) * y).sum(dim=-1) + 1e-6)
    y = y[:, :n]
    return y.to(x.dtype), (y * gamma.float()).to(x.dtype), rstd


MODELS = {
    "gemm_rmsnorm": model_gemm_rmsnorm,
    "gemm_rmsnorm_swiglu": model_gemm_rmsnorm_swiglu,
    "swiglu_fwd": model_swiglu_fwd,
    "swiglu_bwd": model_swiglu_bwd,
    "gemm_residual_partial_rms": model_gemm_residual_partial_rms,
}


@pytest.fixture
def kernel_models(monkeypatch):
    return use_standins(monkeypatch, MODELS, check_layout=True)


# --------------------------------------------------------------------------- shared: three ways to compute


def torch_deferred_swiglu_alt(normed_w, rstd, w1):
    """The same math as torch_deferred_swiglu in another valid bf16 PyTorch form (the row
    scale on the GEMM's output, as the kernel applies it): a control for the criterion."""
    pre = ((normed_w @ w1.T).float() * rstd.float()[:, None]).to(normed_w.dtype)
    return pre, F.silu(pre[:, 0::2]) * pre[:, 1::2]


def torch_deferred_swiglu_mlp_alt(normed_w, rstd, w1, w_down):
    return torch_deferred_swiglu_alt(normed_w, rstd, w1)[1] @ w_down.T


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _run(fn, args, diff, ups, cast=lambda a: a):
    xs = [cast(a).detach().clone().requires_grad_() if i in diff else cast(a) for i, a in enumerate(args)]
    outs = _tuple(fn(*xs))
    grads = torch.autograd.grad(outs, [xs[i] for i in diff], [u.to(o.dtype) for u, o in zip(ups, outs, strict=False)])
    return [t.detach() for t in (*outs, *grads)]


def errors(op, torch_fn, args, diff, *, seed=0, control=None):
    """Max |x - fp32 reference| of every output and gradient of ``op``, of ``torch_fn`` run
    in the inputs' dtype (PyTorch's bf16 error: the budget's base) and of ``control`` (another
    bf16 PyTorch formulation) when given, with the same random upstream gradients:
    ``{"op": [...], "torch": [...], "control": [...]}``, each a list of floats."""
    g = torch.Generator().manual_seed(seed)
    outs = _tuple(op(*args))
    ups = [torch.randn(o.shape, generator=g).to(device=o.device, dtype=o.dtype) for o in outs]
    f32 = lambda a: a.float() if a.is_floating_point() else a  # noqa: E731
    ref = _run(torch_fn, args, diff, ups, f32)
    res = {"op": _run(op, args, diff, ups), "torch": _run(torch_fn, args, diff, ups)}
    if control is not None:
        res["control"] = _run(control, args, diff, ups)
    return {k: [float((a.float() - r).abs().max()) for a, r in zip(v, ref, strict=False)] for k, v in res.items()}


def deferred_args(device, M, K, N, seed, mlp=False):
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(M, K, generator=g, device=device).to(BF16)
    rstd = torch.rand(M, generator=g, device=device) * 1.5 + 0.5
    w = (torch.randn(N, K, generator=g, device=device) * K**-0.5).to(BF16)
    if not mlp:
        return [a, rstd, w]
    return [a, rstd, w, (torch.randn(K, N // 2, generator=g, device=device) * (N // 2) ** -0.5).to(BF16)]


# name -> (op, standard definition, control, mlp inputs, output names (outputs, then gradients))
DEFERRED = {
    "deferred_rmsnorm_linear": (
        K.deferred_rmsnorm_linear,
        torch_deferred_linear,
        None,
        False,
        ("out", "da", "drstd", "dw"),
    ),
    "deferred_rmsnorm_swiglu": (
        K.deferred_rmsnorm_swiglu,
        torch_deferred_swiglu,
        torch_deferred_swiglu_alt,
        False,
        ("preact", "postact", "dnormed_w", "drstd", "dw1"),
    ),
    "deferred_rmsnorm_swiglu_mlp": (
        K.deferred_rmsnorm_swiglu_mlp,
        torch_deferred_swiglu_mlp,
        torch_deferred_swiglu_mlp_alt,
        True,
        ("out", "dnormed_w", "drstd", "dw1", "dw_down"),
    ),
}


def pooled(name, device, M, calls, K, N):
    """errors() of ``calls`` independent problems of M rows; per tensor the list over calls."""
    op, std, control, mlp, names = DEFERRED[name]
    runs = [
        errors(op, std, deferred_args(device, M, K, N, seed, mlp), range(4 if mlp else 3), seed=seed, control=control)
        for seed in range(calls)
    ]
    return names, {k: list(zip(*(r[k] for r in runs), strict=False)) for k in runs[0]}


def assert_pooled_budget(names, errs):
    """Over all calls: max op error <= 2 * max PyTorch bf16 error + 1e-6, per tensor."""
    for name, op_e, torch_e in zip(names, errs["op"], errs["torch"], strict=False):
        assert max(op_e) <= 2 * max(torch_e) + 1e-6, (name, max(op_e), max(torch_e))


# --------------------------------------------------------------------------- 1. deferred backward at small M (CPU)


def test_deferred_backward_is_pytorchs_bf16_arithmetic_cpu(kernel_models):
    """For one dy, deferred_rmsnorm_linear's backward is PyTorch's bf16 autograd through the
    standard definition bit for bit: the same dgrad GEMM (dz in bf16), the same fp32 row
    scale and drstd reduction, the same wgrad GEMM."""
    a, rstd, w = deferred_args("cpu", 7, 64, 48, seed=1)
    dy = torch.randn(7, 48, generator=torch.Generator().manual_seed(2)).to(BF16)
    got = _run(K.deferred_rmsnorm_linear, [a, rstd, w], (0, 1, 2), [dy])[1:]
    want = _run(torch_deferred_linear, [a, rstd, w], (0, 1, 2), [dy])[1:]
    for name, g, t in zip(("da", "drstd", "dw"), got, want, strict=False):
        assert g.dtype == t.dtype and torch.equal(g, t), name
    assert kernel_models["gemm_rmsnorm"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEFERRED))
def test_single_rows_pooled_within_budget_cpu(name, kernel_models):
    """M = 1, 40 independent calls: pooled over them every output and gradient is within
    twice PyTorch's bf16 error (the budget over many rows)."""
    names, errs = pooled(name, "cpu", M=1, calls=40, K=128, N=256)
    assert_pooled_budget(names, errs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deferred_rmsnorm_swiglu", "deferred_rmsnorm_swiglu_mlp"])
def test_single_row_budget_is_a_random_comparison_cpu(name, kernel_models):
    """Judged one row at a time, "drstd within twice PyTorch's bf16 error of that row" fails
    on a fraction of rows for the op and for the control (the same math in another valid
    bf16 PyTorch form), and no more often for the op: the single-row budget compares two
    random roundings, it does not tell a correct backward from a wrong one."""
    names, errs = pooled(name, "cpu", M=1, calls=40, K=128, N=256)
    i = names.index("drstd")
    over = {k: sum(e > 2 * t for e, t in zip(errs[k][i], errs["torch"][i], strict=False)) for k in ("op", "control")}
    assert over["control"] >= 4, over  # about a third of the rows
    assert over["op"] <= over["control"], over


# --------------------------------------------------------------------------- 2. fast sigmoid flush (CPU)


def test_fast_sigmoid_model_flushes_below_the_documented_gate():
    g = torch.tensor([-200.0, -90.0, -88.5, -87.4, -87.3, -80.0, 0.0, 90.0])
    s = fast_sigmoid(g)
    flushed = g < _swiglu.FLUSHED_GATE
    assert (s[flushed] == 0).all() and (s[~flushed] > 0).all()
    assert (torch.sigmoid(g.double())[flushed] < FP32_TINY).all()
    assert ((g.double() * torch.sigmoid(g.double())).abs()[flushed] < 1.03e-36).all()
    assert (F.silu(g)[g < -88.72] == 0).all()  # PyTorch's fp32 silu: exp(-g) overflows there


def _postact_case(rows=4, width=64, seed=0):
    """gate, up (fp32 holding bf16 values) of O(1) rows with gates of -88.5 at three places."""
    gen = torch.Generator().manual_seed(seed)
    gate = torch.randn(rows, width, generator=gen).to(BF16).float()
    up = torch.randn(rows, width, generator=gen).to(BF16).float()
    gate[:, [3, 17, 40]] = -88.5
    return gate, up


def test_flushed_postact_is_within_tolerance_and_a_wrong_value_is_not_cpu():
    gate, up = _postact_case()
    ref32 = F.silu(gate) * up  # ~ -3e-37 * up at the -88.5 gates
    ref_lowp = F.silu(gate.to(BF16)) * up.to(BF16)
    out = (gate * fast_sigmoid(gate) * up).to(BF16)
    at = gate == -88.5
    assert (out[at] == 0).all() and (ref32[at] != 0).all() and (ref32[at].abs() < 1e-35).all()
    assert judge(out, ref32, ref_lowp, ToleranceSpec(), "bfloat16", "bfloat16")["ok"]
    for wrong_value in (0.25, -1.0):
        wrong = out.clone()
        wrong[0, 3] = wrong_value
        verdict = judge(wrong, ref32, ref_lowp, ToleranceSpec(), "bfloat16", "bfloat16")
        assert not verdict["ok"] and "elementwise" in verdict["failed"], (wrong_value, verdict["failed"])


def test_fast_sigmoid_forward_and_backward_within_tolerance_for_all_finite_gates_cpu():
    """postact, the gate and the up gradient of the kernels' epilogues (fast sigmoid model)
    over gates from -1000 to 1000 (each row also holds O(1) gates) pass judge against
    PyTorch; so does a row whose every gate is flushed (its exact values are ~1e-37)."""
    gen = torch.Generator().manual_seed(3)
    sweep = torch.cat([torch.linspace(-1000, 1000, 101), torch.tensor([-90.0, -88.75, -88.5, -87.4, -87.3, 90.0])])
    gate = torch.randn(sweep.numel(), 48, generator=gen)
    gate[:, 0] = sweep
    gate = torch.cat([gate, torch.full((1, 48), -88.5)]).to(BF16).float()
    up = torch.randn(gate.shape, generator=gen).to(BF16).float()
    dpost = torch.randn(gate.shape, generator=gen).to(BF16).float()

    def epilogue(g, u, d, sigmoid):
        s = sigmoid(g)
        silu = g * s
        dsilu = s + silu * (1.0 - s)
        return silu * u, d * u * dsilu, d * silu

    def standard(g, u, d):  # PyTorch's: silu, autograd's d silu
        gg = g.detach().requires_grad_()
        silu = F.silu(gg)
        (dsilu,) = torch.autograd.grad(silu, gg, torch.ones_like(silu))
        return silu * u, d * u * dsilu, d * silu.detach()

    got = [t.to(BF16) for t in epilogue(gate, up, dpost, fast_sigmoid)]
    ref32 = standard(gate, up, dpost)
    low = standard(gate.to(BF16), up.to(BF16), dpost.to(BF16))
    for name, o, r, lo in zip(("postact", "dgate", "dup"), got, ref32, low, strict=False):
        verdict = judge(o, r, lo, ToleranceSpec(), "bfloat16", "bfloat16")
        assert verdict["ok"], (name, verdict["failed"], verdict["rules"])
    assert (got[0][gate < _swiglu.FLUSHED_GATE] == 0).all()


# --------------------------------------------------------------------------- 3. non-finite rows (CPU)


def residual_case(device, scenario, M=24, K=32, N=48, row=9, seed=0):
    """residual_rmsnorm inputs with one bad row: ``x_inf`` (one Inf in x), ``residual_inf``,
    ``residual_nan``, ``zero`` (x and residual of the row all 0)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device).to(BF16)
    w_o = (torch.randn(N, K, generator=g, device=device) * K**-0.5).to(BF16)
    residual = torch.randn(M, N, generator=g, device=device).to(BF16)
    gamma = (torch.rand(N, generator=g, device=device) + 0.5).to(BF16)
    if scenario == "x_inf":
        x[row, 5] = float("inf")
    elif scenario == "residual_inf":
        residual[row, 7] = float("-inf")
    elif scenario == "residual_nan":
        residual[row, 7] = float("nan")
    elif scenario == "zero":
        x[row] = 0
        residual[row] = 0
    else:
        raise ValueError(scenario)
    return [x, w_o, residual, gamma]


SCENARIOS = ("x_inf", "residual_inf", "residual_nan", "zero")
RESIDUAL_NAMES = ("resid_out", "normed_w", "rstd", "dx", "dw_o", "dresidual", "dgamma")


def nonfinite_mismatches(op, torch_fn, args, diff, names, seed=0):
    """Names of the outputs / gradients whose non-finite elements differ from PyTorch's
    standard computation in the inputs' dtype (same upstream gradients)."""
    g = torch.Generator().manual_seed(seed)
    outs = _tuple(op(*args))
    ups = [torch.randn(o.shape, generator=g).to(device=o.device, dtype=o.dtype) for o in outs]
    got, want = _run(op, args, diff, ups), _run(torch_fn, args, diff, ups)
    return [n for n, a, b in zip(names, got, want, strict=False) if not torch.equal(a.isfinite(), b.isfinite())]


@pytest.mark.parametrize("eps", [1e-6, 1e-5])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_residual_rmsnorm_keeps_nonfinite_rows_cpu(scenario, eps, kernel_models):
    """Every output and gradient of residual_rmsnorm is non-finite exactly where PyTorch's
    standard computation is, also with eps re-finalized (rstd = 0 of an infinite row keeps a
    finite derivative)."""
    op = lambda *a: K.residual_rmsnorm(*a, eps=eps)  # noqa: E731
    std = lambda *a: torch_residual_rmsnorm(*a, eps=eps)  # noqa: E731
    args = residual_case("cpu", scenario)
    assert nonfinite_mismatches(op, std, args, range(4), RESIDUAL_NAMES) == []


def test_an_inf_in_x_at_a_ragged_n_gives_rstd_0_as_pytorch_cpu(kernel_models):
    """The kernel's rstd of a row of x with an Inf is NaN at a ragged N (the tile's
    out-of-bounds lanes are Inf * 0); the glue gives PyTorch's 0, and a row whose y holds a
    NaN keeps its NaN."""
    args = residual_case("cpu", "x_inf")  # N = 48: one ragged tile
    _, _, raw = model_gemm_residual_partial_rms(*args)
    assert raw[9].isnan()  # what the kernel itself returns
    _, _, rstd = K.residual_rmsnorm(*args)
    _, _, want = torch_residual_rmsnorm(*args)
    assert want[9] == 0 and rstd[9] == 0
    assert torch.equal(rstd.isfinite(), want.isfinite())
    nan_args = residual_case("cpu", "residual_nan")
    assert K.residual_rmsnorm(*nan_args)[2][9].isnan() and torch_residual_rmsnorm(*nan_args)[2][9].isnan()
    # at a multiple of the tile every lane is in bounds: the kernel itself gives 0
    x, w_o, residual, gamma = residual_case("cpu", "x_inf", N=RESIDUAL_TILE_N)
    assert K.residual_rmsnorm(x, w_o, residual, gamma)[2][9] == 0


@pytest.mark.parametrize("where", ["a_inf", "a_nan", "rstd_zero_a_inf"])
@pytest.mark.parametrize("name", list(DEFERRED))
def test_deferred_ops_keep_nonfinite_rows_cpu(name, where, kernel_models):
    """A NaN / Inf in one row of the deferred ops' input (rstd = 0 with it: what
    residual_rmsnorm gives an infinite row): outputs and gradients non-finite exactly where
    PyTorch's standard computation is."""
    op, std, _, mlp, names = DEFERRED[name]
    args = deferred_args("cpu", 12, 32, 48, seed=4, mlp=mlp)
    args[0][5, 3] = float("nan") if where == "a_nan" else float("inf")
    if where == "rstd_zero_a_inf":
        args[1][5] = 0.0
    assert nonfinite_mismatches(op, std, args, range(4 if mlp else 3), names) == []


# --------------------------------------------------------------------------- GPU


def _need(*kernels):
    missing = set(kernels) - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 7])
@pytest.mark.parametrize("name", list(DEFERRED))
def test_small_m_pooled_within_budget_on_gpu(name, M):
    """The real kernels at M = 1, 2, 7 (ragged tiles), ceil(32 / M) independent calls:
    pooled over them every output and gradient within twice PyTorch's bf16 error."""
    _need(
        "gemm_rmsnorm" if name == "deferred_rmsnorm_linear" else "gemm_rmsnorm_swiglu",
        *(["swiglu_bwd"] if name.endswith("_mlp") else []),
    )
    names, errs = pooled(name, "cuda", M=M, calls=-(-32 // M), K=1024, N=2048)
    assert_pooled_budget(names, errs)


def _gate_rows(device, M, K, gates):
    """x (M, K) with column 0 = 1 and w1 (2I, K) whose gate rows 2j (j < len(gates)) are
    ``gates[j] * e_0``: preact's gate j is exactly gates[j] in every row; the other gate/up
    rows random (O(1) preact)."""
    g = torch.Generator(device=device).manual_seed(5)
    x = torch.randn(M, K, generator=g, device=device)
    x[:, 0] = 1.0
    I = 128
    w1 = torch.randn(2 * I, K, generator=g, device=device) * K**-0.5
    for j, v in enumerate(gates):
        w1[2 * j] = 0.0
        w1[2 * j, 0] = v
    return x.to(BF16), w1.to(BF16)


GATES = (-88.5, -88.5, -90.0, 90.0, -87.0, -87.5)  # bf16-exact; -87.5 < FLUSHED_GATE < -87.0


def _judge_ok(out, ref32, low):
    v = judge(out, ref32, low, ToleranceSpec(), "bfloat16", "bfloat16")
    return v["ok"], v["failed"]


@pytest.mark.gpu
def test_fast_sigmoid_gates_within_tolerance_on_gpu():
    """swiglu_fwd, gemm_rmsnorm_swiglu and swiglu_bwd at gates -88.5, -90, 90, -87.0, -87.5: postact
    and dpreact pass judge against PyTorch, and are 0 exactly where the gate is below
    FLUSHED_GATE (the documented behaviour)."""
    _need("swiglu_fwd", "swiglu_bwd", "gemm_rmsnorm_swiglu")
    x, w1 = _gate_rows("cuda", 64, 256, GATES)
    ones = torch.ones(x.shape[0], device="cuda")
    pre32, pre_low = x.float() @ w1.float().T, x @ w1.T  # the fp32 reference / PyTorch's bf16
    ref32 = F.silu(pre32[:, 0::2]) * pre32[:, 1::2]
    low = F.silu(pre_low[:, 0::2]) * pre_low[:, 1::2]
    for kernel, (preact, postact) in (
        ("swiglu_fwd", K.swiglu_fwd_op(x, w1)),
        ("gemm_rmsnorm_swiglu", K.gemm_rmsnorm_swiglu_op(x, ones, w1)),
    ):
        gate = preact[:, 0::2]
        assert (gate[:, : len(GATES)] == torch.tensor(GATES, device="cuda").to(BF16)).all(), kernel
        ok, failed = _judge_ok(postact, ref32, low)
        assert ok, (kernel, failed)
        assert (postact[gate.float() < _swiglu.FLUSHED_GATE] == 0).all(), kernel
    g = torch.Generator(device="cuda").manual_seed(6)
    dout = torch.randn(64, 256, generator=g, device="cuda").to(BF16)
    w_down = (torch.randn(256, 128, generator=g, device="cuda") / 16).to(BF16)
    dpreact, postact = K.swiglu_bwd_op(dout, w_down, preact)

    def standard(dout, w_down, preact):  # PyTorch: exact sigmoid, autograd's dSwiGLU
        pre = preact.detach().requires_grad_()
        post = F.silu(pre[:, 0::2]) * pre[:, 1::2]
        dpost = dout @ w_down
        (dpre,) = torch.autograd.grad(post, pre, dpost.to(post.dtype))
        return dpre, post.detach()

    r32 = standard(dout.float(), w_down.float(), preact.float())
    low = standard(dout, w_down, preact)
    for name, o, r, lo in zip(("dpreact", "postact"), (dpreact, postact), r32, low, strict=False):
        ok, failed = _judge_ok(o, r, lo)
        assert ok, (name, failed)
    flushed = (preact.float()[:, 0::2] < _swiglu.FLUSHED_GATE).repeat_interleave(2, dim=1)
    assert (dpreact[flushed] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
@pytest.mark.parametrize("row", [0, 8, 130, 332])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_residual_rmsnorm_keeps_nonfinite_rows_on_gpu(scenario, row, eps):
    """The gemm_residual_partial_rms kernel and the glue at M = 333, llama-like N: every
    output and gradient non-finite exactly where PyTorch's standard computation in bf16 is."""
    _need("gemm_residual_partial_rms")
    op = lambda *a: K.residual_rmsnorm(*a, eps=eps)  # noqa: E731
    std = lambda *a: torch_residual_rmsnorm(*a, eps=eps)  # noqa: E731
    args = residual_case("cuda", scenario, M=333, K=512, N=2048, row=row)
    assert nonfinite_mismatches(op, std, args, range(4), RESIDUAL_NAMES) == []


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_residual_rmsnorm_keeps_nonfinite_rows_at_a_ragged_n_on_gpu(scenario):
    """The same at an N that is not a multiple of the kernel's N tile (2040 = 7 x 256 + 248):
    an Inf in x makes the kernel's out-of-bounds lanes NaN; rstd is 0 there, as PyTorch's."""
    _need("gemm_residual_partial_rms")
    args = residual_case("cuda", scenario, M=333, K=512, N=2040, row=130)
    assert nonfinite_mismatches(K.residual_rmsnorm, torch_residual_rmsnorm, args, range(4), RESIDUAL_NAMES) == []
    if scenario == "x_inf":
        assert K.residual_rmsnorm(*args)[2][130].item() == 0.0

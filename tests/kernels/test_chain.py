"""The chained Llama layer (coda_agent.kernels._chain, benchmarks/llama_layer.py's
``chained_stack``) against the standard layer: outputs and the gradients of x and of every
weight and norm weight, one layer and stacks (normed_w / rstd handed from layer to layer).

On the CPU the specs' PyTorch functions stand in for the kernels (``use_standins`` also
switches the CUDA device check off): the baselines in fp32 (the layer against the standard
one in fp32, rounding-level agreement) and the exact references in float64 (agreement to
float64 rounding). rms_bwd's stand-in is its spec's epilogue formula, which reads the
precomputed zdz (its baseline recomputes the correction and would hide a wrong zdz). On an
H200 the real kernels run (``gpu``), within twice the standard bf16 layer's error against fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glue_helpers import MODES, check_on_gpu, compiled_for, entry, module_from_file, reference_module, use_standins
from test_rmsnorm_ops import standins as rms_standins
from test_rope_ops import standins as rope_standins

import coda_agent.kernels as K
from coda_agent.kernels import _chain

ROOT = Path(__file__).resolve().parents[2]
L = module_from_file(ROOT / "benchmarks" / "llama_layer.py", "coda_llama_layer_chain")

TINY = L.LayerShape("tiny", D=16, I=24, HQ=2, HKV=1, HD=8)
RAGGED = L.LayerShape("ragged", D=264, I=200, HQ=4, HKV=1, HD=64)  # the specs' ragged dims; HQ * HD != D
CHAINED_KERNELS = ("gemm_rmsnorm_rope", "gemm_residual_partial_rms", "gemm_rmsnorm_swiglu", "rms_bwd", "swiglu_bwd_rms")


def swiglu_bwd_rms_standin(kind: str):
    """The swiglu_bwd_rms spec as a kernel entry: ``baseline`` (zdz in fp32) or, for
    float64, the baseline's dpreact / postact (exact formulas) with zdz by the spec's
    formula in the inputs' precision (the reference's zdz needs autograd, which a custom
    op's body does not record)."""
    ref = reference_module("swiglu_bwd_rms")
    if kind == "baseline":
        return entry(ref.baseline, ["dout", "w_down", "preact"], ["dpreact", "postact", "zdz"])

    def swiglu_bwd_rms(dout, w_down, preact):
        base = ref.baseline(dout=dout, w_down=w_down, preact=preact)
        sd = torch.promote_types(preact.dtype, torch.float32)
        zdz = (base["dpreact"].to(sd) * preact.to(sd)).sum(dim=-1) / dout.shape[-1]
        return base["dpreact"], base["postact"], zdz

    return swiglu_bwd_rms


def standins(kind: str) -> dict:
    return {
        **rms_standins(kind, rms_bwd="spec_math"),
        **rope_standins(kind),
        "swiglu_bwd_rms": swiglu_bwd_rms_standin(kind),
    }


def layer_case(shape, M, S, dtype, layers=1, seed=0):
    """(args = [x, *weights per layer], kw for L.layer_fn, dy)."""
    args = L.make_inputs(shape, M, device="cpu", dtype=dtype, seed=seed)
    for i in range(1, layers):
        args += L.make_inputs(shape, M, device="cpu", dtype=dtype, seed=seed + 10 * i)[1:]
    positions, inv_freq = L.rope_tables(M, S, shape.HD, "cpu")
    kw = dict(positions=positions, inv_freq=inv_freq.to(dtype), S=S, shape=shape)
    dy = torch.randn(M, shape.D, generator=torch.Generator().manual_seed(seed + 3), dtype=dtype)
    return args, kw, dy


def grads(fn, args, dy):
    xs = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*xs)
    return (out, *torch.autograd.grad(out, xs, dy))


def names(layers):
    return ("out", "dx", *(f"d{p}[{i}]" for i in range(layers) for p in L.PARAMS))


def assert_layers_match(got, want, layers, rtol):
    """Per tensor: max |got - want| <= rtol * (max |want| + 1e-3)."""
    for name, g, w in zip(names(layers), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        err, scale = (g - w).abs().max().item(), w.abs().max().item()
        assert err <= rtol * (scale + 1e-3), f"{name}: max err {err:.3e}, max |want| {scale:.3e}"


# --------------------------------------------------------------------------- CPU: one layer, stacks

CPU_CASES = {  # name: (shape, M, S, dtype, stand-in kind, rtol); measured worst: 1e-6 (fp32), 3e-15 (float64)
    "tiny-fp32": (TINY, 12, 6, torch.float32, "baseline", 1e-5),
    "tiny-M1-fp32": (TINY, 1, 1, torch.float32, "baseline", 1e-5),
    "ragged-fp32": (RAGGED, 333, 111, torch.float32, "baseline", 1e-5),
    "ragged-M1-fp32": (RAGGED, 1, 1, torch.float32, "baseline", 1e-5),
    "tiny-float64": (TINY, 12, 6, torch.float64, "reference", 1e-12),
    "tiny-M1-float64": (TINY, 1, 1, torch.float64, "reference", 1e-12),
}


@pytest.mark.parametrize(
    ("case", "layers"), [(c, n) for c in CPU_CASES for n in (1, 3) if n == 1 or CPU_CASES[c][0] is TINY]
)
@pytest.mark.slow
def test_chained_layers_are_the_standard_layers_cpu(case, layers, monkeypatch):
    """Outputs and every gradient (x; g1, w_qkv, w_o, g2, w1, w_down of each layer) equal the
    standard layers'; each layer runs each chained kernel once per pass (rms_bwd twice, the
    down projection through gemm_residual_partial_rms except in the last layer) and no
    standalone norm backward kernel."""
    shape, M, S, dtype, kind, rtol = CPU_CASES[case]
    calls = use_standins(monkeypatch, standins(kind))
    args, kw, dy = layer_case(shape, M, S, dtype, layers)
    want = grads(L.layer_fn("standard", **kw), args, dy)
    got = grads(L.layer_fn("chained", **kw), args, dy)
    assert_layers_match(got, want, layers, rtol)
    assert {k: v for k, v in calls.items() if v} == {
        "gemm_rmsnorm_rope": layers,
        "gemm_residual_partial_rms": 2 * layers - 1,
        "gemm_rmsnorm_swiglu": layers,
        "swiglu_bwd_rms": layers,
        "rms_bwd": 2 * layers,
    }


def test_an_inconsistent_hand_off_is_caught_cpu(monkeypatch):
    """The comparison sees the backward's side of a hand-off: layer 0 hands on normed_w made
    with 1.5 * (layer 1's g1) while layer 1's norm backward uses g1 itself. The forward is
    the standard stack's with 1.5 * g1 there; its gradients are not."""
    use_standins(monkeypatch, standins("reference"))
    args, kw, dy = layer_case(TINY, 12, 6, torch.float64, layers=2)
    heads = dict(n_q_heads=TINY.HQ, n_kv_heads=TINY.HKV, head_dim=TINY.HD)
    more = dict(positions=kw["positions"], inv_freq=kw["inv_freq"], seq_len=kw["S"], eps=L.EPS, **heads)

    def wrong(x, *ws):
        normed, rstd = K.chain_start(x, ws[0], eps=L.EPS)
        x3, n3, r3 = K.chained_layer(x, normed, rstd, *ws[:6], ws[6] * 1.5, **more)
        return K.chained_layer(x3, n3, r3, *ws[6:], None, **more)[0]

    def standard(x, *ws):
        return L.layer_fn("standard", **kw)(x, *ws[:6], ws[6] * 1.5, *ws[7:])

    got, want = grads(wrong, args, dy), grads(standard, args, dy)
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-11)
    assert not torch.allclose(got[1], want[1], rtol=1e-3)  # dx


def _one_layer(x, ws, kw, *, port: bool, cut_residual: bool = False):
    """One chained layer wired by hand: with or without the residual-gradient port;
    ``cut_residual``: the out-projection gets a detached x and no port (x's residual
    gradient lost: a wrong wiring)."""
    g1, w_qkv, w_o, g2, w1, w_down = ws
    s = kw["shape"]
    heads = dict(n_q_heads=s.HQ, n_kv_heads=s.HKV, head_dim=s.HD)
    normed, rstd = K.chain_start(x, g1, eps=L.EPS)
    qkv, p = K.chained_qkv_rope(x, normed, rstd, g1, w_qkv, kw["positions"], kw["inv_freq"], **heads)
    attn = K.causal_gqa_attention(qkv, seq_len=kw["S"], **heads)
    resid = x.detach() if cut_residual else x
    x2, n2, r2 = K.chained_out_proj(attn, w_o, resid, g2, p if port else None, eps=L.EPS)
    assert not (n2.requires_grad or r2.requires_grad) and x2.requires_grad and p.requires_grad
    return K.chained_mlp(x2, n2, r2, g2, w1, w_down, eps=L.EPS)[0]


@pytest.mark.parametrize("port", [True, False], ids=["port", "no-port"])
def test_residual_gradient_with_and_without_the_port_cpu(port, monkeypatch):
    """x's residual gradient reaches x through the port (rms_bwd's dresid) or, without it,
    through autograd's sum; cutting it (a wrong wiring) changes dx and nothing else."""
    use_standins(monkeypatch, standins("reference"))
    args, kw, dy = layer_case(TINY, 12, 6, torch.float64)
    want = grads(L.layer_fn("standard", **kw), args, dy)
    got = grads(lambda x, *ws: _one_layer(x, ws, kw, port=port), args, dy)
    assert_layers_match(got, want, 1, 1e-12)
    cut = grads(lambda x, *ws: _one_layer(x, ws, kw, port=False, cut_residual=True), args, dy)
    assert not torch.allclose(cut[1], want[1], rtol=1e-3)
    assert_layers_match((cut[0], want[1], *cut[2:]), want, 1, 1e-12)


def test_hand_offs_are_not_differentiable_cpu(monkeypatch):
    """normed_w / rstd from chain_start and chained_mlp require no grad; x3 does. Feeding a
    differentiable hand-off (computed with autograd from x and g1) changes no gradient: the
    op's norm backward is the only path from normed_w / rstd to x and g1."""
    use_standins(monkeypatch, standins("reference"))
    args, kw, dy = layer_case(TINY, 12, 6, torch.float64, layers=2)
    x = args[0].clone().requires_grad_()
    ws = [w.clone().requires_grad_() for w in args[1:]]
    s = TINY
    heads = dict(n_q_heads=s.HQ, n_kv_heads=s.HKV, head_dim=s.HD)
    normed, rstd = K.chain_start(x, ws[0], eps=L.EPS)
    assert not (normed.requires_grad or rstd.requires_grad)
    x3, n3, r3 = K.chained_layer(
        x,
        normed,
        rstd,
        *ws[:6],
        ws[6],
        positions=kw["positions"],
        inv_freq=kw["inv_freq"],
        seq_len=kw["S"],
        eps=L.EPS,
        **heads,
    )
    assert x3.requires_grad and not (n3.requires_grad or r3.requires_grad)
    want = torch.autograd.grad(x3, [x, *ws[:6]], dy)
    normed_d = x * ws[0]  # differentiable hand-off
    rstd_d = torch.rsqrt(x.pow(2).mean(-1) + L.EPS)
    x3_d, _, _ = K.chained_layer(
        x,
        normed_d,
        rstd_d,
        *ws[:6],
        ws[6],
        positions=kw["positions"],
        inv_freq=kw["inv_freq"],
        seq_len=kw["S"],
        eps=L.EPS,
        **heads,
    )
    for g, w in zip(torch.autograd.grad(x3_d, [x, *ws[:6]], dy), want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)


def test_frozen_weights_cpu(monkeypatch):
    """With every weight frozen the gradient of x is unchanged (the wgrad GEMMs are skipped)."""
    use_standins(monkeypatch, standins("reference"))
    args, kw, dy = layer_case(TINY, 12, 6, torch.float64, layers=2)
    x = args[0].clone().requires_grad_()
    (dx,) = torch.autograd.grad(L.chained_stack(x, *args[1:], **kw), x, dy)
    want = grads(L.layer_fn("standard", **kw), args, dy)[1]
    torch.testing.assert_close(dx, want, rtol=1e-10, atol=1e-11)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [1, 2])
def test_under_torch_compile_cpu(layers, monkeypatch):
    """torch.compile(fullgraph=True) of the chained stack (no graph breaks): the eager values."""
    use_standins(monkeypatch, standins("baseline"))
    torch._dynamo.reset()
    args, kw, dy = layer_case(TINY, 12, 6, torch.float32, layers)
    fn = L.layer_fn("chained", **kw)
    got = grads(torch.compile(fn, fullgraph=True, backend="aot_eager"), args, dy)
    assert_layers_match(got, grads(fn, args, dy), layers, 1e-6)


# --------------------------------------------------------------------------- CPU: the ops alone


def test_swiglu_bwd_rms_zdz_is_the_norm_correction_cpu(monkeypatch):
    """For preact = RMSNorm(h) @ w1^T, the swiglu_bwd_rms spec's zdz is the rms_bwd spec's
    saved_zdz of dy = dpreact (float64): the identity the MLP chain rests on; and
    swiglu_bwd_rms_op hands the spec's arguments and outputs through in order."""
    use_standins(monkeypatch, standins("reference"))
    g = torch.Generator().manual_seed(0)
    M, D, I = 9, 16, 24
    h = torch.randn(M, D, generator=g, dtype=torch.float64) * 2
    gamma = torch.rand(D, generator=g, dtype=torch.float64) + 0.5
    w1 = torch.randn(2 * I, D, generator=g, dtype=torch.float64) / 4
    w_down = torch.randn(D, I, generator=g, dtype=torch.float64) / 5
    dout = torch.randn(M, D, generator=g, dtype=torch.float64)
    rms = reference_module("rms_bwd")
    preact = rms.forward(w=w1, h=h, gamma=gamma)
    dpreact, postact, zdz = K.swiglu_bwd_rms_op(dout, w_down, preact)
    want = rms.saved_zdz(dy=dpreact, w=w1, h=h, gamma=gamma, rstd=rms.saved_rstd(h=h))
    torch.testing.assert_close(zdz, want, rtol=1e-12, atol=1e-14)
    ref = reference_module("swiglu_bwd_rms").reference(dout=dout, w_down=w_down, preact=preact)
    torch.testing.assert_close(postact, ref["postact"], rtol=1e-12, atol=1e-14)


def _small_tensors(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    M, D, I, s = 6, 16, 24, TINY
    n_qkv = (s.HQ + 2 * s.HKV) * s.HD
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    x, g1 = r(M, D), torch.rand(D, generator=g, dtype=dtype) + 0.5
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-5)
    return dict(
        x=x,
        normed=x * g1,
        rstd=rstd,
        g=g1,
        w_qkv=r(n_qkv, D) / 4,
        attn=r(M, s.HQ * s.HD),
        w_o=r(D, s.HQ * s.HD) / 4,
        w1=r(2 * I, D) / 4,
        w_down=r(D, I) / 5,
        positions=torch.arange(M),
        inv_freq=torch.rand(s.HD // 2),
    )


@pytest.mark.slow
def test_opcheck_cpu(monkeypatch):
    """torch.library.opcheck of the chained custom ops (schemas, fake impls, autograd
    registration, AOT dispatch; the QKV op's port has unspecified values: not compared)."""
    use_standins(monkeypatch, standins("baseline"))
    t = _small_tensors()
    rg = lambda *ts: tuple(a.detach().clone().requires_grad_() for a in ts)  # noqa: E731
    x, normed, rstd, g, w_qkv = rg(t["x"], t["normed"], t["rstd"], t["g"], t["w_qkv"])
    torch.library.opcheck(
        _chain._chained_qkv_rope,
        (x, normed.detach(), rstd.detach(), g, w_qkv, t["positions"], t["inv_freq"], TINY.HQ, TINY.HKV, TINY.HD),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )
    port = torch.zeros_like(t["x"]).requires_grad_()
    for p in (None, port):
        torch.library.opcheck(_chain._chained_out_proj, (*rg(t["attn"], t["w_o"], t["x"]), t["g"], p))
    mlp = (*rg(t["x"]), t["normed"], t["rstd"], *rg(t["g"], t["w1"], t["w_down"]))
    torch.library.opcheck(_chain._chained_mlp, (*mlp, t["g"]))
    torch.library.opcheck(_chain._chained_mlp_last, mlp)
    pre = torch.randn(6, 48)
    torch.library.opcheck(K.swiglu_bwd_rms_op, (torch.randn(6, 16), t["w_down"], pre))


def test_bad_arguments_are_refused(monkeypatch):
    use_standins(monkeypatch, standins("baseline"))
    t = _small_tensors()
    heads = dict(n_q_heads=TINY.HQ, n_kv_heads=TINY.HKV, head_dim=TINY.HD)
    qkv_args = (t["x"], t["normed"], t["rstd"], t["g"], t["w_qkv"], t["positions"], t["inv_freq"])
    with pytest.raises(ValueError, match=r"chained_qkv_rope: need x \(M, D\) as normed_w"):
        K.chained_qkv_rope(t["x"][:, :8], *qkv_args[1:], **heads)
    with pytest.raises(ValueError, match="chained_qkv_rope: rstd must be"):
        K.chained_qkv_rope(*qkv_args[:2], t["rstd"][:-1], *qkv_args[3:], **heads)
    with pytest.raises(ValueError, match=r"chained_out_proj: need attn \(M, K\), w_o \(D, K\)"):
        K.chained_out_proj(t["attn"], t["w_o"], t["x"], t["g"][:-1])
    with pytest.raises(ValueError, match="chained_out_proj: resid_port must be x's shape"):
        K.chained_out_proj(t["attn"], t["w_o"], t["x"], t["g"], t["x"][:-1])
    with pytest.raises(ValueError, match=r"chained_mlp: need x2 \(M, D\)"):
        K.chained_mlp(t["x"], t["normed"], t["rstd"], t["g"], t["w1"], t["w_down"][:, :-1])
    with pytest.raises(ValueError, match=r"chained_mlp: need x2 \(M, D\).*g_next"):
        K.chained_mlp(t["x"], t["normed"], t["rstd"], t["g"], t["w1"], t["w_down"], t["g"][:-1])
    with pytest.raises(ValueError, match="chained_mlp: eps must be"):
        K.chained_mlp(t["x"], t["normed"], t["rstd"], t["g"], t["w1"], t["w_down"], eps=-1.0)
    with pytest.raises(ValueError, match=r"chain_start: need x \(M, D\) and g1 \(D,\)"):
        K.chain_start(t["x"], t["g"][:-1])
    with pytest.raises(ValueError, match=r"swiglu_bwd_rms_op: need dout \(M, K\)"):
        K.swiglu_bwd_rms_op(torch.randn(6, 16), t["w_down"], torch.randn(6, 40))


def test_dtypes_and_devices_are_refused(monkeypatch):
    """With the layout check on, fp32 activations are refused naming the op and argument;
    with it off, CPU tensors are refused by the device check, naming the op."""
    t = _small_tensors()
    bf = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in t.items()}
    bf["rstd"], bf["inv_freq"] = t["rstd"], t["inv_freq"]
    with pytest.raises(ValueError, match="chained_mlp: x2 must be torch.bfloat16, got torch.float32"):
        K.chained_mlp(t["x"], bf["normed"], bf["rstd"], bf["g"], bf["w1"], bf["w_down"])
    with pytest.raises(ValueError, match="chained_mlp: rstd2 must be torch.float32"):
        K.chained_mlp(bf["x"], bf["normed"], bf["rstd"].double(), bf["g"], bf["w1"], bf["w_down"])
    with pytest.raises(ValueError, match="chained_out_proj: the fused kernels need all tensors on one CUDA"):
        K.chained_out_proj(bf["attn"], bf["w_o"], bf["x"], bf["g"])
    with pytest.raises(ValueError, match="chained_qkv_rope: the fused kernels need all tensors on one CUDA"):
        K.chained_qkv_rope(
            bf["x"],
            bf["normed"],
            bf["rstd"],
            bf["g"],
            bf["w_qkv"],
            bf["positions"],
            bf["inv_freq"],
            n_q_heads=TINY.HQ,
            n_kv_heads=TINY.HKV,
            head_dim=TINY.HD,
        )
    with pytest.raises(ValueError, match="chain_start: the fused kernels need all tensors on one CUDA"):
        K.chain_start(bf["x"], bf["g"])


# --------------------------------------------------------------------------- GPU


def _need():
    missing = set(CHAINED_KERNELS) - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")


def _within_budget(errs):
    for name, e in errs.items():
        assert e["coda"] <= 2 * e["standard_bf16"] + 1e-6, (name, e)


@pytest.mark.gpu
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_chained_layers_match_the_standard_layers_on_gpu(compiled, layers):
    """llama3-1b dims, 2 sequences of 264 tokens (M not a multiple of the tiles), one layer
    and a stack of 3: every output and gradient within twice the standard bf16 layers'
    error against fp32; compiled with fullgraph=True."""
    _need()
    torch._dynamo.reset()
    _within_budget(L.check(L.LLAMA3_1B, 528, 264, mlp="chained", layers=layers, compiled=compiled))


@pytest.mark.gpu
def test_chained_layer_at_m1_on_gpu():
    """M = 1 (one token), 24 independent layers: pooled over them every output and gradient
    within twice the standard bf16 layer's error (one row alone compares two random
    roundings: tests/kernels/test_probe_regressions.py)."""
    _need()
    runs = [L.check(L.LLAMA3_1B, 1, 1, mlp="chained", seed=s) for s in range(24)]
    pooled = {n: {k: max(r[n][k] for r in runs) for k in ("coda", "standard_bf16")} for n in runs[0]}
    _within_budget(pooled)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_chained_stack_in_every_mode_on_gpu(mode):
    """A stack of 2 chained layers (llama3-1b dims, M = 528) eager, under
    torch.compile(fullgraph=True) and under CUDA graphs (recorded, 0 skips): every output
    and gradient within twice the standard bf16 stack's error against fp32."""
    _need()
    torch._dynamo.reset()
    s, M, S = L.LLAMA3_1B, 528, 264
    args = L.make_inputs(s, M, device="cuda") + L.make_inputs(s, M, device="cuda", seed=10)[1:]
    positions, inv_freq = L.rope_tables(M, S, s.HD, "cuda")
    kw = dict(positions=positions, inv_freq=inv_freq, S=S, shape=s)
    diff = tuple(range(len(args)))
    fn = compiled_for(mode, L.layer_fn("chained", **kw), args, diff)
    check_on_gpu(fn, L.layer_fn("standard", **kw), args, diff, names(2))


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_swiglu_bwd_rms_op_on_gpu(compiled):
    """The swiglu_bwd_rms kernel op alone (ragged M, llama-like K and I): dpreact, postact
    and zdz against the spec's baseline in fp32, budget from the same code in bf16."""
    if "swiglu_bwd_rms" not in K.accepted():
        pytest.skip("swiglu_bwd_rms not accepted yet")
    torch._dynamo.reset()
    base = reference_module("swiglu_bwd_rms").baseline
    g = torch.Generator(device="cuda").manual_seed(0)
    M, Kd, I = 333, 1024, 1408
    args = [
        torch.randn(M, Kd, generator=g, device="cuda").to(torch.bfloat16),
        (torch.randn(Kd, I, generator=g, device="cuda") * Kd**-0.5).to(torch.bfloat16),
        (torch.randn(M, 2 * I, generator=g, device="cuda") * 1.5).to(torch.bfloat16),
    ]
    fn = torch.compile(K.swiglu_bwd_rms_op, fullgraph=True) if compiled else K.swiglu_bwd_rms_op

    def torch_fn(dout, w_down, preact):
        out = base(dout=dout, w_down=w_down, preact=preact)
        return out["dpreact"], out["postact"], out["zdz"]

    check_on_gpu(fn, torch_fn, args, (), ("dpreact", "postact", "zdz"))

"""coda_agent.kernels.swiglu: autograd + torch.library glue around the accepted kernels.

On the CPU the glue is exercised with the spec's own PyTorch baselines standing in for
the kernels (this checks the op's wiring: saved tensors, wgrad/dgrad GEMMs, fake impls,
torch.compile); on an H200 the real accepted kernels run (``gpu`` marker).
"""

import pytest
import torch
import torch.nn.functional as F
from glue_helpers import MODES, compiled_for, entry, reference_module, use_standins

import coda_agent.kernels as K


def _torch_mlp(x, w1, w_down):
    pre = x @ w1.T
    return (F.silu(pre[:, 0::2]) * pre[:, 1::2]) @ w_down.T


def standins() -> dict:
    """The specs' baselines as the swiglu_fwd / swiglu_bwd kernel entries."""
    fwd, bwd = reference_module("swiglu_fwd"), reference_module("swiglu_bwd")
    return {
        "swiglu_fwd": entry(fwd.baseline, ["x", "w1"], ["preact", "postact"]),
        "swiglu_bwd": entry(bwd.baseline, ["dout", "w_down", "preact"], ["dpreact", "postact"]),
    }


@pytest.fixture
def baseline_kernels(monkeypatch):
    return use_standins(monkeypatch, standins())  # device and layout checks off: CPU, float64 too


def _inputs(device, dtype, M=64, Kd=48, I=40, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, Kd, generator=g, device=device).to(dtype).requires_grad_()
    w1 = (torch.randn(2 * I, Kd, generator=g, device=device) / Kd**0.5).to(dtype).requires_grad_()
    wd = (torch.randn(Kd, I, generator=g, device=device) / I**0.5).to(dtype).requires_grad_()
    return x, w1, wd


def _check_against_torch(fn, device, dtype, atol, rtol):
    x, w1, wd = _inputs(device, dtype)
    out = fn(x, w1, wd)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w1, wd), dout)
    xr, w1r, wdr = (t.detach().double().requires_grad_() for t in (x, w1, wd))
    out_r = _torch_mlp(xr, w1r, wdr)
    grads_r = torch.autograd.grad(out_r, (xr, w1r, wdr), dout.double())
    torch.testing.assert_close(out.double(), out_r, atol=atol, rtol=rtol)
    for g, gr in zip(grads, grads_r, strict=False):
        torch.testing.assert_close(g.double(), gr, atol=atol, rtol=rtol)


def test_glue_gradients_cpu(baseline_kernels):
    _check_against_torch(K.swiglu, "cpu", torch.float64, atol=1e-10, rtol=1e-10)


def test_glue_opcheck_cpu(baseline_kernels):
    x, w1, wd = _inputs("cpu", torch.float32)
    torch.library.opcheck(K.swiglu_fwd_op, (x.detach(), w1.detach()))
    torch.library.opcheck(K.swiglu_bwd_op, (torch.randn(64, 48), wd.detach(), torch.randn(64, 80)))


def test_glue_under_torch_compile_cpu(baseline_kernels):
    compiled = torch.compile(K.swiglu, fullgraph=True, backend="aot_eager")
    _check_against_torch(compiled, "cpu", torch.float64, atol=1e-10, rtol=1e-10)


def test_loading_a_kernel_does_not_shadow_the_ops():
    """Importing coda_agent.kernels.<op>.kernel binds coda_agent.kernels.<op> to the folder;
    the ops must keep working after that (this broke torch.compile on the H200 once)."""
    import importlib
    import importlib.util
    import sys

    for name in K.accepted():
        pkg = importlib.util.find_spec(f"coda_agent.kernels.{name}")
        assert pkg is not None
        mod = importlib.import_module(f"coda_agent.kernels.{name}")
        assert getattr(K, name) is mod and sys.modules[f"coda_agent.kernels.{name}"] is mod
    assert callable(K.swiglu_fwd_op) and callable(K.swiglu_bwd_op) and callable(K.swiglu)
    assert not any(n in K.__all__ for n in K.accepted())


def test_cpu_tensors_are_refused_clearly(monkeypatch):
    x, w1, wd = _inputs("cpu", torch.float32)
    # dtype, contiguity and row widths are checked before the device (a CPU call can be checked
    # that far)
    with pytest.raises(ValueError, match=r"^swiglu: x must be torch.bfloat16, got torch.float32$"):
        K.swiglu(x, w1, wd)
    monkeypatch.setattr(K, "_check_layout", lambda *a, **kw: None)
    with pytest.raises(
        ValueError,
        match=r"need all tensors on one CUDA \(Hopper\) device, got x=cpu, w1=cpu, "
        r"w_down=cpu$",
    ):
        K.swiglu(x, w1, wd)
    if torch.cuda.is_available():  # mixed devices: the message says which argument is where
        with pytest.raises(ValueError, match=r"got x=cpu, w1=cuda:0, w_down=cpu$"):
            K.swiglu(x, w1.cuda(), wd)


def test_missing_kernel_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(K, "KERNELS_DIR", tmp_path)
    with pytest.raises(ModuleNotFoundError, match="no accepted kernel 'swiglu_fwd'.*coda-agent generate swiglu_fwd"):
        K.load("swiglu_fwd")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_swiglu_matches_pytorch_on_gpu(mode):
    """The accepted kernels in training: gradients match PyTorch (bf16 tolerance)."""
    if not {"swiglu_fwd", "swiglu_bwd"} <= set(K.accepted()):
        pytest.skip("swiglu kernels not accepted yet")
    torch._dynamo.reset()
    x, w1, wd = _inputs("cuda", torch.bfloat16, M=1000, Kd=512, I=704)
    fn = compiled_for(mode, K.swiglu, (x, w1, wd), (0, 1, 2))
    out = fn(x, w1, wd)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w1, wd), dout)
    # fp32 reference from the same bf16 inputs; bf16-level tolerance relative to scale
    xr, w1r, wdr = (t.detach().float().requires_grad_() for t in (x, w1, wd))
    out_r = _torch_mlp(xr, w1r, wdr)
    grads_r = torch.autograd.grad(out_r, (xr, w1r, wdr), dout.float())
    # the same computation in bf16 PyTorch sets the error budget (CODA criterion)
    xb, w1b, wdb = (t.detach().clone().requires_grad_() for t in (x, w1, wd))
    out_b = _torch_mlp(xb, w1b, wdb)
    grads_b = torch.autograd.grad(out_b, (xb, w1b, wdb), dout)
    for name, a, r, b in zip(
        ("out", "dx", "dw1", "dw_down"), (out, *grads), (out_r, *grads_r), (out_b, *grads_b), strict=False
    ):
        err = (a.float() - r).abs().max().item()
        budget = 2 * (b.float() - r).abs().max().item() + 1e-6
        assert err <= budget, f"{name}: max err {err:.3e} > allowed {budget:.3e}"

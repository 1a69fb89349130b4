"""coda_agent.kernels.linear_cross_entropy: LM head + cross-entropy, forward gemm_cross_entropy
(CODA item 6), backward cross_entropy_bwd (item 9).

On the CPU the specs' ``baseline`` functions stand in for the kernels (float32); for
gradcheck in float64 the forward stand-in is written here from the gemm_cross_entropy spec
math (its own baseline/reference compute the loss in fp32 by definition) and the backward
is the cross_entropy_bwd baseline (exact in float64). On an H200 the real kernels run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from glue_helpers import MODES, check_against_torch, check_on_gpu, compiled_for, entry, reference_module, use_standins

import coda_agent.kernels as K

NAMES = ("loss", "dh", "dw_vocab")


def torch_linear_cross_entropy(h, w_vocab, target):
    logits = h @ w_vocab.T
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), target, reduction="none")


def ce_inputs(device, dtype, M=12, K=16, V=40, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(M, K, generator=g, device=device).to(dtype)
    w = (torch.randn(V, K, generator=g, device=device) * 2 / K**0.5).to(dtype)
    return [h, w, torch.randint(0, V, (M,), generator=g, device=device)]


def gemm_cross_entropy_spec_math(h, w_vocab, target):
    """Stand-in written from the gemm_cross_entropy spec's math, in the inputs' precision
    (float64 here): lse = logsumexp(h @ w^T), loss = lse - logit[target]."""
    logits = h @ w_vocab.T
    lse = torch.logsumexp(logits, dim=-1)
    return lse - logits.gather(1, target[:, None])[:, 0], lse


def standins(kind: str = "baseline") -> dict:
    fwd = reference_module("gemm_cross_entropy")
    bwd = reference_module("cross_entropy_bwd")
    return {
        "gemm_cross_entropy": (
            entry(fwd.baseline, ["h", "w_vocab", "target"], ["loss", "lse"])
            if kind == "baseline"
            else gemm_cross_entropy_spec_math
        ),
        "cross_entropy_bwd": entry(bwd.baseline, ["h", "w_vocab", "target", "lse", "dloss"], ["dh", "dw_vocab"]),
    }


@pytest.fixture
def baseline_kernels(monkeypatch):
    return use_standins(monkeypatch, standins())


def test_matches_torch_cpu(baseline_kernels):
    check_against_torch(
        K.linear_cross_entropy,
        torch_linear_cross_entropy,
        ce_inputs("cpu", torch.float32),
        (0, 1),
        rtol=1e-4,
        names=NAMES,
    )
    assert baseline_kernels == {"gemm_cross_entropy": 1, "cross_entropy_bwd": 1}


def test_mean_reduction_and_saved_lse_cpu(monkeypatch):
    """loss.mean().backward() (an expanded, stride-0 upstream gradient) works; the lse handed
    to the backward is the forward's, equal to the spec's saved_lse."""
    seen = {}
    entries = standins()
    bwd = entries["cross_entropy_bwd"]

    def spy(*args):
        seen["args"] = args
        return bwd(*args)

    use_standins(monkeypatch, {**entries, "cross_entropy_bwd": spy})
    h, w, t = ce_inputs("cpu", torch.float32)
    h.requires_grad_(), w.requires_grad_()
    K.linear_cross_entropy(h, w, t).mean().backward()
    hr, wr = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch_linear_cross_entropy(hr, wr, t).mean().backward()
    torch.testing.assert_close(h.grad.double(), hr.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w.grad.double(), wr.grad, atol=1e-6, rtol=1e-5)
    _, _, target, lse, dloss = seen["args"]
    assert torch.equal(target, t) and dloss.is_contiguous() and dloss.dtype == torch.float32
    torch.testing.assert_close(dloss, torch.full_like(dloss, 1 / len(t)))
    ref = reference_module("cross_entropy_bwd")
    torch.testing.assert_close(lse, ref.saved_lse(h=h.detach(), w_vocab=w.detach()), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_gradcheck_float64_cpu(monkeypatch):
    use_standins(monkeypatch, standins("spec_math"))
    h, w, t = ce_inputs("cpu", torch.float64, M=5, K=6, V=9)
    assert torch.autograd.gradcheck(
        lambda h_, w_: K.linear_cross_entropy(h_, w_, t),
        (h.requires_grad_(), w.requires_grad_()),
        eps=1e-6,
        atol=1e-7,
        rtol=1e-6,
    )


@pytest.mark.slow
def test_opcheck_cpu(baseline_kernels):
    from coda_agent.kernels import _cross_entropy

    h, w, t = ce_inputs("cpu", torch.float32)
    torch.library.opcheck(K.gemm_cross_entropy_op, (h, w, t))
    lse = torch.logsumexp(h @ w.T, dim=-1)
    torch.library.opcheck(K.cross_entropy_bwd_op, (h, w, t, lse, torch.randn(h.shape[0])))
    torch.library.opcheck(_cross_entropy._linear_cross_entropy, (h.requires_grad_(), w.requires_grad_(), t))


def test_under_torch_compile_cpu(baseline_kernels):
    torch._dynamo.reset()
    compiled = torch.compile(K.linear_cross_entropy, fullgraph=True, backend="aot_eager")
    check_against_torch(
        compiled, torch_linear_cross_entropy, ce_inputs("cpu", torch.float32), (0, 1), rtol=1e-4, names=NAMES
    )


def test_cpu_tensors_are_refused_clearly(monkeypatch):
    monkeypatch.setattr(K, "_check_layout", lambda *a, **kw: None)  # checked first; this test is the device's
    with pytest.raises(ValueError, match="linear_cross_entropy: the fused kernels need all tensors on one CUDA"):
        K.linear_cross_entropy(*ce_inputs("cpu", torch.float32))


def test_bad_arguments_are_refused(baseline_kernels):
    h, w, t = ce_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="must share K"):
        K.linear_cross_entropy(h, w[:, :-1], t)
    with pytest.raises(ValueError, match="target must be"):
        K.linear_cross_entropy(h, w, t[:-1])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_matches_pytorch_on_gpu(mode):
    """The accepted kernels in training: loss and gradients match PyTorch (bf16 budget)."""
    missing = {"gemm_cross_entropy", "cross_entropy_bwd"} - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")
    torch._dynamo.reset()
    args = ce_inputs("cuda", torch.bfloat16, M=333, K=264, V=1336)
    fn = compiled_for(mode, K.linear_cross_entropy, args, (0, 1))
    check_on_gpu(fn, torch_linear_cross_entropy, args, (0, 1), NAMES)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_forward_on_gpu(compiled):
    """The forward kernel alone (runs before cross_entropy_bwd is accepted): the loss."""
    if "gemm_cross_entropy" not in K.accepted():
        pytest.skip("gemm_cross_entropy not accepted yet")
    torch._dynamo.reset()
    fn = torch.compile(K.linear_cross_entropy, fullgraph=True) if compiled else K.linear_cross_entropy
    check_on_gpu(fn, torch_linear_cross_entropy, ce_inputs("cuda", torch.bfloat16, M=333, K=264, V=1336), (), NAMES[:1])


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_ignore_index_on_gpu(compiled):
    """Rows labelled -100 (padding): the real kernels see target 0 there and the op masks
    them, so loss and gradients match F.cross_entropy(ignore_index=-100) (the kernel alone
    would leave those rows' target logit unwritten)."""
    missing = {"gemm_cross_entropy", "cross_entropy_bwd"} - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")
    torch._dynamo.reset()
    h, w, t = ce_inputs("cuda", torch.bfloat16, M=333, K=264, V=1336)
    t[::7] = -100
    fn = torch.compile(K.linear_cross_entropy, fullgraph=True) if compiled else K.linear_cross_entropy
    loss = fn(h, w, t)
    assert loss[::7].eq(0).all() and loss[1::7].gt(0).all()
    check_on_gpu(fn, torch_linear_cross_entropy, [h, w, t], (0, 1), NAMES)

"""A whole Llama-3 decoder layer built from the ops (benchmarks/llama_layer.py) against the
standard layer: the ops' wiring as a user composes them (deferred rstd handed from GEMM to
GEMM, residual_rmsnorm, the two MLP wirings).

On the CPU the specs' exact float64 references stand in for the kernels, so the CODA layer
must equal the standard one to float64 rounding: outputs and the gradients of x and every
weight. On an H200 the real kernels run (``gpu``), within twice the standard bf16 layer's
error against fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glue_helpers import module_from_file, use_standins
from test_rmsnorm_ops import standins as rms_standins
from test_rope_ops import standins as rope_standins
from test_swiglu_op import standins as swiglu_standins

ROOT = Path(__file__).resolve().parents[2]


L = module_from_file(ROOT / "benchmarks" / "llama_layer.py", "coda_llama_layer")
TINY = L.LayerShape("tiny", D=16, I=24, HQ=2, HKV=1, HD=8)


@pytest.mark.parametrize("mlp", L.MLPS)
def test_coda_layer_is_the_standard_layer_cpu(mlp, monkeypatch):
    calls = use_standins(monkeypatch, {**swiglu_standins(), **rms_standins("reference"), **rope_standins("reference")})
    M, S = 12, 6                                             # 2 sequences of 6 tokens
    args = [a.detach().requires_grad_() for a in L.make_inputs(TINY, M, device="cpu", dtype=torch.float64)]
    positions, inv_freq = L.rope_tables(M, S, TINY.HD, "cpu")
    kw = dict(positions=positions, inv_freq=inv_freq.double(), S=S, shape=TINY)
    dy = torch.randn(M, TINY.D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = (L.standard_layer(*args, **kw), *torch.autograd.grad(L.standard_layer(*args, **kw), args, dy))
    out = L.coda_layer(*args, mlp=mlp, **kw)
    got = (out, *torch.autograd.grad(out, args, dy))
    for name, g, w in zip(("out", "dx", *(f"d{p}" for p in L.PARAMS)), got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"{n}: {m}")
    fwd = {"swiglu": "swiglu_fwd", "deferred": "gemm_rmsnorm_swiglu", "deferred_mlp": "gemm_rmsnorm_swiglu"}[mlp]
    assert calls["gemm_rmsnorm_rope"] == 1 and calls["gemm_residual_partial_rms"] == 1 and calls[fwd] == 1
    assert calls["swiglu_bwd"] == (0 if mlp == "deferred" else 1)


def test_a_wrong_wiring_is_caught_cpu(monkeypatch):
    """The comparison can fail: the layer with g2 applied twice differs from the standard one."""
    use_standins(monkeypatch, {**swiglu_standins(), **rms_standins("reference"), **rope_standins("reference")})
    M, S = 12, 6
    args = L.make_inputs(TINY, M, device="cpu", dtype=torch.float64)
    positions, inv_freq = L.rope_tables(M, S, TINY.HD, "cpu")
    kw = dict(positions=positions, inv_freq=inv_freq.double(), S=S, shape=TINY)
    wrong = list(args)
    wrong[4] = args[4] * args[4]
    assert not torch.allclose(L.coda_layer(*wrong, **kw), L.standard_layer(*args, **kw), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("mlp", L.MLPS)
def test_coda_layer_matches_the_standard_layer_on_gpu(mlp):
    """llama3-1b dims, 2 sequences of 264 tokens (M not a multiple of the tiles): every
    output and gradient within twice the standard bf16 layer's error against fp32."""
    import coda_agent.kernels as K

    need = {"gemm_rmsnorm_rope", "gemm_residual_partial_rms"} | {
        "swiglu": {"swiglu_fwd", "swiglu_bwd"}, "deferred": {"gemm_rmsnorm_swiglu"},
        "deferred_mlp": {"gemm_rmsnorm_swiglu", "swiglu_bwd"}}[mlp]
    if need - set(K.accepted()):
        pytest.skip(f"kernels not accepted yet: {sorted(need - set(K.accepted()))}")
    errs = L.check(L.LLAMA3_1B, 528, 264, mlp=mlp)
    for name, e in errs.items():
        assert e["coda"] <= 2 * e["standard_bf16"] + 1e-6, (name, e)

"""Catalogue spec gemm_cross_entropy (item 6; gemm_rope, item 5, is still to be added here):
the spec loads, the reference agrees with an independent float64 computation on the CPU,
the baseline agrees with the reference, and the first correctness shape gives O(1) outputs."""

from pathlib import Path

import pytest
import torch

from coda_agent.verifier.gpu.inputs import make_inputs, upcast
from coda_agent.verifier.spec import eval_expr, load_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "kernel_specs"


def _f64(inputs):
    return {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}


# --------------------------------------------------------------------------- cross-entropy


@pytest.fixture(scope="module")
def ce():
    return load_spec(SPECS / "gemm_cross_entropy")


def test_ce_spec_loads(ce):
    s = ce.spec
    assert s.pattern == "forward" and s.catalogue_item == 6
    assert [t.name for t in s.entry.inputs] == ["h", "w_vocab", "target"]
    assert [t.name for t in s.entry.outputs] == ["loss", "lse"]
    assert all(o.dtype == "float32" for o in s.entry.outputs)
    tgt = s.entry.inputs[2]
    assert tgt.dtype == "int64" and tgt.init.dist == "randint" and tgt.init.high == "V"
    assert s.entry.allowed_torch == ["logsumexp"]
    assert "never" in s.description.lower() and "materialized" in s.math
    assert {c.dims["V"] for c in s.shapes.benchmark} == {128256}
    assert {c.dims["K"] for c in s.shapes.benchmark} == {2048, 4096, 8192}
    assert any(c.dims["V"] % 128 and c.dims["M"] % 128 for c in s.shapes.correctness)
    assert eval_expr(s.bench.flops, {"M": 2, "K": 3, "V": 5}) == 2 * 2 * 3 * 5
    assert s.bench.bar == {"bare_gemm": 1.05, "quack_library": 1.03}


@pytest.mark.parametrize("case", [0, 2])
def test_ce_reference_matches_log_softmax_gather(ce, case):
    s = ce.spec
    dims = s.shapes.correctness[case].dims
    inputs = make_inputs(ce, dims, seed=0, device="cpu")
    assert int(inputs["target"].min()) >= 0 and int(inputs["target"].max()) < dims["V"]
    x = _f64(inputs)
    ref = ce.load_reference()
    out = ref.reference(**x)
    logits = x["h"] @ x["w_vocab"].T
    logp = logits - logits.max(-1, keepdim=True).values
    logp = logp - logp.exp().sum(-1, keepdim=True).log()
    loss = -logp.gather(-1, x["target"][:, None])[:, 0]
    lse = loss + logits.gather(-1, x["target"][:, None])[:, 0]
    # the reference upcasts to fp32 for the loss math: compare at fp32 precision
    torch.testing.assert_close(out["loss"].double(), loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["lse"].double(), lse, rtol=1e-5, atol=1e-5)
    base = ref.baseline(**x)
    for k in ("loss", "lse"):
        torch.testing.assert_close(base[k], out[k])
    assert ref.bare_gemm(**x).shape == (dims["M"], dims["V"])


def test_ce_outputs_are_order_one(ce):
    s = ce.spec
    dims = s.shapes.correctness[0].dims
    ref = ce.load_reference()
    out32 = ref.reference(**upcast(make_inputs(ce, dims, seed=0, device="cpu")))
    for name in ("loss", "lse"):
        y = out32[name]
        assert y.shape == (dims["M"],) and y.dtype == torch.float32
        assert torch.isfinite(y).all()
        assert 0.5 < y.abs().mean() < 50, name
        assert y.std() > 0.05, name  # not a constant a kernel could guess
    assert (out32["loss"] > 0).all()

"""The quack_gemm floor baseline: operand capture from a spec's bare_gemm (CPU), and the
bench baseline list it joins."""

import shutil
from pathlib import Path

import pytest
import torch

from coda_agent.verifier.gpu.gemm_floor import NAME, capture_mm_operands
from coda_agent.verifier.library.bench import bench_baselines
from coda_agent.verifier.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_capture_records_mm_operands_as_views():
    x, w = torch.randn(6, 4), torch.randn(5, 4)
    pairs = capture_mm_operands(lambda *, x, w: x @ w.T, {"x": x, "w": w})
    assert len(pairs) == 1
    a, b = pairs[0]
    assert a.shape == (6, 4) and b.shape == (4, 5)
    # B is w.T as a view: same storage, transposed strides (K-major), no copy
    assert b.data_ptr() == w.data_ptr() and b.stride() == (1, 4)
    assert torch.equal(a @ b, x @ w.T)


def test_capture_keeps_every_gemm_in_order():
    # cross_entropy_bwd's bare_gemm: logits = h @ w.T, then logits @ w and logits.T @ h
    ref = load_spec(ROOT / "kernel_specs" / "cross_entropy_bwd").load_reference()
    h, w = torch.randn(8, 16), torch.randn(12, 16)
    pairs = capture_mm_operands(ref.bare_gemm, {"h": h, "w_vocab": w, "target": None, "lse": None, "dloss": None})
    assert [(tuple(a.shape), tuple(b.shape)) for a, b in pairs] == [
        ((8, 16), (16, 12)),
        ((8, 12), (12, 16)),
        ((12, 8), (8, 16)),
    ]
    # the intermediate operand is the logits the first GEMM produced
    assert torch.allclose(pairs[1][0], h @ w.T)


def test_capture_without_a_gemm_is_an_error():
    with pytest.raises(ValueError, match="no aten.mm"):
        capture_mm_operands(lambda *, x: x * 2, {"x": torch.ones(3)})


def test_bench_adds_the_floor_where_the_bare_gemm_is_timed(tmp_path):
    shutil.copytree(ROOT / "kernel_specs" / "swiglu_fwd", tmp_path / "swiglu_fwd")
    loaded = load_spec(tmp_path / "swiglu_fwd")
    assert "bare_gemm" in loaded.spec.bench.baselines
    names = bench_baselines(loaded)
    assert names[-1] == NAME and names.count(NAME) == 1
    # a spec that does not time the bare GEMM gets no floor either
    toml = tmp_path / "swiglu_fwd" / "spec.toml"
    text = toml.read_text()
    bl = [ln for ln in text.splitlines() if ln.startswith("baselines")]
    bars = [ln for ln in text.splitlines() if ln.startswith("bar ")]
    assert len(bl) == 1 and len(bars) == 1
    # (the bars go too: a bar must name a measured baseline)
    toml.write_text(text.replace(bl[0], 'baselines = ["torch_eager"]').replace(bars[0], ""))
    assert NAME not in bench_baselines(load_spec(tmp_path / "swiglu_fwd"))


def test_capture_takes_linear_with_bias_and_3d_activations():
    import torch.nn.functional as F

    x3, w, bias = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    # F.linear with a bias dispatches addmm: its (A, B) are the GEMM's, the bias is not
    ((a, b),) = capture_mm_operands(lambda *, x, w: F.linear(x, w, bias), {"x": x3.reshape(6, 4), "w": w})
    assert a.shape == (6, 4) and b.shape == (4, 5) and b.data_ptr() == w.data_ptr()
    # a 3-D activation folds into one 2-D mm over B*M rows
    ((a, b),) = capture_mm_operands(lambda *, x, w: x @ w.T, {"x": x3, "w": w})
    assert a.shape == (6, 4) and b.shape == (4, 5)


def test_capture_refuses_batched_gemms():
    # a floor that timed only some of the GEMMs would be a wrong number, not a missing one
    def mixed(*, x, w):
        return x[0] @ w.T, torch.bmm(x, w.T.expand(2, 4, 5))

    with pytest.raises(ValueError, match="aten.bmm"):
        capture_mm_operands(mixed, {"x": torch.randn(2, 3, 4), "w": torch.randn(5, 4)})

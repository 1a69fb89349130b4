"""verifier/inputs.py: bit-identical inputs across processes, declared scales, O(1) outputs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coda_agent.verifier.inputs import make_inputs, rotation_count, tensor_bytes, tensor_seed, upcast
from coda_agent.verifier.numerics import bitwise_equal
from coda_agent.verifier.spec import KernelSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "kernel_specs"

_GEN = """
import sys, torch
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.inputs import make_inputs
loaded = load_spec(sys.argv[1])
case = loaded.spec.shapes.correctness[-1]
torch.save(make_inputs(loaded, case.dims, int(sys.argv[2]), "cpu"), sys.argv[3])
"""


@pytest.mark.parametrize("spec", ["swiglu_fwd", "swiglu_bwd"])
def test_identical_across_processes(spec, tmp_path):
    outs = []
    for i in range(2):
        path = tmp_path / f"{i}.pt"
        subprocess.run([sys.executable, "-c", _GEN, str(SPECS / spec), "1", str(path)], check=True, timeout=120)
        outs.append(torch.load(path, weights_only=True))
    assert outs[0].keys() == outs[1].keys()
    for k in outs[0]:
        assert bitwise_equal(outs[0][k], outs[1][k]), k
    here = make_inputs(load_spec(SPECS / spec), load_spec(SPECS / spec).spec.shapes.correctness[-1].dims, 1, "cpu")
    for k in here:
        assert bitwise_equal(here[k], outs[0][k]), k


def test_shapes_dtypes_seeds_and_scales():
    loaded = load_spec(SPECS / "swiglu_fwd")
    dims = {"M": 333, "K": 320, "I": 200}
    a = make_inputs(loaded, dims, 0, "cpu")
    assert list(a) == ["x", "w1"]
    assert a["x"].shape == (333, 320) and a["w1"].shape == (400, 320)
    assert a["x"].dtype == torch.bfloat16 and a["x"].is_contiguous()
    assert float(a["w1"].float().std()) == pytest.approx(320 ** -0.5, rel=0.05)
    assert float(a["x"].float().std()) == pytest.approx(1.0, rel=0.05)
    b = make_inputs(loaded, dims, 1, "cpu")
    assert not torch.equal(a["x"], b["x"])
    assert tensor_seed(0, "x") != tensor_seed(0, "w1") != tensor_seed(1, "x")


def test_uniform_and_randint():
    spec = KernelSpec.model_validate({
        "name": "toy", "description": "a toy spec for input generation tests", "pattern": "forward",
        "math": "out = x + idx", "entry": {"function": "toy", "inputs": [
            {"name": "x", "shape": ["M", "N"], "dtype": "float32", "init": {"dist": "uniform", "low": -2, "high": "N/10"}},
            {"name": "idx", "shape": ["M"], "dtype": "int64", "init": {"dist": "randint", "low": 0, "high": "N"}},
        ], "outputs": [{"name": "out", "shape": ["M", "N"], "dtype": "float32"}]},
        "shapes": {"correctness": [{"dims": {"M": 100, "N": 50}}]},
        "bench": {"flops": "M*N"},
    })
    t = make_inputs(spec, {"M": 100, "N": 50}, 3, "cpu")
    assert float(t["x"].min()) >= -2 and float(t["x"].max()) <= 5
    assert t["idx"].dtype == torch.int64 and int(t["idx"].min()) >= 0 and int(t["idx"].max()) < 50
    assert tensor_bytes(spec, {"M": 100, "N": 50}, "inputs") == 100 * 50 * 4 + 100 * 8
    up = upcast(t)
    assert up["x"].dtype == torch.float32 and up["idx"].dtype == torch.int64


def test_rotation_count():
    assert rotation_count(1 << 20) == 8
    assert rotation_count(1 << 30) == 4
    assert rotation_count(5 << 30) == 2


def _std(t):
    return float(t.float().std())


@pytest.mark.parametrize("case", range(3))
def test_swiglu_outputs_are_order_one(case):
    """Threat 8: the declared scales give O(1) outputs, so zeros can never pass."""
    fwd = load_spec(SPECS / "swiglu_fwd")
    dims = fwd.spec.shapes.correctness[case].dims
    ref = fwd.load_reference()
    out = ref.reference(**upcast(make_inputs(fwd, dims, 0, "cpu")))
    for name, t in out.items():
        assert 0.1 < _std(t) < 10, (name, _std(t))

    bwd = load_spec(SPECS / "swiglu_bwd")
    dims = bwd.spec.shapes.correctness[case].dims
    rb = bwd.load_reference()
    inp = upcast(make_inputs(bwd, dims, 0, "cpu"))
    assert 0.1 < _std(rb.reference(**inp)["postact"]) < 10
    preact = inp["preact"].clone().requires_grad_(True)
    y = rb.forward(w_down=inp["w_down"], preact=preact)
    (g,) = torch.autograd.grad(y, preact, grad_outputs=inp["dout"])
    assert 0.1 < _std(g) < 10, _std(g)

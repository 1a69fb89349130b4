"""verifier/gpu/inputs.py: bit-identical inputs across processes, declared scales, O(1) outputs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from verifier_helpers import write_spec

from coda_agent.verifier.gpu.inputs import make_inputs, rotation_count, tensor_bytes, tensor_seed, upcast
from coda_agent.verifier.gpu.poison import bitwise_equal
from coda_agent.verifier.spec import KernelSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "kernel_specs"

_GEN = """
import sys, torch
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.gpu.inputs import make_inputs
loaded = load_spec(sys.argv[1])
case = loaded.spec.shapes.correctness[-1]
torch.save(make_inputs(loaded, case.dims, int(sys.argv[2]), "cpu"), sys.argv[3])
"""


@pytest.mark.slow
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
    assert float(a["w1"].float().std()) == pytest.approx(320**-0.5, rel=0.05)
    assert float(a["x"].float().std()) == pytest.approx(1.0, rel=0.05)
    b = make_inputs(loaded, dims, 1, "cpu")
    assert not torch.equal(a["x"], b["x"])
    assert tensor_seed(0, "x") != tensor_seed(0, "w1") != tensor_seed(1, "x")


def test_uniform_and_randint():
    spec = KernelSpec.model_validate(
        {
            "name": "toy",
            "description": "a toy spec for input generation tests",
            "pattern": "forward",
            "math": "out = x + idx",
            "entry": {
                "function": "toy",
                "inputs": [
                    {
                        "name": "x",
                        "shape": ["M", "N"],
                        "dtype": "float32",
                        "init": {"dist": "uniform", "low": -2, "high": "N/10"},
                    },
                    {
                        "name": "idx",
                        "shape": ["M"],
                        "dtype": "int64",
                        "init": {"dist": "randint", "low": 0, "high": "N"},
                    },
                ],
                "outputs": [{"name": "out", "shape": ["M", "N"], "dtype": "float32"}],
            },
            "shapes": {"correctness": [{"dims": {"M": 100, "N": 52}}]},
            "bench": {"flops": "M*N"},
        }
    )
    t = make_inputs(spec, {"M": 100, "N": 52}, 3, "cpu")
    assert float(t["x"].min()) >= -2 and float(t["x"].max()) <= 5.2
    assert t["idx"].dtype == torch.int64 and int(t["idx"].min()) >= 0 and int(t["idx"].max()) < 52
    assert tensor_bytes(spec, {"M": 100, "N": 52}, "inputs") == 100 * 52 * 4 + 100 * 8
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


# --------------------------------------------------------------------------- derived inputs

_DERIVED_TOML = """
name = "derived_demo"
pattern = "backward"
description = "a spec whose rstd input is what the forward saved, derived from h"
math = "rstd[m] = rsqrt(mean(h[m]^2) + eps)"
[entry]
function = "derived_demo"
[[entry.inputs]]
name = "h"
shape = ["M", "N"]
dtype = "bfloat16"
[[entry.inputs]]
name = "rstd"
shape = ["M"]
dtype = "float32"
init = { dist = "derived", fn = "saved_rstd" }
[[entry.inputs]]
name = "freq"
shape = ["N/2"]
dtype = "float32"
init = { dist = "derived", fn = "table" }
[[entry.outputs]]
name = "out"
shape = ["M", "N"]
dtype = "bfloat16"
[shapes]
correctness = [{ dims = { M = 5, N = 8 } }]
[bench]
flops = "M*N"
"""

_DERIVED_REF = """
import torch
def saved_rstd(*, h):
    return torch.rsqrt(h.float().pow(2).mean(-1) + 1e-6)
def table(*, h, rstd, dims):
    return torch.arange(dims["N"] // 2, dtype=torch.float32) + rstd.sum() * 0
def reference(**kw): return {}
def baseline(**kw): return {}
def bare_gemm(**kw): return None
"""


def _write_spec(tmp_path, toml, ref=_DERIVED_REF, name="derived_demo"):
    return write_spec(tmp_path, name, toml, ref)


def test_derived_input_is_computed_from_the_drawn_inputs(tmp_path):
    loaded = load_spec(_write_spec(tmp_path, _DERIVED_TOML))
    inp = make_inputs(loaded, {"M": 5, "N": 8}, 3, "cpu")
    expect = torch.rsqrt(inp["h"].float().pow(2).mean(-1) + 1e-6)
    assert inp["rstd"].dtype == torch.float32
    assert torch.equal(inp["rstd"], expect)
    assert inp["freq"].tolist() == [0.0, 1.0, 2.0, 3.0]
    again = make_inputs(loaded, {"M": 5, "N": 8}, 3, "cpu")
    assert torch.equal(again["rstd"], inp["rstd"])


def test_derived_input_needs_the_loaded_spec_and_the_right_shape(tmp_path):
    loaded = load_spec(_write_spec(tmp_path, _DERIVED_TOML))
    with pytest.raises(ValueError, match="LoadedSpec"):
        make_inputs(loaded.spec, {"M": 5, "N": 8}, 0, "cpu")
    bad = _DERIVED_REF.replace("return torch.rsqrt(h.float().pow(2).mean(-1) + 1e-6)", "return h.float()")
    loaded_bad = load_spec(
        _write_spec(tmp_path, _DERIVED_TOML.replace("derived_demo", "derived_bad"), bad, "derived_bad")
    )
    with pytest.raises(ValueError, match=r"saved_rstd returned shape \(5, 8\).*\(5,\)"):
        make_inputs(loaded_bad, {"M": 5, "N": 8}, 0, "cpu")


def test_derived_input_spec_errors_name_the_field(tmp_path):
    from coda_agent.verifier.spec import SpecError

    no_fn = _DERIVED_TOML.replace('init = { dist = "derived", fn = "saved_rstd" }', 'init = { dist = "derived" }')
    with pytest.raises(SpecError, match=r"entry\.inputs\.1\.init.*'fn'"):
        load_spec(_write_spec(tmp_path, no_fn.replace("derived_demo", "d1"), name="d1"))
    first = _DERIVED_TOML.replace(
        'name = "h"\nshape = ["M", "N"]\ndtype = "bfloat16"',
        'name = "h"\nshape = ["M", "N"]\ndtype = "bfloat16"\ninit = { dist = "derived", fn = "saved_rstd" }',
    )
    with pytest.raises(SpecError, match="needs earlier inputs"):
        load_spec(_write_spec(tmp_path, first.replace("derived_demo", "d2"), name="d2"))
    missing = _DERIVED_REF.replace("def saved_rstd", "def other_name")
    with pytest.raises(SpecError, match=r"missing function\(s\) \['saved_rstd'\]"):
        load_spec(_write_spec(tmp_path, _DERIVED_TOML.replace("derived_demo", "d3"), missing, "d3"))


def test_derived_inputs_use_the_reference_module_given(tmp_path):
    """The workers pass their imported reference module: no re-import per input set."""
    loaded = load_spec(_write_spec(tmp_path, _DERIVED_TOML))
    ref = loaded.load_reference()
    calls = []
    orig = ref.saved_rstd
    ref.saved_rstd = lambda **kw: (calls.append(1), orig(**kw))[1]
    a = make_inputs(loaded, {"M": 5, "N": 8}, 3, "cpu", ref)
    assert calls == [1]
    assert torch.equal(a["rstd"], make_inputs(loaded, {"M": 5, "N": 8}, 3, "cpu")["rstd"])

"""What a spec may declare beyond one GEMM tile (verifier/spec/tensors.py, checks.py):
fp8 outputs with their scales, reference-only inputs, float constants, per-input draws,
partial-shape tensors. Each malformed declaration fails at load naming the file and the
field; every shipped spec keeps loading with the hash its accepted kernel recorded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from coda_agent.verifier.gpu.inputs import make_inputs
from coda_agent.verifier.spec import SpecError, find_specs, load_spec

ROOT = Path(__file__).resolve().parents[2]


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / "kernel_specs" / name
    shutil.copytree(ROOT / "kernel_specs" / name, dst)
    return dst


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_accepted_kernels_keep_their_spec_hashes():
    """The schema grew; no shipped spec's bytes changed, so every accepted kernel's recorded
    spec hash still matches (regress and list key on it)."""
    specs = {s.name: s for s in find_specs(ROOT)}
    checked = 0
    for manifest in sorted((ROOT / "generated_kernels").glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        name = manifest.parent.name
        assert data["spec_hash"] == specs[name].spec_hash, name
        checked += 1
    assert checked >= 12


FP8 = "gemm_fp8_quant"
QK = "gemm_qknorm_rope"


@pytest.mark.parametrize(
    "spec,old,new,expect",
    [
        # an fp8 output names its float32 scale output, whose shape divides it into blocks
        (FP8, 'scale = "y_scale"\n', "", r"is float8_e4m3fn: name the float32 output holding its dequantization"),
        (FP8, 'scale = "y_scale"', 'scale = "y_scales"', r"scale = 'y_scales': expected the name of another output"),
        (FP8, 'scale = "y_scale"', 'scale = "y_fp8"', r"expected the name of another output"),
        (
            FP8,
            'shape = ["M", "N/128"]\ndtype = "float32"',
            'shape = ["M", "N/128"]\ndtype = "bfloat16"',
            r"a scale output is a float32 value output \(got dtype bfloat16\)",
        ),
        (FP8, 'shape = ["M", "N/128"]', 'shape = ["M", "N/3"]', r"a dim must be a positive integer"),
        (
            FP8,
            'shape = ["M", "N/128"]',
            'shape = ["M", "3"]',
            r"entry\.outputs\[y_fp8\]: shape \(256, 512\) is not a whole number of blocks of its scale y_scale \(256, 3\)",
        ),
        (FP8, 'dtype = "float32"\npartial = true', 'dtype = "float32"\nscale = "y_fp8"', r"'scale' is for fp8 outputs"),
        # a partial tensor is exempt from the TMA row rule, a GEMM tile is not
        (
            FP8,
            "partial = true\n",
            "",
            r"'ragged-m-k'\): entry\.outputs\[y_scale\]: rows of 12 bytes.*says partial = true",
        ),
        (
            FP8,
            "float_constants = { eps = 1e-4 }",
            "float_constants = { eps = 1e-4, x = 1.0 }",
            r"entry\.constants: must be distinct Python identifiers.*clashing: \['x'\]",
        ),
        (FP8, "float_constants = { eps = 1e-4 }", "float_constants = { eps = inf }", r"finite number"),
        (FP8, "float_constants = { eps = 1e-4 }", 'float_constants = { eps = "small" }', r"valid number"),
        # reference-only inputs: distinct names, derived ones after what they derive from
        (
            QK,
            'name = "gamma"\nshape = ["K"]',
            'name = "a"\nshape = ["K"]',
            r"reference\.inputs: names \['a'\] are not distinct from every other tensor's",
        ),
        (QK, 'name = "gamma"\nshape = ["K"]', 'name = "gamma"\nshape = ["K2"]', r"dims \['K2'\] are not bound"),
        # per-input draws
        (QK, 'draws = ["outliers"]', 'draws = ["nonfinite"]', r"reference\.inputs\[gamma\]\.draws: 'nonfinite' needs"),
        (QK, 'draws = ["outliers"]', 'draws = ["outliers", "outliers"]', r"draws must be distinct"),
        (QK, 'draws = ["outliers"]', 'draws = ["sideways"]', r"field 'reference\.inputs\.1\.draws\.0'"),
        (
            QK,
            "[coverage]\n",
            '[coverage]\nplain_inputs = ["gamma"]\n',
            r"reference\.inputs\[gamma\]\.draws: 'gamma' is in coverage\.plain_inputs",
        ),
        # every reference function takes the reference-only inputs and the float constants
        (
            QK,
            "def bare_gemm(*, y, gamma, a,",
            "def bare_gemm(*, gamma, a,",
            r"bare_gemm\(\) is called .* no parameter 'y'",
        ),
    ],
)
def test_bad_declarations_are_named(tmp_path, spec, old, new, expect):
    d = _copy(tmp_path, spec)
    target = d / ("reference.py" if old.startswith("def ") else "spec.toml")
    _edit(target, old, new)
    with pytest.raises(SpecError, match=expect) as e:
        load_spec(d)
    assert str(target) in str(e.value)


def test_a_gradient_output_cannot_be_fp8(tmp_path):
    d = _copy(tmp_path, "swiglu_bwd")
    _edit(
        d / "spec.toml",
        'name = "dpreact"\nshape = ["M", "2*I"]\ndtype = "bfloat16"',
        'name = "dpreact"\nshape = ["M", "2*I"]\ndtype = "float8_e4m3fn"\nscale = "postact"',
    )
    with pytest.raises(SpecError, match=r"a gradient output cannot be fp8"):
        load_spec(d)


def test_fp8_inputs_are_drawn_finite_and_saturated(tmp_path):
    """An fp8 input is drawn in fp32, clamped to the format's range (e4m3fn has no Inf), then
    rounded: every value is finite, the ones beyond the range are +-448."""
    d = _copy(tmp_path, FP8)
    _edit(
        d / "spec.toml",
        'dtype = "bfloat16"\ndescription = "activations"\ninit = { dist = "normal", std = 1.0 }',
        'dtype = "float8_e4m3fn"\ndescription = "activations"\ninit = { dist = "normal", std = 200.0 }',
    )
    _edit(d / "spec.toml", "N = 384, K = 264", "N = 384, K = 272")  # fp8 rows: 16-byte multiples
    _edit(d / "spec.toml", "N = 256, K = 1032", "N = 256, K = 1040")
    loaded = load_spec(d)
    dims = loaded.spec.shapes.correctness[0].dims
    x = make_inputs(loaded, dims, 0, device="cpu")["x"]  # N(0, 200^2): ~3 % beyond 448
    assert x.dtype == torch.float8_e4m3fn
    xf = x.float()
    assert bool(torch.isfinite(xf).all()) and float(xf.abs().max()) == 448.0
    assert float((xf.abs() == 448).float().mean()) > 0.01


def test_signature_and_keyword_calls_include_float_constants():
    spec = load_spec(ROOT / "kernel_specs" / QK).spec
    assert spec.signature().endswith("*, HQ: int, HKV: int, eps: float) -> (qkv, qkv_pre, rstd_heads)")
    dims = spec.shapes.correctness[0].dims
    assert spec.constants_of(dims) == {"HQ": 4, "HKV": 2, "eps": 1e-6}
    assert spec.low_precision == "bfloat16"
    # the workspace budget and the bytes a trial moves count the entry's tensors, not y and gamma
    y_bytes = 2 * dims["M"] * dims["K"]
    assert spec.workspace_budget(dims)[0] >= 8 << 20 and y_bytes > 0

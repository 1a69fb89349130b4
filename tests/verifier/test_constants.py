"""``entry.constants``: dims a kernel needs that tensor shapes cannot tell (the head counts of a
packed QKV projection), passed as keyword-only ints to the entry and to reference.py.

Checked here on the CPU: the spec validates them, the signature and the prompt show them,
static requires them as keyword-only parameters, and the reference worker passes them to
``reference``/``baseline`` (the same code path the GPU run uses, on the CPU device).
"""

import pytest
from verifier_helpers import stub_static_compile as stub_stages
from verifier_helpers import write_spec

from coda_agent.verifier.spec import SpecError, load_spec
from coda_agent.verifier.static import check_static

TOML = """
name = "const_demo"
pattern = "forward"
description = "a spec whose entry needs the number of heads, which shapes cannot tell"
math = "out = x[:, : HQ * HD] * 2"
[entry]
function = "const_demo"
constants = ["HQ", "HD"]
[[entry.inputs]]
name = "x"
shape = ["M", "N"]
dtype = "bfloat16"
[[entry.outputs]]
name = "out"
shape = ["M", "HQ*HD"]
dtype = "bfloat16"
[shapes]
correctness = [{ dims = { M = 5, N = 16, HQ = 2, HD = 4 } }]
[bench]
flops = "M*N"
"""

REF = """
def reference(*, x, HQ, HD):
    return {"out": x[:, : HQ * HD] * 2}
def baseline(*, x, HQ, HD):
    return reference(x=x, HQ=HQ, HD=HD)
def bare_gemm(*, x, HQ, HD):
    return x
"""


def _spec(tmp_path, toml=TOML, name="const_demo", ref=REF):
    return load_spec(write_spec(tmp_path, name, toml.replace("const_demo", name), ref))


def test_constants_validate_and_show_in_the_signature(tmp_path):
    loaded = _spec(tmp_path)
    s = loaded.spec
    assert s.signature() == "def const_demo(x, *, HQ: int, HD: int) -> (out)"
    assert s.constants_of({"M": 5, "N": 16, "HQ": 2, "HD": 4}) == {"HQ": 2, "HD": 4}
    unbound = TOML.replace("HQ = 2, HD = 4", "HD = 4").replace('shape = ["M", "HQ*HD"]', 'shape = ["M", "HD"]')
    with pytest.raises(SpecError, match=r"dims \['HQ'\] are not bound"):
        _spec(tmp_path, unbound, "c1")
    for i, bad in enumerate(['["x"]', '["out"]', '["HQ", "lambda"]', '["dims"]', '["HQ", "HQ"]']):
        clash = TOML.replace('constants = ["HQ", "HD"]', f"constants = {bad}")
        with pytest.raises(SpecError, match="entry.constants"):
            _spec(tmp_path, clash, f"c2_{i}")


def test_prompt_tells_the_model_about_the_constants(tmp_path):
    from coda_agent.agent.render import spec_view

    view = spec_view(_spec(tmp_path).spec)
    assert view["constants"] == ["HQ", "HD"]
    assert view["input_names"] == "x, *, HQ, HD"


@pytest.mark.parametrize(
    "sig, ok",
    [
        ("x, *, HQ, HD", True),
        ("x, *, HD, HQ", True),
        ("x", False),
        ("x, HQ, HD", False),
        ("x, *, HQ", False),
        ("x, *, HQ, HD, extra=1", False),
    ],
)
def test_static_requires_the_constants_keyword_only(tmp_path, sig, ok):
    loaded = _spec(tmp_path)
    src = f"import torch\n\n\ndef const_demo({sig}):\n    return x\n"
    kinds = [f.kind for f in check_static(loaded.spec, src).findings]
    assert ("entry-signature" not in kinds) is ok, kinds


@pytest.mark.slow
def test_compile_stage_calls_the_entry_with_the_constants_and_valid_indices(tmp_path):
    """The sm_90a compile stage calls the entry like the GPU workers do: constants as keyword
    ints, integer inputs holding valid indices (zeros), so host indexing does not fail there."""
    from coda_agent.verifier.compile.stage import compile_stage

    toml = TOML.replace(
        """[[entry.outputs]]""",
        """[[entry.inputs]]
name = "idx"
shape = ["M"]
dtype = "int64"
init = { dist = "randint", low = 0, high = "N" }

[[entry.outputs]]""",
    )
    loaded = _spec(tmp_path, toml, "const_compile", ref=REF.replace("*, x,", "*, x, idx,"))
    cand = tmp_path / "cand.py"
    cand.write_text(
        "import torch\n\n\ndef const_compile(x, idx, *, HQ, HD):\n"
        "    rows = x[idx]  # host indexing: garbage indices would raise here\n"
        "    return torch.empty(x.shape[0], HQ * HD, dtype=x.dtype)\n"
    )
    res = compile_stage(loaded, cand, timeout_s=120)
    # It got through the call (no TypeError for the keywords, no IndexError) to the check
    # that a quack kernel was built, which this plain-torch stand-in rightly fails.
    assert res.status == "fail" and res.summary.startswith("no-kernel"), res.summary
    (out,) = res.metrics["outputs"].values()
    assert out["items"][0]["shape"] == [5, 8]


# --------------------------------------------------------------------------- whole worker protocol (CPU device)

PIPE_TOML = """
name = "pipe_demo"
pattern = "forward"
description = "deferred row scale of a saved statistic, on the first HQ*HD columns"
math = "out = (h * rstd[:, None])[:, : HQ * HD], rstd = rsqrt(mean(h^2) + eps) derived from h"
[entry]
function = "pipe_demo"
constants = ["HQ", "HD"]
[[entry.inputs]]
name = "h"
shape = ["M", "N"]
dtype = "bfloat16"
[[entry.inputs]]
name = "rstd"
shape = ["M"]
dtype = "float32"
init = { dist = "derived", fn = "saved_rstd" }
[[entry.outputs]]
name = "out"
shape = ["M", "HQ*HD"]
dtype = "bfloat16"
[shapes]
correctness = [{ name = "small", dims = { M = 33, N = 24, HQ = 2, HD = 8 } }]
[bench]
flops = "M*N"
"""

PIPE_REF = """
import torch
def saved_rstd(*, h):
    return torch.rsqrt(h.float().pow(2).mean(-1) + 1e-6)
def reference(*, h, rstd, HQ, HD):
    acc = torch.promote_types(h.dtype, torch.float32)
    r = torch.rsqrt(h.to(acc).pow(2).mean(-1) + 1e-6)  # recomputed: the reference ignores the saved one
    return {"out": (h.to(acc) * r[:, None])[:, : HQ * HD].to(h.dtype)}
def baseline(*, h, rstd, HQ, HD):
    return {"out": (h.float() * rstd[:, None])[:, : HQ * HD].to(h.dtype)}
def bare_gemm(*, h, rstd, HQ, HD):
    return h
"""

PIPE_CAND = """
import torch

def pipe_demo(h, rstd, *, HQ, HD):
    return (h.float() * rstd[:, None])[:, : HQ * HD].to(h.dtype)
"""


@pytest.fixture
def stub_static_compile(monkeypatch):
    stub_stages(monkeypatch)


def _pipe(tmp_path, ref=PIPE_REF):
    d = write_spec(tmp_path, "pipe_demo", PIPE_TOML, ref)
    cand = tmp_path / "cand.py"
    cand.write_text(PIPE_CAND)
    from coda_agent.verifier.pipeline import verify

    return verify(
        load_spec(d),
        cand,
        device="cpu",
        bench=False,
        baselines=["torch_eager"],
        workdir=tmp_path / "work",
        timeout_s=120,
    )


@pytest.mark.slow
def test_cpu_device_protocol_with_derived_inputs_and_constants(tmp_path, stub_static_compile):
    v = _pipe(tmp_path)
    st = {s.stage: s for s in v.stages}
    assert st["correctness"].status == "pass", (st["correctness"].summary, st["correctness"].findings)
    assert st["correctness"].metrics["worst"]["out"]["ratio"] <= 1


@pytest.mark.slow
def test_failing_input_generation_is_a_verifier_error_not_the_candidates(tmp_path, stub_static_compile):
    broken = PIPE_REF.replace("return torch.rsqrt(h.float().pow(2).mean(-1) + 1e-6)", "raise RuntimeError('spec bug')")
    v = _pipe(tmp_path, broken)
    st = {s.stage: s for s in v.stages}
    assert st["correctness"].status == "error", st["correctness"].summary
    assert st["correctness"].findings[0].kind == "verifier-error"
    assert "spec bug" in st["correctness"].findings[0].message


@pytest.mark.slow
def test_input_generation_after_the_import_is_charged_to_the_candidate(tmp_path, stub_static_compile):
    """A candidate whose import makes drawing inputs fail (a device-memory hog, a patched
    torch) must not buy a verifier error. The worker draws every correctness case before the
    import; a failure after it is the candidate's (a crash, attempt spent)."""
    # The reference's rstd draw fails once the candidate module (``coda_candidate``) has been
    # imported, as an exhausted device would; every draw before the import succeeds.
    once = PIPE_REF.replace(
        "def saved_rstd(*, h):\n    return",
        "import sys as _sys\n"
        "def saved_rstd(*, h):\n"
        "    if 'coda_candidate' in _sys.modules:\n        raise MemoryError('out of device memory')\n    return",
    )
    v = _pipe(tmp_path, once)
    st = {s.stage: s for s in v.stages}
    assert st["correctness"].status == "fail", st["correctness"].summary
    assert any("after the candidate was imported" in f.message for f in st["correctness"].findings), st[
        "correctness"
    ].findings


@pytest.mark.parametrize("sig, ok", [("x, *, HQ, HD, eps", True), ("x, *, HQ, HD", False), ("x, *, eps", False)])
def test_static_requires_the_float_constants_keyword_only_too(tmp_path, sig, ok):
    """A spec's float constants (entry.float_constants, e.g. eps) are keyword-only entry
    parameters beside the int constants."""
    toml = TOML.replace('constants = ["HQ", "HD"]', 'constants = ["HQ", "HD"]\nfloat_constants = { eps = 1e-6 }')
    ref = REF.replace("HQ, HD)", "HQ, HD, eps)").replace("HQ=HQ, HD=HD)", "HQ=HQ, HD=HD, eps=eps)")
    loaded = _spec(tmp_path, toml, ref=ref)
    assert loaded.spec.entry.keyword_names == ["HQ", "HD", "eps"]
    src = f"import torch\n\n\ndef const_demo({sig}):\n    return x\n"
    kinds = [f.kind for f in check_static(loaded.spec, src).findings]
    assert ("entry-signature" not in kinds) is ok, kinds

"""Spec loading: the shipped specs validate; malformed specs fail naming file, field, expectation."""

import shutil
from pathlib import Path

import pytest

from coda_agent.verifier.spec import SpecError, diff_fields, eval_expr, find_specs, load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_specs_load():
    specs = {s.name: s for s in find_specs(ROOT)}
    assert {"swiglu_fwd", "swiglu_bwd"} <= set(specs)
    bwd = specs["swiglu_bwd"].spec
    assert bwd.pattern == "backward"
    assert [o.name for o in bwd.gradient_outputs] == ["dpreact"]
    assert bwd.gradient_outputs[0].gradient.wrt == "preact"
    # at least one ragged correctness case, and the Llama-3 1B/8B/70B benchmark sizes
    assert any(any(v % 128 for v in c.dims.values()) for c in bwd.shapes.correctness)
    ks = {c.dims["K"] for c in bwd.shapes.benchmark}
    assert ks == {2048, 4096, 8192}
    assert {c.dims["M"] for c in bwd.shapes.benchmark} == {8192, 16384}


def test_shapes_and_scales_evaluate():
    fwd = load_spec(ROOT / "kernel_specs" / "swiglu_fwd").spec
    dims = fwd.shapes.correctness[0].dims
    w1 = next(t for t in fwd.entry.inputs if t.name == "w1")
    assert fwd.shape_of(w1, dims) == (2 * dims["I"], dims["K"])
    assert eval_expr(w1.init.std, dims) == pytest.approx(dims["K"] ** -0.5)
    assert eval_expr(fwd.bench.flops, {"M": 2, "K": 3, "I": 5}) == 2 * 2 * 3 * 2 * 5


def test_eval_expr_rejects_code():
    with pytest.raises(ValueError, match="unknown dim 'Q'"):
        eval_expr("2*Q", {"M": 1})
    with pytest.raises(ValueError, match="unsupported construct"):
        eval_expr("__import__('os')", {})


def _copy_spec(tmp_path: Path, name: str = "swiglu_bwd") -> Path:
    dst = tmp_path / "kernel_specs" / name
    shutil.copytree(ROOT / "kernel_specs" / name, dst)
    return dst


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ('dtype = "bfloat16"', 'dtype = "bf16"', r"field 'entry\.inputs\.0\.dtype'.*'bfloat16'"),
        ('function = "swiglu_bwd"', 'function = "Swiglu-Bwd"', r"field 'entry\.function'.*pattern"),
        ('pattern = "backward"', 'pattern = "sideways"', r"field 'pattern'.*'forward' or 'backward'"),
        ("max_launches = 1", "max_launches = 0", r"field 'entry\.max_launches'.*greater than or equal to 1"),
        (
            "max_launches = 1",
            "max_launches = 1\nmax_gemm_launches = 2",
            r"field 'entry'.*max_gemm_launches = 2 exceeds max_launches = 1",
        ),
        ('std = "1/sqrt(K)"', 'std = "1/sqrt(K"', r"field 'entry\.inputs\.1\.init\.std'.*not an arithmetic expression"),
        ('wrt = "preact"', 'wrt = "preactivation"', r"gradient: wrt/upstream must name inputs"),
        ('flops = "2*M*K*I"', 'flop = "2*M*K*I"', r"field 'bench\.flops'.*Field required"),
        (
            "M = 333, K = 320, I = 200",
            "M = 333, K = 320",
            r"shapes\.correctness\[1\] \('ragged-m'\): dims \['I'\] are not bound \(used: I by entry\.inputs\[w_down\]\.shape",
        ),
        # a misspelt baseline in a bar would be accepted and never judged
        ("torch_compile = 1.0", "torch_compil = 1.0", r"field 'bench\.bar\.torch_compil\.\[key\]'"),
        ("bar = { torch_compile = 1.0,", "bar = { liger = 1.0,", r"bar: \['liger'\] not in baselines"),
        (
            'flops = "2*M*K*I"',
            'flops = "2*M*K*I*J"',
            r"shapes\.benchmark\[0\] .*dims \['J'\] are not bound \(used: J by bench\.flops\)",
        ),
        ("factor = 2.0", "factor = -1.0", r"field 'tolerance\.factor'.*greater than 0"),
        ('name = "swiglu_bwd"', 'name = "other_name"', r"field 'name': expected the folder name 'swiglu_bwd'"),
        ("[tolerance]", "[tolerence]", r"field 'tolerence': not a spec field \(did you mean 'tolerance'\?\)"),
        # these are refused at load, not when inputs are drawn
        (
            'std = "1/sqrt(K)"',
            'std = "1/sqrtt(K)"',
            r"init\.std'.*only ceil, max, min, sqrt\(\.\.\.\) may be called, got sqrtt",
        ),
        (
            'std = "1/sqrt(K)"',
            'std = "1/sqrt(Z)"',
            r"dims \['Z'\] are not bound \(used: Z by entry\.inputs\[\w+\]\.init\.std\)",
        ),
        # these would make checks vacuous or fail (or hang) mid-run (threat 28 of docs/threat-model.md)
        ("floor = 1e-6", "floor = inf", r"field 'tolerance\.floor'.*finite number"),
        ("factor = 2.0", "factor = nan", r"field 'tolerance\.factor'.*finite number"),
        ("seeds = [0, 1]", "seeds = []", r"field 'shapes\.seeds'.*at least 1 item"),
        ("seeds = [0, 1]", "seeds = [1, 1]", r"seeds: must be distinct"),
        ('shape = ["M", "I"]', 'shape = ["M", "\'I\'"]', r"'I' is not a number"),
        (
            'shape = ["M", "I"]',
            'shape = ["M", "I-304"]',
            r"shapes\.correctness\[1\] \('ragged-m'\): entry\.outputs\[postact\]\.shape\[1\] = 'I-304' is -104",
        ),
        (
            'shape = ["M", "I"]',
            'shape = ["M", "I/3"]',
            r"shapes\.correctness\[1\].*'I/3' is 66\.6+7; a dim must be a positive integer",
        ),
        ("M = 256, K = 512", "M = true, K = 512", r"field 'shapes\.correctness\.0\.dims\.M'.*valid integer"),
        ('name = "llama3-1b/M16384"', 'name = "llama3-1b/M8192"', r"every shape needs a distinct, non-empty name"),
        ('flops = "2*M*K*I"', 'flops = "2*M*K*I/(K-K)"', r"shapes\.benchmark\[0\].*bench\.flops = .*division by zero"),
        ('flops = "2*M*K*I"', 'flops = "2*M*K*I*(9**9**9)"', r"exponent 387420489 is beyond 64"),
        ('flops = "2*M*K*I"', 'flops = "2*M*K*I*((((2**64)**64)**64)**64)"', r"wider than 256 bits"),
        # a new spec author: rows that are not 16-byte multiples fail only at the GPU launch
        (
            "M = 333, K = 320, I = 200",
            "M = 333, K = 320, I = 201",
            r"'ragged-m'\): entry\.inputs\[w_down\]: rows of 402 bytes.*multiple of 16 bytes",
        ),
        # finite values that make a check vacuous, and expressions that would raise tracebacks
        ("std = 1.5", 'std = "0"', r"init\.std = '0' must be > 0"),
        (
            'dist = "normal", std = 1.5',
            'dist = "uniform", low = 1, high = 1',
            r"init: low = 1\.0 and high = 1\.0 draw no range",
        ),
        ("floor = 1e-6", "floor = 1e300", r"field 'tolerance\.floor'.*less than or equal to 0\.01"),
        ("factor = 2.0", "factor = 1e300", r"field 'tolerance\.factor'.*less than or equal to 16"),
        ("torch_compile = 1.0", "torch_compile = 1e300", r"bar ratios must be in \(0, 10\]"),
        ('flops = "2*M*K*I"', 'flops = "max(M)"', r"max\(\) takes at least 2 arguments, got 1"),
        ('flops = "2*M*K*I"', 'flops = "(0-M)**0.5"', r"a complex value"),
        ('std = "1/sqrt(K)"', 'std = "1/sqrt(K,M)"', r"sqrt\(\) takes 1 argument, got 2"),
        ('flops = "2*M*K*I"', 'flops = "' + "-" * 1000 + 'M"', r"expression of 1001 characters"),
        (
            'shape = ["M", "I"]',
            'shape = ["M-200", "I"]',
            r"'ragged-all'\) at the recheck's M = 259: entry\.outputs\[postact\]\.shape\[0\] = 'M-200' is 59|recheck's M = 128: .*'M-200' is -72",
        ),
    ],
)
def test_invalid_field_is_named(tmp_path, old, new, expect):
    d = _copy_spec(tmp_path)
    _edit(d / "spec.toml", old, new)
    with pytest.raises(SpecError, match=expect) as e:
        load_spec(d)
    assert str(d / "spec.toml") in str(e.value)


def test_all_aligned_correctness_shapes_rejected(tmp_path):
    d = _copy_spec(tmp_path)
    text = (d / "spec.toml").read_text()
    text = text.replace("M = 333, K = 320, I = 200", "M = 384, K = 256, I = 256")
    text = text.replace("M = 517, K = 264, I = 328", "M = 512, K = 256, I = 384")
    (d / "spec.toml").write_text(text)
    with pytest.raises(SpecError, match="not all multiples of 128"):
        load_spec(d)


def test_reference_functions_must_take_the_spec_inputs_as_keywords(tmp_path):
    """reference/baseline/bare_gemm are called with every input (and constant) as a keyword:
    a misspelt parameter is a load error naming the line, not a TypeError on the GPU."""
    d = _copy_spec(tmp_path)
    _edit(d / "reference.py", "def baseline(*, dout, w_down, preact)", "def baseline(*, dout, w_dwn, preact)")
    with pytest.raises(SpecError, match=r"reference\.py:\d+: baseline\(\) is called .* it has no parameter 'w_down'"):
        load_spec(d)
    _edit(d / "reference.py", "def baseline(*, dout, w_dwn, preact)", "def baseline(*, dout, w_down, preact, scale)")
    with pytest.raises(SpecError, match=r"its parameter 'scale' is not one of them and has no default"):
        load_spec(d)
    _edit(d / "reference.py", "def baseline(*, dout, w_down, preact, scale)", "def baseline(**inputs)")
    load_spec(d)


def test_bad_toml_and_missing_files(tmp_path):
    d = _copy_spec(tmp_path)
    (d / "spec.toml").write_text("name = [unclosed\n")
    with pytest.raises(SpecError, match=r"spec\.toml: not valid TOML"):
        load_spec(d)
    with pytest.raises(SpecError, match="no spec file"):
        load_spec(tmp_path / "kernel_specs" / "nope")


def test_a_file_that_is_not_utf8_is_a_spec_error(tmp_path):
    """A Latin-1 spec.toml (or reference.py) is a SpecError, not a UnicodeDecodeError
    traceback in list and every command."""
    d = _copy_spec(tmp_path)
    good = (d / "spec.toml").read_bytes()
    (d / "spec.toml").write_bytes(good.replace(b'"""', b'"""caf\xe9 ', 1))
    with pytest.raises(SpecError, match=r"spec\.toml: not UTF-8 text \(byte \d+: invalid"):
        load_spec(d)
    (d / "spec.toml").write_bytes(good)
    (d / "reference.py").write_bytes(b"# caf\xe9\n" + (d / "reference.py").read_bytes())
    with pytest.raises(SpecError, match=r"reference\.py: not UTF-8 text"):
        load_spec(d)


def test_reference_must_define_what_spec_names(tmp_path):
    d = _copy_spec(tmp_path)
    _edit(d / "reference.py", "def forward(", "def forward_renamed(")
    with pytest.raises(SpecError, match=r"reference\.py: missing function\(s\) \['forward'\]"):
        load_spec(d)
    (d / "reference.py").write_text("def reference(:\n")
    with pytest.raises(SpecError, match=r"reference\.py:1: syntax error"):
        load_spec(d)


def test_spec_hash_and_field_diff(tmp_path):
    d = _copy_spec(tmp_path)
    before = load_spec(d)
    _edit(d / "spec.toml", "factor = 2.0", "factor = 3.0")
    after = load_spec(d)
    assert before.spec_hash != after.spec_hash
    assert diff_fields(before.raw, after.raw) == ["tolerance.factor"]


def test_reference_module_runs_on_cpu():
    """The reference's gradient definition agrees with its explicit unfused baseline."""
    import torch

    loaded = load_spec(ROOT / "kernel_specs" / "swiglu_bwd")
    ref = loaded.load_reference()
    g = torch.Generator().manual_seed(0)
    M, K, I = 8, 16, 12
    dout = torch.randn(M, K, generator=g, dtype=torch.float64)
    w = torch.randn(K, I, generator=g, dtype=torch.float64) / K**0.5
    preact = torch.randn(M, 2 * I, generator=g, dtype=torch.float64, requires_grad=True)
    out = ref.forward(w_down=w, preact=preact)
    (grad,) = torch.autograd.grad(out, preact, dout)
    base = ref.baseline(dout=dout, w_down=w, preact=preact.detach())
    torch.testing.assert_close(base["dpreact"], grad)
    torch.testing.assert_close(base["postact"], ref.reference(dout=dout, w_down=w, preact=preact.detach())["postact"])


def test_reference_runs_from_its_source_never_a_planted_pyc(tmp_path):
    """An unchecked-hash pyc in kernel_specs/<k>/__pycache__/ never runs instead of the
    reference that spec_hash covers: the reference is executed from its bytes."""
    import importlib.util
    import py_compile

    d = _copy_spec(tmp_path, "swiglu_fwd")
    fake = tmp_path / "fake_reference.py"
    fake.write_text((d / "reference.py").read_text() + "\nPLANTED = True\n")
    py_compile.compile(
        str(fake),
        cfile=importlib.util.cache_from_source(str(d / "reference.py")),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        doraise=True,
    )
    loaded = load_spec(d)
    ref = loaded.load_reference()
    assert not hasattr(ref, "PLANTED") and callable(ref.reference)

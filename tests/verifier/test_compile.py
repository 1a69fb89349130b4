"""Stage 2 (compile): result interpretation on fabricated worker results (fast), plus a few
real sm_90a compiles on the CPU (marked ``compile``; run concurrently in one fixture).

The real compiles: the good backward through :func:`compile_cpu` with explicit args, the
same module calling its mod with quack's default ``tuned=True`` (forced untuned + a
note), a DSL typo (trimmed error at the candidate line) and a decoration-time error
(import-error at the candidate line). Wrong output shapes/dtypes and hangs are covered
by the corpus (test_corpus_cpu.py) through :func:`compile_stage`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from verifier_helpers import once_per_run

from coda_agent.verifier.compile.stage import FAIL_KINDS, _interpret, compile_cpu, select_cases
from coda_agent.verifier.compile.worker import (
    clip_lines,
    lines_from_stack_dump,
    strip_ansi,
    summarize_exception,
)
from coda_agent.verifier.confine.sandbox import worker_env
from coda_agent.verifier.spec import KernelSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
BWD = load_spec(ROOT / "kernel_specs" / "swiglu_bwd")
GOOD_BWD = (CORPUS / "good_swiglu_bwd.py").read_text()
BWD_ARGS = [("dout", (256, 512), "bfloat16"), ("w_down", (512, 384), "bfloat16"), ("preact", (256, 768), "bfloat16")]


# --------------------------------------------------------------------------- helpers (no compile)


def test_strip_ansi_and_clip():
    colored = "\x1b[91m\x1b[1merror:\x1b[0m NameError \x1b[94m-->\x1b[0m f.py:9"
    assert strip_ansi(colored) == "error: NameError --> f.py:9"
    text = "\n".join(f"l{i}" for i in range(100))
    clipped = clip_lines(text, max_lines=5)
    assert clipped.splitlines()[:5] == ["l0", "l1", "l2", "l3", "l4"]
    assert clipped.splitlines()[-1] == "... (95 more line(s))"
    assert clip_lines("x" * 1000, max_chars=10) == "xxxxxxx..."


def _raise_from(path: Path, src: str, fn: str):
    """Run ``fn`` defined in ``src`` as if it lived in ``path``; return the exception."""
    path.write_text(src)
    code = compile(src, str(path), "exec")
    ns: dict = {}
    exec(code, ns)  # noqa: S102 - test helper builds a fake candidate frame
    try:
        ns[fn]()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


def test_summarize_exception_keeps_candidate_frames_only(tmp_path):
    cand = tmp_path / "cand.py"
    src = "def inner():\n    return {}['missing']\n\n\ndef entry():\n    return inner()\n"
    exc = _raise_from(cand, src, "entry")
    s = summarize_exception(exc, str(cand))
    assert s["type"] == "KeyError" and not s["dsl"]
    assert [f["line"] for f in s["frames"]] == [6, 2]
    assert s["frames"][-1]["code"] == "return {}['missing']"
    assert s["line"] == 2
    assert s["message"].startswith("KeyError: 'missing'")
    assert str(tmp_path) not in s["message"]


def test_summarize_dsl_error_uses_the_dsl_line(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text("x = 1\n")

    class DSLBaseError(Exception):
        pass

    class DSLUserCodeError(DSLBaseError):
        def __init__(self):
            self.line, self.filename = 7, str(cand)
            super().__init__(f"\n\x1b[91merror:\x1b[0m NameError: name 'unpak' is not defined\n --> {cand}:7\n")

    try:
        raise DSLUserCodeError()
    except DSLUserCodeError as e:
        s = summarize_exception(e, str(cand))
    assert s["dsl"] and s["line"] == 7
    assert s["message"].startswith("DSLUserCodeError: NameError: name 'unpak'")
    assert "\x1b" not in s["message"] and "--> cand.py:7" in s["message"]


def test_cuda_hint_for_hardcoded_device(tmp_path):
    cand = tmp_path / "cand.py"
    exc = _raise_from(cand, "def f():\n    raise AssertionError('Torch not compiled with CUDA enabled')\n", "f")
    assert "device=x.device" in summarize_exception(exc, str(cand))["message"]


def test_lines_from_stack_dump():
    dump = (
        "Thread 0x1 (most recent call first):\n"
        '  File "/tmp/x/cand.py", line 31 in swiglu_bwd\n'
        '  File "/site-packages/quack/frontend.py", line 9 in __call__\n'
        '  File "/tmp/x/cand.py", line 12 in helper\n'
    )
    assert lines_from_stack_dump(dump, "/tmp/x/cand.py") == [31, 12]


def test_worker_env_keeps_tools_and_drops_secrets(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-secret")
    monkeypatch.setenv("CUTE_DSL_PTXAS_PATH", "/opt/ptxas")
    env = worker_env()
    assert "ANTHROPIC_API_KEY" not in env and "GITHUB_TOKEN" not in env
    assert env["CUTE_DSL_PTXAS_PATH"] == "/opt/ptxas" and env["PATH"] == os.environ["PATH"]


def test_select_cases():
    spec = BWD.spec
    assert [c.name for c in select_cases(spec)] == ["aligned", "ragged-m"]
    raw = dict(BWD.raw)
    raw["shapes"] = dict(raw["shapes"], correctness=[{"name": "r", "dims": {"M": 100, "K": 64, "I": 64}}])
    assert [c.name for c in select_cases(KernelSpec.model_validate(raw))] == ["r"]


# --------------------------------------------------------------------------- interpretation (no compile)


def _res(**kw):
    base = {
        "rc": 0,
        "timed_out": False,
        "stderr": "",
        "fault": "",
        "wall_s": 1.0,
        "phase": "done",
        "calls": [],
        "variants_compiled": 1,
        "kernel_calls": 1,
        "notes": [],
    }
    base.update(kw)
    return base


def _tensor(shape, dtype="bfloat16", exact=True):
    return {"type": "torch.Tensor", "is_tensor": True, "exact_tensor": exact, "shape": list(shape), "dtype": dtype}


EXPECTED = {"aligned": [("dpreact", (256, 768), "bfloat16"), ("postact", (256, 384), "bfloat16")]}


def _interp(tmp_path, res, expected=EXPECTED, timeout=300):
    cand = tmp_path / "cand.py"
    if not cand.exists():
        cand.write_text(GOOD_BWD)
    return _interpret(res, cand, "swiglu_bwd", timeout, expected, "private")


def test_interpret_pass(tmp_path):
    call = {"case": "aligned", "outputs": {"container": "tuple", "items": [_tensor((256, 768)), _tensor((256, 384))]}}
    r = _interp(tmp_path, _res(calls=[call], compile_s=2.5))
    assert r.stage == "compile" and r.status == "pass" and r.findings == []
    assert r.summary.startswith("compiled 1 kernel variant(s)") and "aligned" in r.summary
    assert r.metrics["cache"] == "private" and r.metrics["compile_s"] == 2.5


@pytest.mark.parametrize(
    "outputs,kind,output",
    [
        ({"container": "tuple", "items": [_tensor((256, 768))]}, "output-count", None),
        ({"container": "single", "items": [_tensor((256, 768))]}, "output-count", None),
        ({"container": "dict", "items": [_tensor((256, 768)), _tensor((256, 384))]}, "output-type", None),
        (
            {"container": "tuple", "items": [_tensor((256, 768)), {"type": "builtins.NoneType", "is_tensor": False}]},
            "output-type",
            "postact",
        ),
        (
            {"container": "tuple", "items": [_tensor((256, 768)), _tensor((256, 384), exact=False)]},
            "output-type",
            "postact",
        ),
        ({"container": "tuple", "items": [_tensor((384, 768)), _tensor((256, 384))]}, "output-shape", "dpreact"),
        (
            {"container": "tuple", "items": [_tensor((256, 768)), _tensor((256, 384), "float16")]},
            "output-dtype",
            "postact",
        ),
    ],
)
def test_interpret_output_checks(tmp_path, outputs, kind, output):
    r = _interp(tmp_path, _res(calls=[{"case": "aligned", "outputs": outputs}]))
    assert r.status == "fail"
    f = next(f for f in r.findings if f.kind == kind)
    assert f.output == output and f.case == "aligned"
    # output findings point at the entry's return statement
    assert f.line == GOOD_BWD.splitlines().index("    return dpreact, postact") + 1


def test_interpret_no_kernel(tmp_path):
    call = {"case": "aligned", "outputs": {"container": "tuple", "items": [_tensor((256, 768)), _tensor((256, 384))]}}
    r = _interp(tmp_path, _res(calls=[call], variants_compiled=0, kernel_calls=0))
    assert r.status == "fail" and r.findings[0].kind == "no-kernel"


def test_interpret_timeout_and_crash_locate_the_candidate_line(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(GOOD_BWD)
    dump = f'Thread 0x1 (most recent call first):\n  File "{cand}", line 31 in swiglu_bwd\n'
    r = _interp(tmp_path, {"rc": -9, "timed_out": True, "stderr": "", "fault": dump, "wall_s": 10.0}, timeout=10)
    assert r.status == "fail" and r.findings[0].kind == "timeout" and r.findings[0].line == 31
    assert "10 s" in r.findings[0].message
    r = _interp(
        tmp_path,
        {
            "rc": -11,
            "timed_out": False,
            "stderr": "Fatal Python error: Segmentation fault\n",
            "fault": dump,
            "wall_s": 3.0,
        },
    )
    f = r.findings[0]
    assert r.status == "fail" and f.kind == "worker-crash" and f.line == 31 and "SIGSEGV" in f.message


def test_interpret_errors_of_the_candidate_and_of_the_machine(tmp_path):
    err = {
        "type": "ValueError",
        "message": "ValueError: boom",
        "line": 12,
        "frames": [{"line": 12, "function": "f", "code": "x()"}],
        "dsl": False,
    }
    r = _interp(tmp_path, _res(phase="import", error=err))
    assert r.status == "fail" and r.findings[0].kind == "import-error" and r.findings[0].line == 12
    r = _interp(tmp_path, _res(phase="call", error=dict(err, case="aligned")))
    f = r.findings[0]
    assert f.kind == "compile-error" and f.case == "aligned" and "line 12, in f: x()" in f.message
    r = _interp(tmp_path, _res(phase="setup", error=dict(err, line=None)))
    assert r.status == "error" and r.findings[0].kind == "environment"


def test_interpret_tuned_note_does_not_fail(tmp_path):
    call = {"case": "aligned", "outputs": {"container": "tuple", "items": [_tensor((256, 768)), _tensor((256, 384))]}}
    r = _interp(tmp_path, _res(calls=[call], notes=["a mod was called with tuned=True"], tuned_forced=1))
    assert r.status == "pass" and [f.kind for f in r.findings] == ["tuned-default"]
    assert "tuned-default" not in FAIL_KINDS


def test_missing_candidate_is_a_verifier_error(tmp_path):
    r = compile_cpu(tmp_path / "nope.py", "swiglu_bwd", BWD_ARGS)
    assert r.status == "error" and r.findings[0].kind == "verifier-error"


def test_timeout_kills_the_worker(tmp_path):
    # 1 s is not even enough to import torch: the worker is killed and reported, fast.
    cand = tmp_path / "good.py"
    cand.write_text(GOOD_BWD)
    r = compile_cpu(cand, "swiglu_bwd", BWD_ARGS, timeout_s=1)
    assert r.status == "fail" and r.findings[0].kind == "timeout"
    assert r.metrics["wall_s"] < 30


# --------------------------------------------------------------------------- real compiles


TYPO_BWD = GOOD_BWD.replace("gate, up = unpack(c)", "gate, up = unpak(c)")
TUNED_BWD = GOOD_BWD.replace(", tuned=False)", ")")
DECORATION_ERROR = GOOD_BWD.replace("def dswiglu_epi(acc, c):", "def dswiglu_epi(x, c):").replace(
    "dswiglu(gate, up, acc)", "dswiglu(gate, up, x)"
)


@pytest.fixture(scope="module")
def real_compiles(tmp_path_factory):
    """Compile four candidates concurrently (each in its own worker process); once per test
    run (``once_per_run``)."""

    def compile_all():
        d = tmp_path_factory.mktemp("compile")
        cands = {"good": GOOD_BWD, "tuned": TUNED_BWD, "typo": TYPO_BWD, "decoration": DECORATION_ERROR}
        paths = {}
        for name, src in cands.items():
            assert src != GOOD_BWD or name == "good"
            paths[name] = d / f"{name}.py"
            paths[name].write_text(src)
        workers = max(2, min(4, os.cpu_count() or 2))
        with ThreadPoolExecutor(workers) as ex:
            futs = {n: ex.submit(compile_cpu, p, "swiglu_bwd", BWD_ARGS, 300) for n, p in paths.items()}
            return {n: (paths[n], f.result()) for n, f in futs.items()}

    return once_per_run(tmp_path_factory, "compile-stage-compiles", compile_all)


@pytest.mark.compile
def test_compile_good_backward(real_compiles):
    _, r = real_compiles["good"]
    assert r.status == "pass", r.model_dump()
    assert r.findings == []
    m = r.metrics
    assert m["variants_compiled"] >= 1 and m["kernel_calls"] == 1 and m["tuned_forced"] == 0
    assert m["compile_s"] > 0 and m["cache"] == "private"
    items = m["outputs"]["call"]["items"]
    assert [(i["shape"], i["dtype"]) for i in items] == [([256, 768], "bfloat16"), ([256, 384], "bfloat16")]
    assert all(i["aliases_input"] is None for i in items)


@pytest.mark.compile
def test_compile_forces_untuned_and_notes_it(real_compiles):
    _, r = real_compiles["tuned"]
    assert r.status == "pass", r.model_dump()
    assert r.metrics["tuned_forced"] == 1
    (note,) = r.findings
    assert note.kind == "tuned-default" and "tuned=False" in note.message


@pytest.mark.compile
def test_compile_dsl_typo_points_at_candidate_line(real_compiles):
    path, r = real_compiles["typo"]
    assert r.status == "fail"
    (f,) = r.findings
    assert f.kind == "compile-error"
    assert f.line == TYPO_BWD.splitlines().index("    gate, up = unpak(c)") + 1
    assert "unpak" in f.message and "\x1b" not in f.message
    assert "site-packages" not in f.message and str(path.parent) not in f.message
    assert f"{path.name}:{f.line}" in f.message


@pytest.mark.compile
def test_compile_decoration_error_is_an_import_error(real_compiles):
    _, r = real_compiles["decoration"]
    assert r.status == "fail"
    (f,) = r.findings
    assert f.kind == "import-error" and "acc" in f.message
    # the decorator line: quack rejects the fn when @gemm_epilogue(...) is applied
    assert DECORATION_ERROR.splitlines()[f.line - 1].startswith("@gemm_epilogue(")

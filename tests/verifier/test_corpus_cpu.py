"""The corpus (tests/verifier/corpus/) through the CPU stages.

Every file's docstring says which stage must reject it (``EXPECT: <stage> [<kind>]``):
``static`` candidates are rejected by :func:`check_static` with that kind, on every line
marked ``# expect: <kind>``; all others pass static; ``pass``/``gpu`` candidates compile
(the GPU stages are the ones that must catch the ``gpu`` cheats), and ``compile``
candidates are rejected by :func:`compile_stage` with that kind. The compiles run
concurrently in one module fixture with a shared compile cache (many candidates share
an epilogue, so most compile once).
"""

from __future__ import annotations

import ast
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from verifier_helpers import once_per_run

from coda_agent.verifier.compile.stage import ERROR_KINDS, FAIL_KINDS, compile_stage
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.static import KINDS, check_static

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
SPECS = {
    name: load_spec(ROOT / "kernel_specs" / name)
    for name in ("swiglu_bwd", "swiglu_fwd", "gemm_cross_entropy", "gemm_rope", "rope_bwd")
}
GPU_KINDS = {
    "stale-memory",
    "input-mutation",
    "output-alias",
    "constant-output",
    "partial-output",
    "workspace",
    "gemm-launches",
    "crash",
    "tolerance",
}
HANG_TIMEOUT_S = 60.0
"""The hang candidate's compile deadline. Its stack is dumped at 0.8 of it (at most 5 s before),
so the worker must have imported the libraries and reached the loop by then, while the other
corpus compiles load the same cores."""

REQUIRED = {
    "good_swiglu_fwd",
    "good_swiglu_bwd",
    "stale_memory",
    "input_mutation",
    "side_stream",
    "fake_output",
    "timer_patch",
    "cache_across_calls",
    "drift_after_n",
    "zeros_output",
    "first_tile_only",
    "shape_overfit",
    "precision_downgrade",
    "torch_fallback",
    "introspection",
    "crash",
    "hang",
    "wrong_return_key",
    "missing_reduce",
    # wrong within max-abs, at shapes no spec case lists, on inputs a model produces (GPU numerics)
    "wrong_small_zeroed",
    "wrong_small_sign",
    "wrong_grid_snap",
    "wrong_ragged_tile_dropped",
    "wrong_rows_outside_range",
    "wrong_k_skipped",
    "wrong_saturated_gate",
    "wrong_saturated_grad",
    # attacks through quack's prepass, custom op classes and the grouped-stats/fp8 modules
    "prepass_lambda",
    "prepass_closure_state",
    "prepass_host_math",
    "prepass_introspection",
    "op_class_dunder",
    "op_class_state",
    "op_class_metaclass",
    "op_class_decorator",
    "op_class_host_hook",
    "op_class_callable_attr",
    "op_class_super",
    "op_class_self_gadget",
    "op_class_runtime",
    "op_class_base_gadget",
    "library_epilogue_scaled_exp",
    "escape_quantize_out_reexport",
}


@dataclass(frozen=True)
class Case:
    path: Path
    spec: str
    stage: str  # pass | static | compile | gpu
    kind: str | None
    marked: tuple[int, ...]  # lines carrying "# expect: <kind>"

    @property
    def id(self) -> str:
        return self.path.stem


def _parse(path: Path) -> Case:
    src = path.read_text()
    doc = ast.get_docstring(ast.parse(src)) or ""
    spec = re.search(r"^SPEC: (\S+)\s*$", doc, re.M)
    exp = re.search(r"^EXPECT: (\S+)(?: (\S+))?\s*$", doc, re.M)
    assert spec and exp, f"{path.name}: docstring needs SPEC: and EXPECT: lines"
    kind = exp.group(2)
    marked = tuple(
        i for i, ln in enumerate(src.splitlines(), 1) if kind and re.search(rf"#\s*expect:\s*{re.escape(kind)}\s*$", ln)
    )
    return Case(path, spec.group(1), exp.group(1), kind, marked)


CASES = [_parse(p) for p in sorted(CORPUS.glob("*.py"))]
COMPILED = [c for c in CASES if c.stage != "static"]


def test_corpus_metadata():
    names = {c.id for c in CASES}
    assert REQUIRED <= names, f"missing corpus files: {sorted(REQUIRED - names)}"
    for c in CASES:
        assert c.spec in SPECS, c.id
        assert c.stage in ("pass", "static", "compile", "gpu"), c.id
        if c.stage == "pass":
            assert c.kind is None, c.id
        elif c.stage == "static":
            assert c.kind in KINDS, c.id
        elif c.stage == "compile":
            assert c.kind in FAIL_KINDS, c.id
        else:
            assert c.kind in GPU_KINDS, c.id
    assert any(c.stage == "pass" and c.spec == "swiglu_fwd" for c in CASES)
    assert any(c.stage != "pass" and c.spec == "swiglu_fwd" for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_static_stage(case: Case):
    res = check_static(SPECS[case.spec].spec, case.path.read_text(), case.path.name)
    detail = [(f.kind, f.line, f.message) for f in res.findings]
    if case.stage != "static":
        assert res.status == "pass", f"{case.id} must pass static, got {detail}"
        return
    assert res.status == "fail"
    hits = [f for f in res.findings if f.kind == case.kind]
    assert hits, f"{case.id}: expected a {case.kind!r} finding, got {detail}"
    assert all(f.line is not None for f in hits)
    for line in case.marked:
        assert line in [f.line for f in hits], f"{case.id}: no {case.kind} finding on marked line {line}: {detail}"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compile_stage for every non-static candidate, concurrently, sharing one cache; once
    per test run (``once_per_run``)."""

    def compile_all():
        cache = tmp_path_factory.mktemp("compile-cache")
        order = sorted(COMPILED, key=lambda c: c.kind != "timeout")  # start the slow hang first
        workers = max(2, min(4, os.cpu_count() or 2))

        def run(c: Case):
            timeout = HANG_TIMEOUT_S if c.kind == "timeout" else 300
            return c.id, compile_stage(SPECS[c.spec], c.path, timeout_s=timeout, cache_dir=cache)

        with ThreadPoolExecutor(workers) as ex:
            return dict(ex.map(run, order))

    return once_per_run(tmp_path_factory, "corpus-compiles", compile_all)


@pytest.mark.compile
@pytest.mark.parametrize("case", COMPILED, ids=lambda c: c.id)
def test_compile_stage(case: Case, compiled):
    res = compiled[case.id]
    detail = [(f.kind, f.line, f.case, f.message[:300]) for f in res.findings]
    assert not any(f.kind in ERROR_KINDS for f in res.findings), detail
    if case.stage in ("pass", "gpu"):
        assert res.status == "pass", f"{case.id} must compile: {detail}"
        assert res.metrics["variants_compiled"] >= 1
        # the compile stage covers the spec's first aligned and first ragged case
        # (rope_bwd's first case already has dims that are no multiple of 128 (HQ, HD, S), so
        # select_cases takes it alone)
        assert res.metrics["cases"] == {
            "gemm_cross_entropy": ["aligned", "ragged-v"],
            "rope_bwd": ["aligned-hd64"],
        }.get(case.spec, ["aligned", "ragged-m"])
        return
    assert res.status == "fail", f"{case.id} must fail compile with {case.kind}: {detail}"
    hits = [f for f in res.findings if f.kind == case.kind]
    assert hits, f"{case.id}: expected {case.kind!r}, got {detail}"
    for line in case.marked:
        assert line in [f.line for f in hits], f"{case.id}: no {case.kind} finding on marked line {line}: {detail}"
    if case.kind in ("output-shape", "output-dtype"):
        assert all(f.output and f.case for f in hits)

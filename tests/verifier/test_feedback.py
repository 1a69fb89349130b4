"""Feedback rendering: what the repair prompt shows for failures, numerics and warnings."""

from __future__ import annotations

from pathlib import Path

from coda_agent.verifier.feedback import render_feedback
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.static import check_static
from coda_agent.verifier.verdict import Finding, StageResult, Verdict

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
BWD = load_spec(ROOT / "kernel_specs" / "swiglu_bwd").spec

SOURCE = "\n".join(f"line_{i} = {i}" for i in range(1, 41))


def verdict(*stages: StageResult, cpu_only: bool = False) -> Verdict:
    return Verdict(spec="swiglu_bwd", spec_hash="s", candidate_hash="c", stages=list(stages), cpu_only=cpu_only)


def test_static_failure_quotes_candidate_lines():
    src = (CORPUS / "torch_fallback.py").read_text()
    v = verdict(check_static(BWD, src))
    text = render_feedback(v, src)
    lines = text.splitlines()
    assert lines[0].startswith("Verification of `swiglu_bwd` FAILED at stage `static`: 4 violation(s)")
    assert "[no-epilogue-call] line 25" in text  # the fallback never runs its epilogue
    assert lines[1] == "Stages: static=fail"
    assert "- [torch-math] line 26: dpost = torch.matmul(dout, w_down)  # expect: torch-math" in text
    assert "    `torch.matmul` does the op's work" in text
    assert "line 29: s = torch.sigmoid(gate)" in text


def test_numerics_failure_names_output_case_and_numbers():
    f = Finding(
        kind="tolerance",
        output="dpreact",
        case="ragged-m",
        message="max |out - ref32| = 0.25 > allowed 0.0031 (2 x 0.0015 + 1e-06) at row 300, col 17 (last M tile)",
    )
    v = verdict(
        StageResult(stage="static", status="pass", summary="ok"),
        StageResult(stage="compile", status="pass", summary="compiled 2 kernel variant(s)"),
        StageResult(stage="correctness", status="fail", summary="1 output(s) out of tolerance", findings=[f]),
    )
    text = render_feedback(v, SOURCE)
    assert "FAILED at stage `correctness`: 1 output(s) out of tolerance" in text
    assert "Stages: static=pass, compile=pass, correctness=fail" in text
    assert "- [tolerance] output `dpreact`, case `ragged-m`" in text
    assert "0.25 > allowed 0.0031" in text and "row 300, col 17" in text


def test_compile_error_with_multiline_message_is_clipped():
    msg = "DSLUserCodeError: NameError\n" + "\n".join(f"detail {i}" for i in range(40))
    v = verdict(
        StageResult(
            stage="compile",
            status="fail",
            summary="compile-error",
            findings=[Finding(kind="compile-error", line=12, case="aligned", message=msg)],
        )
    )
    text = render_feedback(v, SOURCE)
    assert "- [compile-error] case `aligned` line 12: line_12 = 12" in text
    assert "    detail 10" in text and "detail 30" not in text
    assert "more line(s)" in text


def test_pass_with_warnings_shows_numbers():
    bench = StageResult(
        stage="bench",
        status="pass",
        summary="1.07x bare GEMM (bar 1.03x) on llama3-8b/M8192",
        findings=[
            Finding(
                kind="performance-bar",
                case="llama3-8b/M8192",
                message="fused 1.63 ms vs bare_gemm 1.52 ms: ratio 1.07 > bar 1.03",
            )
        ],
        metrics={
            "fused_ms": 1.6312345,
            "bare_gemm_ms": 1.52,
            "ratio_bare_gemm": 1.0731,
            "launches": 1,
            "per_shape": {"x": 1},
        },
    )
    v = verdict(StageResult(stage="static", status="pass", summary="ok"), bench)
    text = render_feedback(v, SOURCE)
    assert text.splitlines()[0] == "Verification of `swiglu_bwd` PASSED with warnings."
    assert "Warnings from `bench`: 1.07x bare GEMM" in text
    assert "numbers: bare_gemm_ms=1.52, fused_ms=1.631, launches=1, ratio_bare_gemm=1.073" in text
    assert "- [performance-bar] case `llama3-8b/M8192`" in text and "ratio 1.07 > bar 1.03" in text


def test_clean_pass_and_cpu_only():
    v = verdict(
        StageResult(stage="static", status="pass", summary="ok"),
        StageResult(stage="compile", status="pass", summary="compiled 2 kernel variant(s)"),
        cpu_only=True,
    )
    text = render_feedback(v, SOURCE)
    assert "PASSED (CPU only" in text and "not yet verified on a GPU" in text
    assert "- compile: compiled 2 kernel variant(s)" in text


def test_verifier_error_is_labelled():
    v = verdict(
        StageResult(
            stage="compile",
            status="error",
            summary="environment: no quack",
            findings=[Finding(kind="environment", message="quack missing")],
        )
    )
    assert "a verifier/machine error" in render_feedback(v, SOURCE)


def test_line_budget_and_omission_note():
    findings = [Finding(kind="banned-call", line=i, message=f"problem {i}") for i in range(1, 31)]
    v = verdict(StageResult(stage="static", status="fail", summary="30 violation(s)", findings=findings))
    text = render_feedback(v, SOURCE, max_lines=20)
    lines = text.splitlines()
    assert len(lines) <= 20
    assert lines[-1].startswith("... (") and "more finding(s) omitted" in lines[-1]
    shown = sum(1 for ln in lines if ln.startswith("- ["))
    assert shown + int(lines[-1].split("(")[1].split()[0]) == 30


def test_out_of_range_line_and_no_line():
    v = verdict(
        StageResult(
            stage="static",
            status="fail",
            summary="2 violation(s)",
            findings=[Finding(kind="entry-missing", message="no entry"), Finding(kind="x", line=999, message="far")],
        )
    )
    text = render_feedback(v, SOURCE)
    assert "- [entry-missing]\n    no entry" in text
    assert "- [x] line 999\n    far" in text


def test_deterministic():
    src = (CORPUS / "introspection.py").read_text()
    v = verdict(check_static(BWD, src))
    assert render_feedback(v, src) == render_feedback(v.model_copy(deep=True), src)

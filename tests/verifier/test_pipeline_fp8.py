"""An fp8 output through the GPU stages on the CPU test device, benchmark included: the
reference worker's band, the fp8 rule on full trials and on the sampled checks of the
timed calls (each sampled code paired with its block's scale, gpu/samples.py).

static and compile are stubbed: the candidates are pure torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verifier_helpers import stub_static_compile

from coda_agent.verifier.pipeline import verify
from coda_agent.verifier.spec import load_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus_numerics"
SPEC = load_spec(ROOT / "kernel_specs" / "gemm_fp8_quant")
SMALL_BENCH = [{"name": "small", "dims": {"M": 512, "N": 256, "K": 256}}]
"""512 x 256 codes: more than a timed call's 65536 samples, so those checks are sampled."""


@pytest.fixture(autouse=True)
def _stub(monkeypatch):
    stub_static_compile(monkeypatch)


def _verify(cand: Path, tmp_path: Path):
    return verify(
        SPEC,
        cand,
        device="cpu",
        bench=True,
        bench_shapes=SMALL_BENCH,
        baselines=["torch_eager", "bare_gemm"],
        workdir=tmp_path / "work",
        timeout_s=300,
    )


def test_honest_quantizer_passes_the_sampled_checks(tmp_path):
    v = _verify(CORPUS / "honest_fp8_quant.py", tmp_path)
    assert all(s.status in ("pass", "skip") for s in v.stages), [(s.stage, s.status, s.summary) for s in v.stages]
    checks = v.stage("correctness").metrics["bench_checks"]
    assert "timed-loop small #0" in checks and set(checks["timed-loop small #0"]) == {"y_fp8", "y_scale"}
    for case, per in checks.items():
        assert per["y_fp8"]["ok"] and set(per["y_fp8"]["rules"]) == {"nonfinite", "fp8_rounding"}, case


def test_truncation_only_at_the_benchmark_shape_is_caught_on_samples(tmp_path):
    body = (
        (CORPUS / "honest_fp8_quant.py").read_text()
        + (CORPUS / "fp8_truncated.py").read_text().split('"""', 2)[2].replace("def gemm_fp8_quant(", "def _truncated(")
        + (
            "\n\n_honest = gemm_fp8_quant\n\n\n"
            "def gemm_fp8_quant(x, w, *, eps):\n"
            "    if x.shape[0] == 512:  # the benchmark shape's M (no correctness case has it)\n"
            "        return _truncated(x, w, eps=eps)\n"
            "    return _honest(x, w, eps=eps)\n"
        )
    )
    cand = tmp_path / "cand.py"
    cand.write_text(body)
    v = _verify(cand, tmp_path)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    cases = {f.case for f in st.findings}
    assert "timed-loop small #0" in cases and "bench small" in cases, cases
    assert all(f.output == "y_fp8" and "rule fp8-rounding" in f.message for f in st.findings)

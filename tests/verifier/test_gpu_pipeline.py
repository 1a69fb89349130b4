"""The GPU stages on a Hopper GPU (skipped elsewhere; see tests/conftest.py).

* the good corpus candidates pass every stage through :func:`verify` (correctness
  shapes, bench on one shape) and are GPU-verified, with exactly one kernel launch;
* every corpus file whose docstring says ``EXPECT: gpu <kind>`` is rejected at a GPU
  stage with that kind (the corpus's names map to this verifier's finding kinds below);
  these run the workers directly (static and compile are other tests' business);
* pure-torch candidates exercise the honesty checks that need real hardware: the NaN
  poison (never-written outputs), the profiler launch count, and the timing cross-checks
  (work on a side stream is flagged by speed of light / untimed work).

Run on the H200: ``pytest tests/verifier/test_gpu_pipeline.py -m gpu -q``
(single cases: ``-k good``, ``-k corpus``, ``-k torch``).
"""

import re
import textwrap
from pathlib import Path

import pytest

from coda_agent.verifier.pipeline import gpu_stages, run_gpu_workers, verify
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.stages.bench import bench_stage

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = HERE / "corpus"

# corpus EXPECT names -> the finding kinds this verifier reports for them
EXPECT_KINDS = {
    "output-alias": {"output-aliases-input", "output-aliases-output"},
    "partial-output": {"stale-memory", "tolerance", "nan-output"},
    "input-mutation": {"input-mutated"},
    "stale-memory": {"stale-memory"},
    "constant-output": {"constant-output", "zero-output"},
    "workspace": {"workspace-over-budget"},
    "gemm-launches": {"too-many-gemm-launches"},
    "tolerance": {"tolerance"},  # a numerics rule (the message names it)
}


def _meta(path: Path) -> dict[str, str]:
    text = path.read_text()
    spec = re.search(r"^SPEC:\s*(\S+)", text, re.M)
    expect = re.search(r"^EXPECT:\s*(.+)$", text, re.M)
    return {"spec": spec.group(1) if spec else "", "expect": expect.group(1).strip() if expect else ""}


def _corpus(prefix: str) -> list[Path]:
    if not CORPUS.is_dir():
        return []
    return sorted(p for p in CORPUS.glob("*.py") if _meta(p)["expect"].startswith(prefix))


def _spec(name):
    return load_spec(ROOT / "kernel_specs" / name)


def _explain(stages) -> str:
    return "\n".join(
        f"{s.stage} {s.status}: {s.summary}\n" + "\n".join(f"   [{f.kind}] {f.message[:600]}" for f in s.findings)
        for s in stages
    )


@pytest.mark.parametrize("path", _corpus("pass"), ids=lambda p: p.stem)
def test_good_corpus_candidate_is_gpu_verified(path, tmp_path):
    loaded = _spec(_meta(path)["spec"])
    first = loaded.spec.shapes.benchmark[0].name
    v = verify(loaded, path, workdir=tmp_path, bench_shapes=[first])
    assert v.gpu_verified, _explain(v.stages)
    c = v.stage("correctness").metrics
    assert c["launches"] == 1, c.get("kernels")
    assert v.environment.compute_capability == "9.0" and v.environment.driver, v.environment
    row = v.stage("bench").metrics["rows"][0]
    assert row["shape"] == first and row["fused_ms"] > row["sol_ms"]
    if loaded.spec.gradient_outputs:
        assert v.stage("gradients").status == "pass"
    # the timed shape itself was checked (sampled elements): fresh inputs after timing, the
    # extra call after timing and the call kept from inside do_bench's loop
    checked = v.stage("gradients" if not loaded.spec.value_outputs else "correctness").metrics["bench_checks"]
    assert set(checked) == {
        f"bench {first}",
        f"timed {first}",
        f"wall {first}",
        *(f"timed-loop {first} #{j}" for j in range(8)),
    }
    # the candidate worker ran confined wherever the kernel has Landlock (never silently)
    from coda_agent.verifier.confine.landlock import SandboxUnavailable, abi_version

    try:
        abi_version()
        assert v.environment.worker_sandbox.startswith("landlock ABI"), v.environment.worker_sandbox
        # confined before torch and CUDA started their threads (confine/launch.py): none escaped
        assert "earlier thread" not in v.environment.worker_sandbox, v.environment.worker_sandbox
    except SandboxUnavailable:
        assert v.environment.worker_sandbox.startswith("unavailable"), v.environment.worker_sandbox


@pytest.mark.parametrize("path", _corpus("gpu "), ids=lambda p: p.stem)
def test_corpus_candidate_rejected_on_gpu(path, tmp_path):
    meta = _meta(path)
    expect = meta["expect"].split()[1]
    loaded = _spec(meta["spec"])
    run = run_gpu_workers(loaded, path, tmp_path, bench=False)
    stages = gpu_stages(loaded, run)
    failed = [s for s in stages if not s.ok]
    assert failed and failed[0].status == "fail", _explain(stages) + "\n" + run.cand.message()
    kinds = {f.kind for f in failed[0].findings}
    assert kinds & EXPECT_KINDS.get(expect, {expect}), _explain(stages)


TORCH_FWD = """
import torch

def swiglu_fwd(x, w1):
    pre = x @ w1.T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre, post
"""

NEVER_WRITTEN = """
import torch

def swiglu_fwd(x, w1):
    m, n = x.shape[0], w1.shape[0]
    return torch.empty(m, n, dtype=x.dtype, device=x.device), torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
"""

SIDE_STREAM = """
import torch

_side = torch.cuda.Stream()

def swiglu_fwd(x, w1):
    _side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side):
        pre = x @ w1.T
        post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre, post
"""

SKIPS_WHILE_QUEUED = """
import torch

def swiglu_fwd(x, w1):
    # do_bench enqueues an L2 flush right before each timed call, so the stream is still
    # busy when the call starts; after the worker's synchronizes it is idle. Skip 1/4 of K
    # only while busy, at the benchmark shapes (stream.query() is not a sync).
    if x.shape[0] >= 8192 and not torch.cuda.current_stream().query():
        k = x.shape[1] * 3 // 4
        x, w1 = x[:, :k], w1[:, :k]
    pre = x @ w1.T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre, post
"""


def _write(tmp_path, body):
    p = tmp_path / "candidate.py"
    p.write_text(textwrap.dedent(body))
    return p


def test_torch_poison_exposes_never_written_outputs(tmp_path):
    loaded = _spec("swiglu_fwd")
    run = run_gpu_workers(loaded, _write(tmp_path, NEVER_WRITTEN), tmp_path / "w", bench=False)
    res = gpu_stages(loaded, run)[0]
    assert res.status == "fail", _explain([res])
    stale = [f for f in res.findings if f.kind == "stale-memory"]
    assert {f.output for f in stale} == {"preact", "postact"}, _explain([res])


def test_torch_fallback_counts_launches(tmp_path):
    loaded = _spec("swiglu_fwd")
    run = run_gpu_workers(loaded, _write(tmp_path, TORCH_FWD), tmp_path / "w", bench=False)
    res = gpu_stages(loaded, run)[0]
    assert res.metrics["launches"] >= 2, res.metrics
    assert "too-many-launches" in {f.kind for f in res.findings}, _explain([res])


def test_torch_side_stream_is_flagged_by_timing(tmp_path):
    loaded = _spec("swiglu_fwd")
    first = loaded.spec.shapes.benchmark[0].name
    run = run_gpu_workers(
        loaded, _write(tmp_path, SIDE_STREAM), tmp_path / "w", bench=True, bench_shapes=[first], baselines=["bare_gemm"]
    )
    res = bench_stage(loaded, run)
    assert res.status == "fail", _explain([res])
    assert {f.kind for f in res.findings} & {"untimed-work", "speed-of-light"}, _explain([res])


@pytest.mark.parametrize("spec", ["swiglu_fwd", "cross_entropy_bwd"])
def test_quack_gemm_floor_is_timed_next_to_the_bare_gemm(spec, tmp_path):
    # the floor baseline on quack's mainloop: same operands as bare_gemm (one GEMM for
    # swiglu_fwd; three for cross_entropy_bwd, one an M-major transposed view), so its
    # time is within a small factor of cuBLAS's (not an order of magnitude off: a wrong
    # operand capture or shape would show)
    from coda_agent.verifier.gpu.gemm_floor import NAME

    loaded = _spec(spec)
    first = loaded.spec.shapes.benchmark[0].name
    good = ROOT / "generated_kernels" / spec / "kernel.py"  # the accepted kernel
    v = verify(loaded, good, workdir=tmp_path, bench_shapes=[first], baselines=["bare_gemm", NAME])
    base = v.stage("bench").metrics["shapes"][first]["baselines"]
    assert "ms" in base[NAME], base
    assert 0.5 < base[NAME]["ms"] / base["bare_gemm"]["ms"] < 2.0, base


def test_work_skipped_while_the_timer_runs_is_caught(tmp_path):
    # the call kept from inside do_bench (protocol.timed_loop_check_run) sees the skipped
    # work; the extra call after timing starts on an idle stream and is correct
    loaded = _spec("swiglu_fwd")
    first = loaded.spec.shapes.benchmark[0].name
    run = run_gpu_workers(
        loaded,
        _write(tmp_path, SKIPS_WHILE_QUEUED),
        tmp_path / "w",
        bench=True,
        bench_shapes=[first],
        baselines=["bare_gemm"],
    )
    res = next(s for s in gpu_stages(loaded, run) if s.stage == "correctness")
    assert res.status == "fail", _explain([res])
    cases = {f.case for f in res.findings if f.case}  # (the torch fallback's launch-count finding has none)
    assert any(c.startswith(f"timed-loop {first} #") for c in cases) and f"timed {first}" not in cases, _explain([res])

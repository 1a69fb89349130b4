"""verifier/repeats.py and ``bench --repeat``: medians over runs, the spread kept, failures decide."""

import shutil
from pathlib import Path

import pytest
from test_benchrun import ROOT, _accepted

from coda_agent.verifier.bench import shape_metrics, stage_from_shapes
from coda_agent.verifier.benchrun import bench_kernels
from coda_agent.verifier.repeats import combine
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.verdict import Environment, StageResult, Verdict
from coda_agent.verifier.workspace import sha256_file

FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
SHAPES = FWD.spec.shapes.benchmark[:1]  # llama3-1b/M8192: 1-2 ms is above its speed of light


def _run(loaded, fused, bare, compiled=2.0, status="pass", started="t", cand="c"):
    """A verdict whose bench stage timed ``fused`` / ``bare`` ms at every shape (built with the
    verifier's own shape_metrics, as a real run's)."""
    shapes = {}
    for bs in SHAPES:
        m, _ = shape_metrics(loaded, bs.dims, fused, fused * 1.01, {"bare_gemm": {"ms": bare},
                             "torch_compile": {"ms": compiled}, "liger": {"error": "no liger"}}, "NVIDIA H200",
                             host_ms=0.05)
        shapes[bs.name] = m
    bench = stage_from_shapes(loaded, shapes, [], "NVIDIA H200", 1.0)
    stages = [StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "gradients")]
    stages.insert(2, StageResult(stage="correctness", status=status, summary=status))
    return Verdict(spec=loaded.name, spec_hash=loaded.spec_hash, candidate_hash=cand, started_at=started,
                   stages=[*stages, bench], environment=Environment(gpu="NVIDIA H200", compute_capability="9.0"))


def test_medians_over_runs_and_paired_ratios_kept():
    runs = [_run(FWD, 1.00, 1.00, started="t1"), _run(FWD, 1.10, 1.00, started="t2"),
            _run(FWD, 1.02, 1.05, started="t3")]
    v = combine(FWD, runs)
    b = v.stage("bench")
    assert v.gpu_verified and b.metrics["repeats"] == 3 and b.summary.startswith("median of 3 runs: ")
    m = b.metrics["shapes"][SHAPES[0].name]
    # medians of each time, the ratio recomputed from them (not a median of ratios)
    assert m["fused_ms"] == 1.02 and m["baselines"]["bare_gemm"]["ms"] == 1.00
    assert m["baselines"]["bare_gemm"]["ratio"] == pytest.approx(1.02)
    assert m["baselines"]["liger"] == {"error": "no liger"}
    # every run's own (paired) numbers stay, for the spread
    assert m["runs"]["started_at"] == ["t1", "t2", "t3"] and m["runs"]["fused_ms"] == [1.00, 1.10, 1.02]
    assert m["runs"]["ratios"]["bare_gemm"] == pytest.approx([1.00, 1.10, 1.02 / 1.05])
    assert b.metrics["rows"][0]["ratios"]["bare_gemm"] == pytest.approx(1.02)
    # the bar is judged on the medians: swiglu_fwd's bar is bare_gemm <= 1.03
    assert m["bar"]["bare_gemm"]["met"] is True and runs[1].stage("bench").metrics["shapes"][SHAPES[0].name][
        "bar"]["bare_gemm"]["met"] is False
    assert runs[0].stage("bench").metrics.get("repeats") is None  # the inputs are not changed


def test_a_failing_run_decides_and_mixed_candidates_are_refused():
    bad = _run(FWD, 1.0, 1.0, status="fail", started="t2")
    assert combine(FWD, [_run(FWD, 1.0, 1.0), bad, _run(FWD, 1.0, 1.0)]) is bad
    one = _run(FWD, 1.0, 1.0)
    assert combine(FWD, [one]) is one
    with pytest.raises(ValueError, match="not of one candidate"):
        combine(FWD, [_run(FWD, 1.0, 1.0), _run(FWD, 1.0, 1.0, cand="other")])
    with pytest.raises(ValueError, match="no runs"):
        combine(FWD, [])


def test_bench_repeat_runs_round_robin_and_prints_the_spread(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    _accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py")
    _accepted(tmp_path, "swiglu_bwd", "good_swiglu_bwd.py")
    calls = []
    fused = iter([1.00, 2.00, 1.10, 2.20, 1.02, 2.04])

    def fake(loaded, kernel, **kw):
        calls.append(loaded.name)
        v = _run(loaded, next(fused), 1.0 if loaded.name == "swiglu_fwd" else 2.0, started=f"t{len(calls)}")
        return v.model_copy(update={"candidate_hash": sha256_file(kernel)})

    rep = bench_kernels(tmp_path, ["swiglu_fwd", "swiglu_bwd"], verify_fn=fake, out_dir=tmp_path / "out", repeat=3)
    assert calls == ["swiglu_fwd", "swiglu_bwd"] * 3  # run 1 of each kernel, then run 2, ...
    assert rep.verdicts["swiglu_fwd"].stage("bench").metrics["shapes"][SHAPES[0].name]["fused_ms"] == 1.02
    text = rep.markdown_path.read_text()
    assert "- median of 3 runs (started t1, t3, t5)" in text
    assert f"  - {SHAPES[0].name}: bare_gemm 1.000-1.100, torch_compile 0.500-0.550" in text
    assert ("times come from one run, except swiglu_bwd, swiglu_fwd: per-shape medians over several "
            "runs of `bench --repeat`") in text
    # a later single run of one kernel lands on the same page: only the other stays a median
    fused = iter([1.05])
    bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=tmp_path / "out", repeat=1)
    text = rep.markdown_path.read_text()
    assert "times come from one run, except swiglu_bwd: per-shape medians" in text
    assert text.count("- median of 3 runs") == 1
    kept = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir() for p in p.iterdir())
    assert kept == ["swiglu_bwd.json", "swiglu_fwd.json"]  # one verdict per kernel, runs inside it
    with pytest.raises(ValueError, match="--repeat 0"):
        bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=tmp_path / "out", repeat=0)

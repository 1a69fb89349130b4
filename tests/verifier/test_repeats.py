"""verifier/library/repeats.py and ``bench --repeat``: medians over runs, the spread kept, failures decide."""

import shutil

import pytest
from test_benchrun import ROOT, _accepted

from coda_agent.verifier.library.bench import bench_kernels
from coda_agent.verifier.library.kept import keep_verdict
from coda_agent.verifier.library.repeats import combine, merge_shapes, why_not_mergeable
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.stages.bench import shape_metrics, stage_from_shapes
from coda_agent.verifier.verdict import Environment, StageResult, Verdict
from coda_agent.verifier.workspace import sha256_file

FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
SHAPES = FWD.spec.shapes.benchmark[:1]  # llama3-1b/M8192: 1-2 ms is above its speed of light


def _run(loaded, fused, bare, compiled=2.0, status="pass", started="t", cand="c", shapes=None, driver=None):
    """A verdict whose bench stage timed ``fused`` / ``bare`` ms at every shape of ``shapes``
    (default SHAPES; built with the verifier's own shape_metrics, as a real run's)."""
    measured = {}
    for bs in shapes or SHAPES:
        m, _ = shape_metrics(
            loaded,
            bs.dims,
            fused,
            fused * 1.01,
            {"bare_gemm": {"ms": bare}, "torch_compile": {"ms": compiled}, "liger": {"error": "no liger"}},
            "NVIDIA H200",
            host_ms=0.05,
        )
        measured[bs.name] = m
    bench = stage_from_shapes(loaded, measured, [], "NVIDIA H200", 1.0)
    stages = [StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "gradients")]
    stages.insert(2, StageResult(stage="correctness", status=status, summary=status))
    return Verdict(
        spec=loaded.name,
        spec_hash=loaded.spec_hash,
        candidate_hash=cand,
        started_at=started,
        stages=[*stages, bench],
        environment=Environment(gpu="NVIDIA H200", compute_capability="9.0", driver=driver),
    )


def test_medians_over_runs_and_paired_ratios_kept():
    runs = [
        _run(FWD, 1.00, 1.00, started="t1"),
        _run(FWD, 1.10, 1.00, started="t2"),
        _run(FWD, 1.02, 1.05, started="t3"),
    ]
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
    assert (
        m["bar"]["bare_gemm"]["met"] is True
        and runs[1].stage("bench").metrics["shapes"][SHAPES[0].name]["bar"]["bare_gemm"]["met"] is False
    )
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
    assert (
        "always come from one run, or are per-shape medians over the runs of one `bench --repeat` "
        "(swiglu_bwd, swiglu_fwd: "
    ) in text
    assert "more than one bench call" not in text
    # a later single run of one kernel lands on the same page: only the other stays a median
    fused = iter([1.05])
    bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=tmp_path / "out", repeat=1)
    text = rep.markdown_path.read_text()
    assert "`bench --repeat` (swiglu_bwd: " in text
    assert text.count("- median of 3 runs") == 1
    kept = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir() for p in p.iterdir())
    assert kept == ["swiglu_bwd.json", "swiglu_fwd.json"]  # one verdict per kernel, runs inside it
    with pytest.raises(ValueError, match="--repeat 0"):
        bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=tmp_path / "out", repeat=0)


TWO = FWD.spec.shapes.benchmark[:2]  # llama3-1b/M8192, llama3-1b/M16384 (spec order)


def test_a_partial_bench_merges_into_the_kept_verdict_shape_by_shape():
    kept = _run(FWD, 1.00, 1.00, started="t0", shapes=TWO)
    kept.environment.worker_sandbox = "landlock (old)"
    new = combine(
        FWD, [_run(FWD, f, 1.00, started=t, shapes=TWO[1:]) for f, t in ((1.2, "t1"), (1.1, "t2"), (1.3, "t3"))]
    )
    new.environment.worker_sandbox = "landlock + seccomp (new)"
    out = merge_shapes(FWD, kept, new)
    # each call's rows keep the confinement they were measured under, and the page says so
    from coda_agent.verifier.library.bench import _measured_line

    assert _measured_line(out, out.stage("bench").metrics["shapes"]) == (
        f"Measured in 2 bench calls: t0 ({TWO[0].name}), candidate worker: landlock (old); "
        f"t1 ({TWO[1].name}), candidate worker: landlock + seccomp (new)."
    )
    shapes = out.stage("bench").metrics["shapes"]
    assert list(shapes) == [bs.name for bs in TWO]  # spec order, both shapes
    # the shape the new call measured is its median; the other keeps the earlier run's numbers
    assert shapes[TWO[1].name]["fused_ms"] == 1.2 and shapes[TWO[1].name]["measured_at"] == "t1"
    assert shapes[TWO[0].name]["fused_ms"] == 1.0 and shapes[TWO[0].name]["measured_at"] == "t0"
    b = out.stage("bench")
    # bars, rows and summary are rebuilt over both shapes (swiglu_fwd: bare_gemm <= 1.03)
    assert b.metrics["bar"]["bare_gemm"] == {"limit": 1.03, "met_shapes": 1, "shapes": 2, "met": False}
    assert [r["shape"] for r in b.metrics["rows"]] == [bs.name for bs in TWO]
    assert b.summary.startswith("2 shape(s) from 2 bench call(s) (t0, t1): ")
    assert out.started_at == "t1" and out.gpu_verified and new.stage("bench").metrics["shapes"].keys() == {TWO[1].name}
    # folding the same two in the other order (an older copy merged into a newer folder)
    # gives the same table: the later measurement of a shape wins, never the incoming one
    back = merge_shapes(FWD, new, kept)
    assert {s: m["fused_ms"] for s, m in back.stage("bench").metrics["shapes"].items()} == {
        s: m["fused_ms"] for s, m in shapes.items()
    }
    assert back.started_at == "t1"


def test_merging_never_mixes_candidates_versions_or_failures(tmp_path):
    kept = _run(FWD, 1.00, 1.00, started="t5", shapes=TWO)
    cases = {
        "candidate_hash differs": _run(FWD, 1.1, 1.0, started="t6", shapes=TWO[1:], cand="other"),
        "environment.driver differs (None kept, 999.0 new)": _run(
            FWD, 1.1, 1.0, started="t6", shapes=TWO[1:], driver="999.0"
        ),
        "the new verdict failed its correctness stage (fail)": _run(
            FWD, 1.1, 1.0, started="t6", shapes=TWO[1:], status="fail"
        ),
    }
    for why, new in cases.items():
        assert why_not_mergeable(kept, new) == why
        with pytest.raises(ValueError, match="cannot merge swiglu_fwd"):
            merge_shapes(FWD, kept, new)
        # kept as a file: a newer one replaces the kept verdict (news) and says what it dropped
        (tmp_path / "swiglu_fwd.json").write_text(kept.to_json())
        out, line = keep_verdict(tmp_path, FWD, new)
        assert out is new and line == (
            f"swiglu_fwd: replaced the kept verdict of t5, the two cannot be merged: {why}; "
            f"its shapes not measured again are dropped: {TWO[0].name}"
        )
        # an older one is left out: the kept file does not change
        old = new.model_copy(update={"started_at": "t1"})
        (tmp_path / "swiglu_fwd.json").write_text(kept.to_json())
        out, line = keep_verdict(tmp_path, FWD, old)
        assert (
            out is None
            and line == f"swiglu_fwd: left out, the two cannot be merged: {why}; the kept verdict (t5) is newer"
        )
        assert Verdict.model_validate_json((tmp_path / "swiglu_fwd.json").read_text()).started_at == "t5"
        # offline folding (--merge-from) never replaces, newer or not
        out, line = keep_verdict(tmp_path, FWD, new, replace=False)
        assert out is None and line.endswith("only a live bench replaces a kept verdict")
        assert Verdict.model_validate_json((tmp_path / "swiglu_fwd.json").read_text()).started_at == "t5"
    # a new run over every kept shape simply replaces it
    full = _run(FWD, 1.1, 1.0, started="t6", shapes=TWO)
    assert merge_shapes(FWD, kept, full) is full
    assert {m["measured_at"] for m in full.stage("bench").metrics["shapes"].values()} == {"t6"}
    # an unreadable kept file is replaced, and the line says what was wrong with it
    (tmp_path / "swiglu_fwd.json").write_text('{"spec": 3}')
    out, line = keep_verdict(tmp_path, FWD, full)
    assert out is full and line.startswith("swiglu_fwd: replaced an unreadable kept verdict (")

"""verifier/stages/bench.py on synthetic numbers: speed of light, wall cross-check, ratios, bars."""

from pathlib import Path

import pytest

from coda_agent.verifier.confine.sandbox import WorkerOutcome
from coda_agent.verifier.gpu.protocol import (
    TIMED_LOOP_SLOTS,
    BenchShape,
    Plan,
    timed_check_run,
    timed_loop_check_run,
    wall_check_run,
)
from coda_agent.verifier.gpu.results import GpuRun
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.stages.bench import (
    bench_stage,
    peaks_for,
    shape_metrics,
    speed_of_light_ms,
    throughput,
    untimed_work,
)

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
BWD = load_spec(ROOT / "kernel_specs" / "swiglu_bwd")
DIMS = {"M": 8192, "K": 2048, "I": 8192}  # llama3-1b/M8192


def test_peaks_table():
    assert peaks_for("NVIDIA H200") == (989e12, 4.8e12)
    assert peaks_for("NVIDIA H100 80GB HBM3") == (989e12, 3.35e12)
    assert peaks_for(None) == peaks_for("NVIDIA A100") == (989e12, 3.35e12)


def test_speed_of_light_compute_and_memory_bound():
    s = speed_of_light_ms(989e12, 1e9, "H200")  # 1 s of FLOPs, 0.2 ms of bytes
    assert s["bound"] == "compute" and s["sol_ms"] == pytest.approx(1000.0)
    s = speed_of_light_ms(1e9, 4.8e12, "H200")
    assert s["bound"] == "memory" and s["sol_ms"] == pytest.approx(1000.0)


def test_untimed_work_rule():
    assert not untimed_work(0.80, 0.90)
    assert not untimed_work(0.80, 1.60)  # exactly half: 0.8 < 0.8 - 0.05 is false
    assert untimed_work(0.01, 0.90)  # side stream: events saw almost nothing
    assert not untimed_work(0.01, 0.11)  # tiny shapes: launch overhead within the slack
    # host-bound but honest (gemm_rmsnorm_rope, llama3-1b/M8192 on the H200: event 0.217 ms,
    # wall 0.624 ms): flagged by the wall time alone, not once the host part is subtracted
    assert untimed_work(0.217, 0.624)
    assert not untimed_work(0.217, 0.624, host_ms=0.45)
    # a side stream with a quick return: the host part is small, the device part large
    assert untimed_work(0.20, 2.0, host_ms=0.05)
    assert untimed_work(0.01, 0.90, host_ms=0.02)
    # host time at or above the wall time (timer granularity) never makes it negative
    assert not untimed_work(0.0, 0.5, host_ms=0.6)


def test_throughput_units():
    tf, gb = throughput(2e12, 1e9, 1.0)
    assert tf == pytest.approx(2000.0) and gb == pytest.approx(1000.0)


def test_shape_metrics_fwd_llama1b():
    flops = 2 * 8192 * 2048 * 2 * 8192
    m, problems = shape_metrics(
        FWD,
        DIMS,
        0.81,
        0.90,
        {"bare_gemm": {"ms": 0.88}, "torch_compile": {"ms": 0.95}, "quack_library": {"error": "boom"}},
        "NVIDIA H200",
    )
    assert m["flops"] == flops
    # bytes: x (M,K) + w1 (2I,K) + preact (M,2I) + postact (M,I), bf16
    assert m["bytes"] == 2 * (8192 * 2048 + 16384 * 2048 + 8192 * 16384 + 8192 * 8192)
    assert m["tflops"] == pytest.approx(flops / 0.81e-3 / 1e12)
    assert m["baselines"]["bare_gemm"]["ratio"] == pytest.approx(0.81 / 0.88)
    assert m["bar"]["bare_gemm"]["met"] is True
    assert m["bar"]["quack_library"]["met"] is None
    kinds = [k for k, _ in problems]
    assert kinds == ["baseline-error"]
    assert m["sol_ms"] == pytest.approx(flops / 989e12 * 1e3)


def test_faster_than_light_and_untimed():
    _, problems = shape_metrics(FWD, DIMS, 0.2, 0.9, {"bare_gemm": {"ms": 0.88}}, "NVIDIA H200")
    kinds = {k for k, _ in problems}
    assert {"speed-of-light", "untimed-work"} <= kinds
    msg = dict(problems)["speed-of-light"]
    assert "faster than speed of light: investigate" in msg


def test_bar_missed_is_a_warning():
    _, problems = shape_metrics(FWD, DIMS, 1.0, 1.1, {"bare_gemm": {"ms": 0.88}}, "NVIDIA H200")
    assert [k for k, _ in problems] == ["bar-missed"]


def _run(spec, cand_bench, ref_bench, shapes, bench=True, status="ok", died_in=None):
    plan = Plan(spec_dir=str(spec.directory), runs=[], bench_shapes=shapes, bench=bench)
    cand = WorkerOutcome(
        status=status,
        returncode=0 if status == "ok" else 1,
        duration_s=1.0,
        records=[{"part": "setup", "ok": True, "env": {"gpu": "NVIDIA H200"}}, *cand_bench],
        died_in=died_in,
        timeout_s=60,
    )
    ref = WorkerOutcome(status="ok", returncode=0, duration_s=1.0, records=[*ref_bench, {"part": "done"}])
    return GpuRun(workdir=Path("/nonexistent"), plan=plan, cand=cand, ref=ref)


SHAPE = BenchShape(name="llama3-1b/M8192", dims=DIMS)


def _checks(shape, slots=TIMED_LOOP_SLOTS, timed=True, wall=True):
    """The recheck records a worker writes for ``shape``'s timed calls: ``slots`` kept
    timed-loop calls, (``timed``) the extra call after timing and (``wall``) the checked
    wall-time call."""
    recs = [{"part": "recheck", "key": timed_loop_check_run(shape, 0, 0, j).key, "timed_set": 0} for j in range(slots)]
    recs += [{"part": "recheck", "key": timed_check_run(shape, 0, 0).key, "timed_set": 1}] if timed else []
    return recs + ([{"part": "recheck", "key": wall_check_run(shape, 0, 0).key, "timed_set": 2}] if wall else [])


def test_bench_stage_pass_with_bar_summary():
    run = _run(
        FWD,
        [*_checks(SHAPE), {"part": "bench", "shape": SHAPE.name, "event_ms": 0.81, "wall_ms": 0.9, "n_sets": 3}],
        [
            {
                "part": "bench",
                "shape": SHAPE.name,
                "baselines": {
                    "bare_gemm": {"ms": 0.88},
                    "torch_eager": {"ms": 1.13},
                    "torch_compile": {"ms": 0.95},
                    "quack_library": {"ms": 0.80},
                },
            }
        ],
        [SHAPE],
    )
    res = bench_stage(FWD, run)
    assert res.status == "pass", res
    assert res.metrics["gpu"] == "NVIDIA H200"
    assert res.metrics["bar"]["bare_gemm"]["met"] is True
    assert res.metrics["bar"]["quack_library"]["met"] is True  # 0.81/0.80 = 1.0125 <= 1.02
    row = res.metrics["rows"][0]
    assert row["shape"] == SHAPE.name and row["ratios"]["torch_eager"] == pytest.approx(0.81 / 1.13)
    assert "fused/bare_gemm 0.920x" in res.summary


def test_bench_stage_fails_on_speed_of_light():
    run = _run(
        BWD,
        [{"part": "bench", "shape": SHAPE.name, "event_ms": 0.01, "wall_ms": 0.012}],
        [{"part": "bench", "shape": SHAPE.name, "baselines": {"bare_gemm": {"ms": 0.43}}}],
        [SHAPE],
    )
    res = bench_stage(BWD, run)
    assert res.status == "fail" and [f.kind for f in res.findings if f.kind == "speed-of-light"]


def test_bench_stage_crash_during_bench():
    run = _run(FWD, [], [], [SHAPE], status="signal", died_in=f"bench {SHAPE.name}")
    run.cand.signal_name = "SIGSEGV"
    res = bench_stage(FWD, run)
    assert res.status == "fail" and res.findings[0].kind == "crash"
    assert "SIGSEGV" in res.findings[0].message


def test_bench_stage_skips():
    assert bench_stage(FWD, _run(FWD, [], [], [SHAPE], bench=False)).status == "skip"
    assert bench_stage(FWD, _run(FWD, [], [], [], bench=True)).status == "skip"


def test_bench_stage_uses_the_workers_host_time_for_the_untimed_check():
    """The candidate worker's ``host_ms`` (time until the call returned) reaches the rule:
    the same event/wall pair is flagged without it and passes with a host-bound host time."""
    ref = [{"part": "bench", "shape": SHAPE.name, "baselines": {"bare_gemm": {"ms": 0.88}}}]
    rec = {"part": "bench", "shape": SHAPE.name, "event_ms": 0.95, "wall_ms": 2.4, "n_sets": 3}
    flagged = bench_stage(FWD, _run(FWD, [rec], ref, [SHAPE]))
    assert flagged.status == "fail" and "untimed-work" in {f.kind for f in flagged.findings}
    host_bound = bench_stage(FWD, _run(FWD, [{**rec, "host_ms": 1.9}], ref, [SHAPE]))
    assert "untimed-work" not in {f.kind for f in host_bound.findings}, host_bound.findings
    assert host_bound.metrics["shapes"][SHAPE.name]["host_ms"] == 1.9


def test_sandbox_comes_from_the_first_setup_record():
    """The worker writes its setup record (confinement included) before any candidate code
    runs; a later 'setup' record could only come from the candidate, so it never counts."""
    run = _run(FWD, [], [], [SHAPE])
    run.cand.records[0]["sandbox"] = "unavailable: no landlock"
    run.cand.records.append({"part": "setup", "ok": True, "sandbox": "landlock ABI 7: forged"})
    assert run.sandbox == "unavailable: no landlock"


def test_a_timer_with_far_fewer_calls_than_do_bench_gives_fails():
    """Slow estimate calls can make do_bench measure 2 calls (9 in all) of a ~1 ms kernel;
    the rule gives ~100. Honest counts pass at any size of call."""
    from coda_agent.verifier.stages.bench import do_bench_calls, short_timer

    assert do_bench_calls(1.0) == 1 + 5 + 25 + 100 and do_bench_calls(200.0) == 8
    assert short_timer(1.0, 9) and not short_timer(1.0, do_bench_calls(1.07))
    assert not short_timer(0.14, do_bench_calls(0.21)) and not short_timer(150.0, 8)
    m, problems = shape_metrics(FWD, SHAPE.dims, 1.0, 1.1, {}, None, timer_calls=9)
    assert m["timer_calls"] == 9 and [k for k, _ in problems] == ["short-timer"]
    _, problems = shape_metrics(FWD, SHAPE.dims, 1.0, 1.1, {}, None, timer_calls=None)  # CPU path: not judged
    assert "short-timer" not in [k for k, _ in problems]


def test_timed_checks_that_did_not_run_fail_the_timing():
    """Every one of the first TIMED_LOOP_SLOTS timer calls fills a slot, so a bench record
    with fewer kept calls than min(slots, timer calls), or without the after-timing check,
    means the checks silently did not run (only candidate code reaching into the worker)."""
    ref = [{"part": "bench", "shape": SHAPE.name, "baselines": {"bare_gemm": {"ms": 0.88}}}]
    rec = {
        "part": "bench",
        "shape": SHAPE.name,
        "event_ms": 0.81,
        "wall_ms": 0.9,
        "n_sets": 3,
        "timer": "do_bench",
        "timer_calls": 131,
    }
    kinds = lambda recs: {f.kind for f in bench_stage(FWD, _run(FWD, recs, ref, [SHAPE])).findings}  # noqa: E731
    assert "timed-check-missing" not in kinds([*_checks(SHAPE), rec])
    res = bench_stage(FWD, _run(FWD, [*_checks(SHAPE, slots=7), rec], ref, [SHAPE]))
    assert res.status == "fail" and "7 of the 8 timed calls" in res.findings[0].message
    assert "timed-check-missing" in kinds([*_checks(SHAPE, timed=False), rec])
    assert "timed-check-missing" in kinds([*_checks(SHAPE, wall=False), rec])
    # a CPU timer loop that made only 3 calls keeps 3: nothing missing
    assert "timed-check-missing" not in kinds(
        [*_checks(SHAPE, slots=3), {**rec, "timer": "cpu-loop", "timer_calls": 3}]
    )
    # records of another shape do not count for this one
    other = BenchShape(name="llama3-8b/M8192", dims=DIMS)
    assert "timed-check-missing" in kinds([*_checks(other), rec])


def test_launches_at_a_bench_shape_over_the_limit_are_reported():
    """A candidate can run the quack epilogue at the correctness shapes and torch math
    elsewhere. The bench record's count at each benchmark shape is checked against
    max_launches; a count over it, none, or a count that failed fails the stage (the H200
    launch census showed no accepted kernel's count grows with the shape)."""
    ref = [{"part": "bench", "shape": SHAPE.name, "baselines": {"bare_gemm": {"ms": 0.88}}}]
    rec = {"part": "bench", "shape": SHAPE.name, "event_ms": 0.81, "wall_ms": 0.9, "n_sets": 3}
    limit = FWD.spec.entry.max_launches
    ok = bench_stage(
        FWD,
        _run(FWD, [*_checks(SHAPE), {**rec, "launches": limit, "launch_kernels": [QUACK_GEMM] * limit}], ref, [SHAPE]),
    )
    assert "launches-at-bench-shape" not in {f.kind for f in ok.findings}
    assert ok.metrics["shapes"][SHAPE.name]["launches"] == limit
    many = bench_stage(
        FWD,
        _run(FWD, [*_checks(SHAPE), {**rec, "launches": limit + 40, "launch_kernels": ["mul", "sum"]}], ref, [SHAPE]),
    )
    f = next(x for x in many.findings if x.kind == "launches-at-bench-shape")
    assert many.status == "fail" and f"launched {limit + 40} GPU kernel(s), expected 1 to {limit}" in f.message
    assert ": mul, sum;" in f.message and "launches-at-bench-shape" in many.summary
    assert ok.status == "pass"
    none = bench_stage(FWD, _run(FWD, [*_checks(SHAPE), {**rec, "launches": 0}], ref, [SHAPE]))
    assert none.status == "fail" and "launches-at-bench-shape" in {x.kind for x in none.findings}
    # a count that failed in the worker is reported, not a crash of the run
    err = bench_stage(FWD, _run(FWD, [*_checks(SHAPE), {**rec, "launch_count_error": "RuntimeError: x"}], ref, [SHAPE]))
    assert err.status == "fail" and any("could not be counted: RuntimeError: x" in x.message for x in err.findings)
    # the CPU path records no count: nothing judged
    cpu = bench_stage(FWD, _run(FWD, [*_checks(SHAPE), rec], ref, [SHAPE]))
    assert "launches" not in cpu.metrics["shapes"][SHAPE.name] and cpu.status == "pass"


def test_launch_budget_is_judged_at_every_correctness_shape():
    """The worker counts one call per correctness shape; a count over max_launches (or 0) at
    any of them is a finding naming that shape, not only at the first."""
    from coda_agent.verifier.stages.correctness import FindingSet, _launch_check

    limit = FWD.spec.entry.max_launches
    recs = [
        {"part": "launches", "count": 1, "kernels": ["gemm"], "case": "aligned", "key": "aligned-s0"},
        {
            "part": "launches",
            "count": limit + 3,
            "kernels": ["gemm", "mul", "sum", "add"][: limit + 3] + ["mul"] * (limit - 1),
            "case": "ragged",
            "key": "ragged-s0",
        },
        {"part": "launches", "count": 0, "kernels": [], "case": "tiny", "key": "tiny-s0"},
    ]
    f, metrics = FindingSet(), {}
    assert _launch_check(FWD, _run(FWD, recs, [], [], bench=False), f, metrics) is None
    assert metrics["launches"] == 1 and metrics["launches_by_case"] == {"aligned": 1, "ragged": limit + 3, "tiny": 0}
    got = {(x.kind, x.case) for x in f.items}
    assert got == {("too-many-launches", "ragged"), ("no-launches", "tiny")}
    assert any(f"at ragged launched {limit + 3} GPU kernels" in x.message for x in f.items)
    # an older worker's single record without a case still judges
    f1, m1 = FindingSet(), {}
    _launch_check(
        FWD,
        _run(FWD, [{"part": "launches", "count": limit + 1, "kernels": ["a"] * (limit + 1)}], [], [], bench=False),
        f1,
        m1,
    )
    assert [x.kind for x in f1.items] == ["too-many-launches"] and m1["launches"] == limit + 1
    # a CPU worker records no count: nothing judged, no verifier problem
    f2, m2 = FindingSet(), {}
    cpu = [{"part": "launches", "count": None, "kernels": [], "reason": "CPU device"}]
    assert _launch_check(FWD, _run(FWD, cpu, [], [], bench=False), f2, m2) is None and not f2.items


def test_workspace_budget_default_and_spec_override():
    """Default: half the largest declared tensor, at least 8 MiB; ``entry.max_workspace``
    replaces it. swiglu_fwd at llama3-1b/M8192: preact (M, 2I) bf16 is the largest."""
    from coda_agent.verifier.spec import WORKSPACE_FLOOR, KernelSpec

    budget, rule = FWD.spec.workspace_budget(DIMS)
    assert budget == 8192 * 16384 * 2 // 2 and "preact" in rule
    assert FWD.spec.workspace_budget({"M": 16, "K": 64, "I": 32})[0] == WORKSPACE_FLOOR
    raw = FWD.spec.model_dump()
    raw["entry"]["max_workspace"] = "4*M*I"
    spec = KernelSpec.model_validate(raw)
    assert spec.workspace_budget(DIMS) == (4 * 8192 * 8192, "entry.max_workspace = 4*M*I")
    raw["entry"]["max_workspace"] = "4*M*Q"
    with pytest.raises(ValueError, match=r"dims \['Q'\] are not bound .*entry.max_workspace"):
        KernelSpec.model_validate(raw)


def test_workspace_over_budget_fails_correctness_and_bench():
    """gemm_cross_entropy with its (M, V) fp32 logits materialized fits the launch budget
    (tests/verifier/corpus/materialized_logits.py). The worker records each counted call's workspace; over the spec's
    budget it is a finding at that correctness shape, and a failing one at a bench shape."""
    from coda_agent.verifier.gpu.runs import make_runs
    from coda_agent.verifier.stages.correctness import FindingSet, _workspace_check

    runs = [r for r in make_runs(FWD.spec) if not r.recheck]
    first, later = {}, {}
    for r in runs:
        (later if r.case in first else first).setdefault(r.case, r)
    budget = {c: FWD.spec.workspace_budget(r.dims)[0] for c, r in first.items()}
    cases = list(first)
    recs = [
        {
            "part": "launches",
            "count": 1,
            "kernels": ["gemm"],
            "case": c,
            "key": r.key,
            "workspace_bytes": budget[c] + (1 if c == cases[1] else 0),
        }
        for c, r in first.items()
    ]
    # an unprofiled trial over budget counts too (a candidate that behaves only under the profiler)
    recs += [
        {"part": "trial", "key": r.key, "workspace_bytes": budget[c] + (2 if c == cases[2] else 0)}
        for c, r in later.items()
    ]
    plan = Plan(spec_dir=str(FWD.directory), runs=runs, bench_shapes=[], bench=False)
    run = GpuRun(
        workdir=Path("/nonexistent"),
        plan=plan,
        cand=WorkerOutcome(status="ok", returncode=0, duration_s=1.0, records=recs, timeout_s=60),
        ref=WorkerOutcome(status="ok", returncode=0, duration_s=1.0, records=[{"part": "done"}]),
    )
    f, metrics = FindingSet(), {}
    _workspace_check(FWD, run, f, metrics)
    assert sorted((x.kind, x.case) for x in f.items) == sorted(
        [("workspace-over-budget", cases[1]), ("workspace-over-budget", cases[2])]
    )
    assert metrics["workspace_by_case"][cases[1]] == budget[cases[1]] + 1
    assert metrics["workspace_by_case"][cases[2]] == budget[cases[2]] + 2
    assert "over the budget of 8.0 MiB (half the largest declared tensor" in f.items[0].message

    ref = [{"part": "bench", "shape": SHAPE.name, "baselines": {"bare_gemm": {"ms": 0.88}}}]
    rec = {
        "part": "bench",
        "shape": SHAPE.name,
        "event_ms": 0.81,
        "wall_ms": 0.9,
        "n_sets": 3,
        "launches": 1,
        "launch_kernels": [QUACK_GEMM],
    }
    limit = FWD.spec.workspace_budget(DIMS)[0]
    ok = bench_stage(FWD, _run(FWD, [*_checks(SHAPE), {**rec, "workspace_bytes": limit}], ref, [SHAPE]))
    assert ok.status == "pass" and ok.metrics["shapes"][SHAPE.name]["workspace_bytes"] == limit
    bad = bench_stage(FWD, _run(FWD, [*_checks(SHAPE), {**rec, "workspace_bytes": 8192 * 16384 * 4}], ref, [SHAPE]))
    f = next(x for x in bad.findings if x.kind == "workspace-at-bench-shape")
    assert bad.status == "fail" and f.case == SHAPE.name and "held 512.0 MiB" in f.message
    # the unprofiled call after timing (same rotation as the timed calls) is judged as well
    checks = [
        {**r, "workspace_bytes": limit + 1} if r["key"] == timed_check_run(SHAPE, 0, 0).key else r
        for r in _checks(SHAPE)
    ]
    late = bench_stage(FWD, _run(FWD, [*checks, {**rec, "workspace_bytes": 0}], ref, [SHAPE]))
    assert late.status == "fail" and late.metrics["shapes"][SHAPE.name]["workspace_bytes"] == limit + 1


# the GEMM launches among them (tests/verifier/corpus/second_gemm_pass.py): names as the H200 profiler gives them
QUACK_GEMM = (
    "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_rope_bwd_epi_d231d71a44f09bb3__col_col_col_row_"
    "sm9_object_at__TiledMMA_ThrLayoutVMNK1281111000_PermutationMNK____MMAAtom_ThrID1281_Sha_0"
)
TORCH_ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
)


def test_gemm_launches_are_told_from_host_prep_by_name():
    from coda_agent.verifier.gpu.protocol import gemm_launches

    cublas = [
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn",
    ]
    assert gemm_launches([QUACK_GEMM]) == 1 and gemm_launches([QUACK_GEMM, QUACK_GEMM]) == 2
    assert gemm_launches(cublas) == 3
    host = [
        TORCH_ELEMENTWISE,
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
        "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()",
        "CatArrayBatchedCopy",
    ]
    assert gemm_launches(host) == 0


def test_a_second_gemm_pass_within_the_launch_budget_is_rejected():
    """rope_bwd allows 11 launches and one GEMM: a bare GEMM plus a dummy-K GEMM rotating
    the stored output in place (corpus/second_gemm_pass.py) fits the 11 but not the one."""
    from coda_agent.verifier.stages.correctness import FindingSet, _launch_check

    rope = load_spec(ROOT / "kernel_specs" / "rope_bwd")
    assert rope.spec.entry.max_launches == 11 and rope.spec.entry.max_gemm_launches == 1
    honest = [QUACK_GEMM] + [TORCH_ELEMENTWISE] * 10
    unfused = [QUACK_GEMM, QUACK_GEMM] + [TORCH_ELEMENTWISE] * 9
    recs = [
        {"part": "launches", "count": 11, "kernels": honest, "case": "aligned-hd64", "key": "a"},
        {"part": "launches", "count": 11, "kernels": unfused, "case": "ragged-hd128", "key": "r"},
    ]
    f, metrics = FindingSet(), {}
    assert _launch_check(rope, _run(rope, recs, [], [], bench=False), f, metrics) is None
    assert [(x.kind, x.case) for x in f.items] == [("too-many-gemm-launches", "ragged-hd128")]
    assert "launched 2 GEMM kernels, at most 1 allowed" in f.items[0].message
    assert metrics["gemm_launches"] == 1 and metrics["max_gemm_launches"] == 1
    # the same at a benchmark shape
    bs = rope.spec.shapes.benchmark[0]
    shape = BenchShape(name=bs.name, dims=bs.dims)
    ref = [{"part": "bench", "shape": shape.name, "baselines": {"bare_gemm": {"ms": 0.15}}}]
    rec = {"part": "bench", "shape": shape.name, "event_ms": 0.2, "wall_ms": 0.3, "n_sets": 3, "launches": 11}
    ok = bench_stage(rope, _run(rope, [*_checks(shape), {**rec, "launch_kernels": honest}], ref, [shape]))
    assert "launches-at-bench-shape" not in {x.kind for x in ok.findings}
    assert ok.metrics["shapes"][shape.name]["gemm_launches"] == 1
    bad = bench_stage(rope, _run(rope, [*_checks(shape), {**rec, "launch_kernels": unfused}], ref, [shape]))
    msg = next(x.message for x in bad.findings if x.kind == "launches-at-bench-shape")
    assert bad.status == "fail" and "launched 2 GEMM kernels, at most 1 allowed" in msg


def test_a_launch_record_without_every_name_is_not_a_silent_pass():
    """GEMMs are counted from the names: a record naming fewer kernels than it counts is a
    verifier problem at the correctness shapes and a failing finding at a benchmark shape."""
    from coda_agent.verifier.stages.correctness import FindingSet, _launch_check

    rope = load_spec(ROOT / "kernel_specs" / "rope_bwd")
    short = [{"part": "launches", "count": 11, "kernels": [TORCH_ELEMENTWISE] * 3, "case": "aligned-hd64", "key": "a"}]
    assert "names 3 of its 11 kernels" in _launch_check(rope, _run(rope, short, [], [], bench=False), FindingSet(), {})
    bs = rope.spec.shapes.benchmark[0]
    shape = BenchShape(name=bs.name, dims=bs.dims)
    ref = [{"part": "bench", "shape": shape.name, "baselines": {"bare_gemm": {"ms": 0.15}}}]
    rec = {
        "part": "bench",
        "shape": shape.name,
        "event_ms": 0.2,
        "wall_ms": 0.3,
        "n_sets": 3,
        "launches": 11,
        "launch_kernels": [QUACK_GEMM],
    }
    res = bench_stage(rope, _run(rope, [*_checks(shape), rec], ref, [shape]))
    assert res.status == "fail" and any("names 1 of its 11 kernels" in f.message for f in res.findings)

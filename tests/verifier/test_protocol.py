"""verifier/gpu/protocol.py, the worker-side helpers that need no GPU, and worker-outcome handling."""

import json
from pathlib import Path

import pytest

from coda_agent.verifier.confine.records import append_record, last_begun, read_records
from coda_agent.verifier.confine.sandbox import WorkerOutcome
from coda_agent.verifier.gpu.poison import free_block_sizes
from coda_agent.verifier.gpu.protocol import Plan, gpu_kernels
from coda_agent.verifier.gpu.results import GpuRun, jsonable
from coda_agent.verifier.gpu.runs import make_bench_shapes, make_runs
from coda_agent.verifier.gpu.worker_candidate import tampered
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.stages.correctness import FindingSet, _launch_check, correctness_stage

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")


def test_runs_cover_cases_seeds_and_one_recheck():
    runs = make_runs(FWD.spec)
    normal = [r for r in runs if not r.recheck]
    assert len(normal) == 3 * 2
    assert [r.key for r in normal[:2]] == ["c0-aligned-s0", "c0-aligned-s1"]
    (re,) = [r for r in runs if r.recheck]
    assert re.seed == 1000 and re.case == "ragged-all" and re.key == "recheck-c2-ragged-all-s1000"


@pytest.mark.slow
def test_recheck_rows_are_secret_per_verification():
    case_m = FWD.spec.shapes.correctness[2].dims["M"]
    drawn = {}
    for secret in range(1, 200):
        (re,) = [r for r in make_runs(FWD.spec, secret) if r.recheck]
        m = re.dims["M"]
        assert -(-case_m // 2) <= m <= 2 * case_m and re.case == f"ragged-all, M={m}"
        # only M changes; the other dims are the case's, the key does not reveal M
        assert {k: v for k, v in re.dims.items() if k != "M"} == {
            k: v for k, v in FWD.spec.shapes.correctness[2].dims.items() if k != "M"
        }
        assert re.key == "recheck-c2-ragged-all-s1000" and re.seed == 1000 + secret
        drawn[secret] = m
    # deterministic per secret (both workers read the same plan), spread over the range
    assert [r.dims["M"] for r in make_runs(FWD.spec, 7) if r.recheck] == [drawn[7]]
    assert len(set(drawn.values())) > 100


def test_bench_shapes_override():
    assert len(make_bench_shapes(FWD.spec)) == 6
    (one,) = make_bench_shapes(FWD.spec, ["llama3-8b/M8192"])
    assert one.dims == {"M": 8192, "K": 4096, "I": 14336}
    (c,) = make_bench_shapes(FWD.spec, [{"name": "tiny", "dims": {"M": 256, "K": 128, "I": 128}}])
    assert c.name == "tiny"
    with pytest.raises(ValueError, match="unknown benchmark shape"):
        make_bench_shapes(FWD.spec, ["llama9"])


def test_plan_roundtrip_and_hash():
    p = Plan(
        spec_dir="/x", runs=make_runs(FWD.spec), bench_shapes=make_bench_shapes(FWD.spec), bench=True, candidate="/c.py"
    )
    q = Plan.from_json(p.to_json())
    assert q == p
    assert json.loads(p.to_json()) == json.loads(json.dumps(json.loads(p.to_json()), sort_keys=True))
    r = Plan.from_json(p.to_json())
    r.candidate = None
    assert r.sha256() == p.sha256()  # the candidate path is not part of what both workers must agree on


def test_records_torn_line_and_last_begun(tmp_path):
    f = tmp_path / "r.jsonl"
    assert read_records(f) == []
    append_record(f, {"part": "begin", "what": "trial a"})
    append_record(f, {"part": "trial", "key": "a"})
    append_record(f, {"part": "begin", "what": "trial b"})
    with open(f, "a") as fh:
        fh.write('{"part": "trial", "ke')  # the worker died mid-write
    recs = read_records(f)
    assert [r["part"] for r in recs] == ["begin", "trial", "begin"]
    assert last_begun(recs) == "trial b"
    assert last_begun(recs[:2]) is None


def test_free_block_sizes_from_snapshot():
    snap = [
        {
            "device": 0,
            "segment_type": "small",
            "blocks": [
                {"size": 524288, "state": "active_allocated"},
                {"size": 1048576, "state": "inactive"},
                {"size": 512, "state": "inactive"},
            ],
        },
        {"device": 0, "segment_type": "large", "blocks": [{"size": 20971520, "state": "inactive"}]},
        {"device": 1, "segment_type": "large", "blocks": [{"size": 999424, "state": "inactive"}]},
    ]
    assert free_block_sizes(snap, 0) == [20971520, 1048576, 512]


def test_tampered_detects_replaced_instruments(monkeypatch):
    import time

    assert tampered() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert tampered() == ["time.perf_counter"]


def _run_with(records, status="ok"):
    plan = Plan(spec_dir=str(FWD.directory), runs=make_runs(FWD.spec))
    cand = WorkerOutcome(status=status, returncode=0, duration_s=1.0, records=records, timeout_s=10)
    return GpuRun(workdir=Path("/nonexistent"), plan=plan, cand=cand)


@pytest.mark.parametrize(
    "rec,kind,err",
    [
        ({"part": "launches", "count": 3, "kernels": ["gemm", "silu", "mul"]}, "too-many-launches", None),
        ({"part": "launches", "count": 0, "kernels": []}, "no-launches", None),
        ({"part": "launches", "count": 1, "kernels": ["gemm"]}, None, None),
        ({"part": "launches", "count": None, "reason": "profiler self-test saw 0 kernels"}, None, "cannot count"),
        ({"part": "launches", "count": None, "reason": "CPU device"}, None, None),
    ],
)
def test_launch_check(rec, kind, err):
    f = FindingSet()
    metrics = {}
    e = _launch_check(FWD, _run_with([rec]), f, metrics)
    assert [x.kind for x in f.items] == ([kind] if kind else [])
    assert (e is None) if err is None else (err in e)


def test_not_hopper_is_an_error_not_a_failure():
    run = _run_with(
        [{"part": "setup", "ok": False, "error": "not-hopper", "message": "this is an A100"}], status="exception"
    )
    res = correctness_stage(FWD, run)
    assert res.status == "error" and res.findings[0].kind == "not-hopper"


def test_import_failure_is_the_candidates_crash():
    run = _run_with([{"part": "setup", "ok": True, "env": {}}, {"part": "begin", "what": "import"}], status="exception")
    run.cand.returncode = 1
    run.cand.stderr_tail = "SyntaxError: invalid syntax"
    run.cand.died_in = "import"
    res = correctness_stage(FWD, run)
    assert res.status == "fail" and res.findings[0].kind == "crash"
    assert "during import" in res.findings[0].message and "SyntaxError" in res.findings[0].message


def test_jsonable():
    assert jsonable({"a": float("inf"), "b": [float("nan"), 1.0]}) == {"a": "inf", "b": ["nan", 1.0]}


LOST = "cannot write results.jsonl: [Errno 28] No space left on device"
FORGED = "line 9: a second 'bench' record for 'llama3-8b/M8192'"


@pytest.mark.parametrize(
    "field,value,problem,status,kind",
    [
        # a full disk while copying the results pipe loses records: the verifier's error
        ("records_lost", LOST, LOST, "error", "verifier-error"),
        # records the worker's own code never writes: candidate code wrote into the pipe
        ("record_anomalies", [FORGED], FORGED, "fail", "harness-tampered"),
    ],
)
def test_worker_output_problems_decide_the_stage(field, value, problem, status, kind):
    run = _run_with([{"part": "setup", "ok": True, "sandbox": "landlock ABI 7"}])
    setattr(run.cand, field, value)
    res = correctness_stage(FWD, run)
    assert res.status == status and res.findings[0].kind == kind and problem in res.findings[0].message
    # a log the parent could not keep costs nothing: the run is judged as without it
    run.cand.output_problems = ["cannot write worker_candidate.stdout: [Errno 28] No space left on device"]
    run.cand.records_lost, run.cand.record_anomalies = None, []
    assert correctness_stage(FWD, run).summary != res.summary


def test_strict_reading_names_what_the_worker_never_writes(tmp_path):
    from coda_agent.verifier.confine.records import MAX_RECORD_LINE, read_records_checked

    f = tmp_path / "results.jsonl"
    good = [{"part": "setup", "ok": True}, {"part": "begin", "what": "bench s"}, {"part": "bench", "shape": "s"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in good) + '{"part": "done"}\n{"part": "da')  # torn last line
    recs, anomalies = read_records_checked(f)
    assert [r["part"] for r in recs] == ["setup", "begin", "bench", "done"] and anomalies == []
    # a forged bench record, then a newline-less prefix that swallows the worker's
    # real record, then records after done; a 200k-deep nesting and an over-long line
    f.write_text(
        '{"part": "bench", "shape": "s", "event_ms": 0.0001}\n{"junk":"'
        '{"part": "bench", "shape": "s", "event_ms": 1.0}\n'
        '{"part": "bench", "shape": "s", "event_ms": 0.0002}\n'
        '{"part": "done"}\n{"part": "integrity", "tampered": []}\n'
        + "[" * 200_000
        + "\n"
        + "x" * (MAX_RECORD_LINE + 1)
        + "\n"
        + '{"part": "end"}\n'
    )
    recs, anomalies = read_records_checked(f)
    assert recs[0]["event_ms"] == 0.0001  # every record is returned, first first
    assert anomalies == [
        "line 2: not a JSON object",
        "line 3: a second 'bench' record for 's'",
        "line 5: a 'integrity' record after 'done'",
        "line 6: not a JSON object",
        f"line 7: {MAX_RECORD_LINE + 1} bytes (over {MAX_RECORD_LINE})",
        "line 8: a 'end' record after 'done'",
    ]
    assert read_records_checked(tmp_path / "missing") == ([], [])
    # one launch count per correctness shape is legitimate (the reader must not refuse the
    # per-shape records); two for one shape are not
    f.write_text("".join(json.dumps({"part": "launches", "count": 1, "case": c}) + "\n" for c in ("a", "b", "a")))
    assert read_records_checked(f)[1] == ["line 3: a second 'launches' record for 'a'"]


def test_environment_fields_come_from_the_trusted_worker_where_it_has_them():
    # the confined candidate worker may be refused nvidia-smi (no driver); the reference worker is not
    run = _run_with([{"part": "setup", "ok": True, "env": {"gpu": "NVIDIA H200", "driver": None, "quack": "0.6.5"}}])
    assert run.gpu_env == {"gpu": "NVIDIA H200", "driver": None, "quack": "0.6.5"}
    run.ref = WorkerOutcome(
        status="ok",
        returncode=0,
        duration_s=1.0,
        records=[{"part": "setup", "ok": True, "env": {"gpu": "NVIDIA H200", "driver": "580.159.04", "quack": None}}],
    )
    assert run.gpu_env == {"gpu": "NVIDIA H200", "driver": "580.159.04", "quack": "0.6.5"}


def test_reservoir_keeps_each_timed_call_with_equal_probability():
    """The timed-loop check keeps TIMED_LOOP_SLOTS of the timer's calls by reservoir
    sampling: over many secrets every call of a 40-call loop is kept with probability 8/40,
    and a loop of at most 8 calls has every call kept (whatever the secret)."""
    import random

    from coda_agent.verifier.gpu.protocol import TIMED_LOOP_SLOTS as K
    from coda_agent.verifier.gpu.timing import reservoir_slot

    def kept(n, seed):
        rng, slots = random.Random(seed), [None] * K
        for i in range(1, n + 1):
            j = reservoir_slot(i, K, rng)
            if j is not None:
                slots[j] = i
        return slots

    assert all(sorted(c for c in kept(5, s) if c) == [1, 2, 3, 4, 5] for s in range(20))
    counts = [0] * 41
    trials = 20000
    for s in range(trials):
        for c in kept(40, s):
            counts[c] += 1
    freq = [c / trials for c in counts[1:]]
    assert all(abs(f - K / 40) < 0.02 for f in freq), freq


def test_gpu_kernels_counts_kernels_by_exact_marker_names():
    """Names as the H200 profiler recorded them (benchmarks/results/dev/
    2026-11-30-h200-profiler-events.log): copies and Kineto's sync records are not launches,
    but a kernel whose epilogue fn *contains* "Sync" or "Memcpy" is one (a substring rule
    would leave ``swiglu_Sync_epi`` uncounted: tests/verifier/corpus/sync_named_kernel.py)."""
    quack_sync = "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_probe_Sync_epi_8602ca0bea11f06c__none_s"
    quack_copy = "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_Memcpy_epi_0000__none_s"
    names = [
        quack_sync,
        quack_copy,
        "nvjet_sm90_tst_64x16_64x16_2x4_h_bz_NNT",
        "Memcpy HtoD (Pinned -> Device)",
        "Memcpy DtoH (Device -> Pageable)",
        "Memcpy DtoD (Device -> Device)",
        "Memset (Device)",
        "[memory]",
        "Stream Sync",
        "Context Sync",
        "Event Sync",
        "Stream Wait Event",
        "Unknown",
    ]
    assert gpu_kernels(names) == [quack_sync, quack_copy, "nvjet_sm90_tst_64x16_64x16_2x4_h_bz_NNT"]
    assert gpu_kernels(["Stream Sync of mine"]) == ["Stream Sync of mine"]

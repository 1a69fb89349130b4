"""verifier/pipeline.py without a GPU.

* ``cpu_only`` and "no CUDA GPU" paths: GPU stages are skipped, never verified;
* the whole worker protocol (candidate worker -> reference worker -> parent stages) on
  the CPU *test device*, with pure-torch candidates that cheat in the ways
  docs/threat-model.md lists. The CPU device skips what only a GPU can do (allocator
  poison, profiler launch count, do_bench) and its verdicts are marked ``cpu_only``.

static.py / compile.py are stubbed: these candidates use torch math on purpose.
"""

import json
import os
import textwrap
from pathlib import Path

import pytest
from verifier_helpers import landlock_or_skip
from verifier_helpers import stub_static_compile as stub_stages

import coda_agent.verifier.pipeline as pipeline
from coda_agent.verifier.gpu.runs import make_runs
from coda_agent.verifier.pipeline import verify
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.verdict import Finding, StageResult, Verdict

# Every test here runs the candidate and reference workers as subprocesses.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
BWD = load_spec(ROOT / "kernel_specs" / "swiglu_bwd")


@pytest.fixture(autouse=True)
def stub_static_compile(monkeypatch):
    stub_stages(monkeypatch)


def _write(tmp_path, body: str, name="candidate.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


GOOD_FWD = """
import torch

def _fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre, post

def swiglu_fwd(x, w1):
    pre, post = _fwd(x, w1)
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""

GOOD_BWD = """
import torch

def swiglu_bwd(dout, w_down, preact):
    dpost = dout.float() @ w_down.float()
    g, u = preact.float()[:, 0::2], preact.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = dpost * u * s * (1 + g * (1 - s))
    du = dpost * g * s
    return torch.stack((dg, du), -1).flatten(-2).bfloat16(), (g * s * u).bfloat16()
"""


def test_cpu_only_skips_gpu_stages(tmp_path):
    cand = _write(tmp_path, GOOD_FWD)
    v = verify(FWD, cand, cpu_only=True)
    assert [s.stage for s in v.stages] == ["static", "compile", "correctness", "gradients", "bench"]
    assert [s.status for s in v.stages[2:]] == ["skip"] * 3
    assert v.passed and not v.gpu_verified and v.cpu_only
    assert v.stages[3].summary == "the spec declares no gradient outputs: nothing to check"
    # verify --json: the outcome at the top level; loading ignores the derived fields
    d = json.loads(v.to_json(outcome=True))
    assert (d["passed"], d["gpu_verified"], d["failed_stage"]) == (True, False, None)
    assert d["outcome"] == "cpu-checks-passed"
    assert "passed" not in json.loads(v.to_json())
    assert Verdict.model_validate_json(v.to_json(outcome=True)).stages == v.stages


def test_no_cuda_gpu_is_not_verified(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "cuda_available", lambda: False)
    cand = _write(tmp_path, GOOD_FWD)
    v = verify(FWD, cand)
    # swiglu_fwd declares no gradient outputs: its gradients stage says so, GPU or not
    assert [s.summary for s in v.stages[2:]] == [
        "no CUDA GPU: not verified",
        "the spec declares no gradient outputs: nothing to check",
        "no CUDA GPU: not verified",
    ]
    assert not v.cpu_only and not v.gpu_verified
    assert v.environment.gpu is None


def test_static_failure_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(
        pipeline,
        "run_static",
        lambda loaded, cand: StageResult(
            stage="static",
            status="fail",
            summary="banned import",
            findings=[Finding(kind="banned-import", message="os", line=1)],
        ),
    )
    v = verify(FWD, _write(tmp_path, GOOD_FWD))
    assert [s.stage for s in v.stages] == ["static"] and v.failed_stage.stage == "static"
    d = json.loads(v.to_json(outcome=True))
    assert (d["passed"], d["gpu_verified"], d["failed_stage"]) == (False, False, "static")
    assert d["outcome"] == "rejected"


def test_cpu_stages_many_runs_ahead_and_verify_reuses_them(tmp_path, monkeypatch):
    """bench's order: every static/compile first (compiles in parallel), then verify() per
    kernel without compiling again; a file changed in between is compiled again."""
    calls = []

    def static(loaded, snap):
        calls.append(("static", snap.path.name))
        bad = "BAD" in snap.text
        return StageResult(stage="static", status="fail" if bad else "pass", summary="1 violation(s)" if bad else "ok")

    def compile_(loaded, snap, timeout_s=300):
        calls.append(("compile", snap.path.name))
        return StageResult(stage="compile", status="pass", summary="ok")

    monkeypatch.setattr(pipeline, "run_static", static)
    monkeypatch.setattr(pipeline, "run_compile", compile_)
    a, b = _write(tmp_path, GOOD_FWD, "a.py"), _write(tmp_path, GOOD_FWD + "# BAD\n", "b.py")
    done = pipeline.cpu_stages_many([(FWD, a), (FWD, b), (FWD, a)], jobs=3)
    assert [[s.status for s in d.stages] for d in done] == [["pass", "pass"], ["fail"], ["pass", "pass"]]
    assert sorted(calls) == sorted(
        [("static", "a.py"), ("static", "b.py"), ("static", "a.py"), ("compile", "a.py"), ("compile", "a.py")]
    )
    calls.clear()
    v = verify(FWD, a, cpu_only=True, cpu_done=done[0])
    assert calls == [] and [s.summary for s in v.stages[:2]] == ["ok", "ok"] and v.passed
    v = verify(FWD, b, cpu_only=True, cpu_done=done[1])
    assert calls == [] and v.failed_stage.stage == "static" and len(v.stages) == 1
    a.write_text(a.read_text() + "# BAD\n")  # changed after its CPU stages ran: they run again
    v = verify(FWD, a, cpu_only=True, cpu_done=done[0])
    assert calls == [("static", "a.py")] and v.failed_stage.stage == "static"


def test_missing_candidate_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        verify(FWD, tmp_path / "nope.py")


def test_stage_builder_bug_becomes_error(tmp_path, monkeypatch):
    def broken(loaded, cand):
        raise KeyError("bug")

    monkeypatch.setattr(pipeline, "run_static", broken)
    v = verify(FWD, _write(tmp_path, GOOD_FWD))
    assert v.stages[0].status == "error" and "KeyError" in v.stages[0].summary


# --------------------------------------------------------------------------- CPU test device

SMALL_BENCH = [{"name": "small", "dims": {"M": 256, "K": 128, "I": 128}}]


def _cpu_verify(loaded, cand, tmp_path, bench=False, timeout_s=120):
    return verify(
        loaded,
        cand,
        device="cpu",
        bench=bench,
        bench_shapes=SMALL_BENCH if bench else None,
        baselines=["torch_eager", "bare_gemm"],
        workdir=tmp_path / "work",
        timeout_s=timeout_s,
    )


def test_cpu_device_good_fwd_passes_every_stage(tmp_path):
    v = _cpu_verify(FWD, _write(tmp_path, GOOD_FWD), tmp_path, bench=True)
    st = {s.stage: s for s in v.stages}
    assert all(s.status in ("pass", "skip") for s in v.stages), [
        (s.stage, s.status, s.summary, s.findings) for s in v.stages
    ]
    assert st["correctness"].status == "pass" and st["bench"].status == "pass"
    assert st["gradients"].status == "skip"
    assert v.cpu_only and not v.gpu_verified  # a CPU-device run is never a GPU verification
    assert "CPU test device" in st["correctness"].summary
    worst = st["correctness"].metrics["worst"]
    assert set(worst) == {"preact", "postact"} and all(w["ratio"] <= 1 for w in worst.values())
    assert set(st["correctness"].metrics["recheck"]) == {"preact", "postact"}
    row = st["bench"].metrics["rows"][0]
    assert row["shape"] == "small" and set(row["baselines_ms"]) == {"torch_eager", "bare_gemm"}
    # the per-call guard's own host cost is measured and kept (a pooled ballast: microseconds)
    guard = st["bench"].metrics["shapes"]["small"]["guard_host_ms"]
    assert 0 < guard < 0.5, guard
    files = sorted(p.name for p in (tmp_path / "work" / "cand").iterdir())
    assert files == ["plan.json", "results.jsonl", "scratch"]
    # confined by confine/launch.py before `import torch` (only that path says "capabilities
    # dropped before": the launcher dropped them, the worker added seccomp after CUDA init)
    sandbox = v.environment.worker_sandbox
    assert "earlier thread" not in sandbox, sandbox
    assert "; no capabilities; seccomp: " in sandbox and sandbox.endswith("capabilities dropped before"), sandbox
    assert (tmp_path / "work" / "cand" / "scratch" / "trials" / "recheck-c2-ragged-all-s1000.pt").is_file()
    json.loads(v.to_json())


def test_cpu_device_good_bwd_checks_gradients(tmp_path):
    v = _cpu_verify(BWD, _write(tmp_path, GOOD_BWD), tmp_path)
    st = {s.stage: s for s in v.stages}
    assert st["correctness"].status == "pass", st["correctness"]
    assert st["gradients"].status == "pass", st["gradients"]
    assert "match torch.autograd" in st["gradients"].summary
    assert st["bench"].status == "skip"


def _kinds(v):
    return {f.kind for s in v.stages for f in s.findings}


def _failed(v):
    return v.failed_stage.stage if v.failed_stage else None


BAD_FWD = {
    "input-mutated": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    out = _orig(x, w1)
    x.add_(1.0)
    return out
""",
        None,
    ),
    "output-aliases-input": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    return pre, w1.view(-1)[: post.numel()].view(post.shape)
""",
        None,
    ),
    "output-not-plain-tensor": (
        GOOD_FWD
        + """
class Lazy(torch.Tensor):
    pass
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    return pre, post.as_subclass(Lazy)
""",
        None,
    ),
    "output-dtype": (
        GOOD_FWD
        + """
def swiglu_fwd(x, w1):
    pre, post = _fwd(x, w1)
    return pre.to(torch.bfloat16), post
""",
        None,
    ),
    "output-count": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    return _orig(x, w1)[0]
""",
        None,
    ),
    "nan-output": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    post[3, 5] = float("nan")
    return pre, post
""",
        "row 3 col 5",
    ),
    "zero-output": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    return pre, torch.zeros_like(post)
""",
        "all zeros",
    ),
    "stale-memory": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    post[128:].view(torch.int16).fill_(0x7FC1)
    return pre, post
""",
        "only rows beyond the first tile (rows >= 128) wrong",
    ),
    "tolerance": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    pre = pre.clone()
    pre[:, 0::2], pre[:, 1::2] = pre[:, 1::2].clone(), pre[:, 0::2].clone()
    return pre, post
""",
        "adjacent column pairs swapped",
    ),
    # right after every trial before timing (the public cases and the secret coverage cases)
    "drift-after-timing": (
        GOOD_FWD
        + """
_orig = swiglu_fwd
_calls = [0]
def swiglu_fwd(x, w1):
    _calls[0] += 1
    pre, post = _orig(x, w1)
    if _calls[0] > %d:
        post = (post.float() * 1.05).to(torch.bfloat16)
    return pre, post
"""
        % len([r for r in make_runs(FWD.spec, 1, "cpu") if not r.recheck]),
        "after timing, with a fresh seed",
    ),
    "harness-tampered": (
        """
import time
time.perf_counter = lambda: 0.0
"""
        + GOOD_FWD,
        "time.perf_counter",
    ),
    "crash": (
        GOOD_FWD
        + """
def swiglu_fwd(x, w1):
    raise RuntimeError("kernel exploded")
""",
        "kernel exploded",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_FWD))
def test_cpu_device_rejects(kind, tmp_path):
    body, needle = BAD_FWD[kind]
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path)
    assert _failed(v) == "correctness", [(s.stage, s.status, s.summary) for s in v.stages]
    assert kind in _kinds(v), [(f.kind, f.message[:300]) for s in v.stages for f in s.findings]
    if needle:
        msgs = " | ".join(f.message for s in v.stages for f in s.findings if f.kind == kind)
        assert needle in msgs, msgs


def test_cpu_device_ragged_edge_diagnosis(tmp_path):
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    post[256:] = 0
    return pre, post
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path)
    f = [f for f in v.stage("correctness").findings if f.kind == "tolerance"]
    # the public cases (the secret coverage cases, whose shapes vary per run, are judged too)
    assert f and {x.case for x in f if not x.case.startswith("secret-")} == {"ragged-m", "ragged-all"}
    assert "only the ragged edge (rows >= 256) wrong" in f[0].message


def test_cpu_device_segfault_and_hang(tmp_path):
    seg = (
        GOOD_FWD
        + """
import ctypes
def swiglu_fwd(x, w1):
    ctypes.string_at(0)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, seg, "seg.py"), tmp_path)
    f = v.stage("correctness").findings[0]
    assert f.kind == "crash" and "SIGSEGV" in f.message and "trial c0-aligned-s0" in f.message
    hang = (
        GOOD_FWD
        + """
import time
def swiglu_fwd(x, w1):
    time.sleep(3600)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, hang, "hang.py"), tmp_path, timeout_s=15)
    f = v.stage("correctness").findings[0]
    assert f.kind == "hang" and "no result after 15 s" in f.message


def test_cpu_device_wrong_gradient(tmp_path):
    body = GOOD_BWD.replace("* (1 + g * (1 - s))", "")
    v = _cpu_verify(BWD, _write(tmp_path, body), tmp_path)
    assert v.stage("correctness").status == "pass"
    g = v.stage("gradients")
    assert g.status == "fail" and {f.kind for f in g.findings} == {"tolerance"}
    assert all(f.output == "dpreact" for f in g.findings)


# -- OS-level confinement of the candidate worker (verifier/confine/landlock.py) ---------------------


def test_confined_candidate_cannot_write_outside_scratch(tmp_path):
    """A .pth file written into a site folder and a rewritten results.jsonl: confined, both
    writes fail and the candidate's failure stays the candidate's."""
    landlock_or_skip()
    target = tmp_path / "site" / "zz_evil.pth"
    target.parent.mkdir()
    body = (
        GOOD_FWD
        + f"""
import pathlib
def swiglu_fwd(x, w1):
    pathlib.Path({str(target)!r}).write_text("import os")
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path)
    assert not target.exists()
    assert v.environment.worker_sandbox.startswith("landlock ABI")
    msgs = " | ".join(f.message for s in v.stages for f in s.findings)
    assert _failed(v) == "correctness" and v.stage("correctness").status == "fail" and "PermissionError" in msgs

    forge = (
        GOOD_FWD
        + """
import pathlib
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pathlib.Path("results.jsonl").write_text('{"part": "error", "error": "input-generation", "verifier": true}\\n')
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, forge, "forge.py"), tmp_path)
    st = v.stage("correctness")
    assert st.status == "fail" and "PermissionError" in " | ".join(f.message for f in st.findings)


def test_a_verifier_error_record_after_the_import_is_the_candidates(tmp_path):
    """Candidate code that reaches the worker object can write its own ``error`` record with
    ``verifier: true`` through the worker's record(); read as a verifier error it would never
    be charged, and every resume would stop on the same attempt. The worker marks an error
    as the verifier's only before the import."""
    # (inspect.currentframe calls sys._getframe from inspect's own frame, which the audit
    # tripwire does not judge: the static stage bans the import; this checks the record rule)
    body = (
        GOOD_FWD
        + """
import inspect, os
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    f = inspect.currentframe()
    while f is not None:
        w = f.f_locals.get("self")
        if type(w).__name__ == "Worker":
            w.record("error", error="input-generation", verifier=True, message="CUDA driver fault")
            os._exit(2)
        f = f.f_back
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body, "forge_record.py"), tmp_path)
    st = v.stage("correctness")
    assert st.status == "fail" and not v.verifier_error, (st.status, st.summary)
    assert [f.kind for f in st.findings] == ["harness-tampered"] and "after the candidate was imported" in st.findings[
        0
    ].message


@pytest.mark.parametrize(
    "payload",
    [
        'exec("import os")',  # code from a string
        "import sys; sys._getframe(0)",  # frame walking
        'open("/dev/null")',  # the file system
    ],
)
def test_the_audit_tripwire_refuses_the_candidates_own_exec_frames_and_files(tmp_path, payload):
    """verifier/confine/audit.py: under the static stage, a way past it ends in the real
    `exec` called from candidate code (tests/verifier/corpus/getattr_gadget_exec.py); the
    workers' audit hook refuses such events when the candidate's own code (or code exec'd from a string) raises them,
    while the libraries' own exec/compile (CuTeDSL rewrites epilogues) stay allowed."""
    body = (
        GOOD_FWD
        + f"""
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    {payload}
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body, "tripwire.py"), tmp_path)
    st = v.stage("correctness")
    msgs = " | ".join(f.message for f in st.findings)
    assert st.status == "fail" and "CandidateAuditError" in msgs and "audit event" in msgs, (st.summary, msgs)


def test_a_candidate_that_rebinds_the_workers_own_globals_is_named(tmp_path):
    """A payload that reaches the candidate worker's module globals can replace
    `_perf_counter`/`_do_bench` there, beyond the torch and triton instruments; the worker's
    own globals and Worker's attributes are watched too, and the import record names what
    changed."""
    body = (
        GOOD_FWD
        + """
import inspect
_f = inspect.currentframe()
while _f is not None and "freeze_own_state" not in _f.f_globals:
    _f = _f.f_back
_f.f_globals["_perf_counter"] = lambda: 0.0
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body, "own_globals.py"), tmp_path)
    st = v.stage("correctness")
    msgs = " | ".join(f.message for f in st.findings)
    assert st.status == "fail" and "worker_candidate._perf_counter" in msgs, (st.summary, msgs)


def test_an_import_from_candidate_code_after_its_module_ran_is_refused(tmp_path):
    """audit.seal(): the module's own top-level imports are the static stage's; a fresh
    module load from the candidate's code once it has run is refused."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    import this  # a module no worker has loaded
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body, "late_import.py"), tmp_path)
    st = v.stage("correctness")
    msgs = " | ".join(f.message for f in st.findings)
    assert st.status == "fail" and "audit event 'import'" in msgs, (st.summary, msgs)


def test_rewritten_trial_file_is_the_candidates_failure(tmp_path):
    """Saved trial tensors live in the writable scratch folder; their sha256 goes through the
    protected results file, so a candidate that rewrites an earlier trial's file fails."""
    landlock_or_skip()
    body = (
        GOOD_FWD
        + """
import pathlib
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    for p in pathlib.Path("scratch/trials").glob("*.pt"):
        p.write_bytes(b"forged")
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path)
    st = v.stage("correctness")
    assert st.status == "fail" and [f.kind for f in st.findings] == ["tampered-trial-file"], st


def test_sandbox_off_switch_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_FS_SANDBOX", "off")
    v = _cpu_verify(FWD, _write(tmp_path, GOOD_FWD), tmp_path)
    assert v.passed and v.environment.worker_sandbox == "off (CODA_FS_SANDBOX=off)"


def test_kernel_wrong_only_at_the_benchmark_shape_is_caught(tmp_path):
    """A kernel that does 3/4 of K only at the (public) benchmark dims passes every
    correctness trial and is timed fast. Every benchmark shape gets a post-timing check on
    sampled output elements (runs.make_bench_checks)."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    if x.shape[1] == 128:  # the benchmark shape's K (no correctness case has it)
        k = 96
        return _orig(x[:, :k], w1[:, :k])
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    # caught by the fresh-seed check of the shape and by the checks of two timed calls
    # (the extra call after timing, the call kept from inside the timing loop)
    # (the CPU timer makes 5 calls: all kept, reservoir slots #0-#4)
    loop = {f"timed-loop small #{j}" for j in range(5)}
    assert {f.case for f in st.findings} == {"bench small", "timed small", "wall small"} | loop
    assert "tolerance" in {f.kind for f in st.findings}
    good = _cpu_verify(FWD, _write(tmp_path, GOOD_FWD, "good.py"), tmp_path, bench=True)
    checks = good.stage("correctness").metrics["bench_checks"]
    assert set(checks) == {"bench small", "timed small", "wall small"} | loop
    assert set(checks["bench small"]) == set(checks["timed-loop small #4"]) == {"preact", "postact"}


def test_work_skipped_only_inside_the_timing_loop_is_caught(tmp_path):
    """A kernel that tells the timer's calls apart (here: by counting its own calls; on
    the GPU it could time the gaps between calls) and skips work only there is correct on
    every call made outside the timer, the extra timed-rotation call included. The calls
    kept from inside the loop (protocol.timed_loop_check_run) catch it: the CPU timer makes
    5 calls, fewer than the 8 reservoir slots, so every one is checked."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    if x.shape[1] == 128:                       # the benchmark shape
        swiglu_fwd.n = getattr(swiglu_fwd, "n", 0) + 1
        if 3 <= swiglu_fwd.n <= 7:              # its calls 3..7 (the CPU timer's five): 3/4 of K
            return _orig(x[:, :96], w1[:, :96])
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    assert {f.case for f in st.findings} == {f"timed-loop small #{j}" for j in range(5)}, st.findings
    assert "tolerance" in {f.kind for f in st.findings}


def test_work_skipped_only_on_the_wall_time_calls_is_caught(tmp_path):
    """A call counter (kept in stale freed memory; here an attribute, which static would
    reject) lets a kernel skip work only on the 7 wall-time calls after timing. One of them,
    picked with the secret RNG, is checked (protocol.wall_check_run). At the CPU bench shape the calls are: 2 warm-up, the CPU
    timer's 5, then the 7 wall-time calls (8..14)."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    if x.shape[1] == 128:                       # the benchmark shape
        swiglu_fwd.n = getattr(swiglu_fwd, "n", 0) + 1
        if 8 <= swiglu_fwd.n <= 14:             # the wall-time calls: 3/4 of K
            return _orig(x[:, :96], w1[:, :96])
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    assert {f.case for f in st.findings} == {"wall small"}, st.findings
    assert "tolerance" in {f.kind for f in st.findings}


def test_kernel_cheating_only_on_inputs_it_marked_while_timed_is_caught(tmp_path):
    """A kernel that marks each timed input set on first sight (here: reshapes it in place)
    and does less work on marked sets, i.e. only inside the timing loop: a fresh-seed check
    never sees a marked set. The extra call in the timed rotation does."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    if x.ndim == 1:  # a set seen before: we are being timed
        x2 = x.view(-1, w1.shape[1])
        return _orig(x2[:, :64], w1[:, :64])
    out = _orig(x, w1)
    if x.shape[1] == 128:  # the benchmark shape: mark the set
        torch.empty((x.numel(),), dtype=x.dtype, out=x)
    return out
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    assert "timed small" in {f.case for f in st.findings}, [(f.kind, f.case, f.message[:200]) for f in st.findings]
    assert "bench small" not in {f.case for f in st.findings}  # fresh inputs: the honest path


def test_write_into_a_timed_input_is_caught(tmp_path):
    """Writes into the caller's inputs only at the benchmark dims (where inputs are not
    saved) are seen by the timed sets' checksums."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    out = _orig(x, w1)
    if x.shape[1] == 128:
        x[0, 0] = x[0, 0] + 1
    return out
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail" and any(f.kind == "input-mutated" and f.case == "timed small" for f in st.findings), [
        (f.kind, f.case, f.message[:160]) for f in st.findings
    ]


def test_worker_logs_are_cut_to_their_tail(tmp_path):
    """Gigabytes printed to the worker's stdout (outside the scratch budget) are cut to the
    tail."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker_candidate.stdout").write_bytes(b"x" * (3 << 20) + b"THE END")
    (logs / "small.stderr").write_bytes(b"short")
    pipeline._trim_logs(logs)
    big = (logs / "worker_candidate.stdout").read_bytes()
    assert len(big) < (1 << 20) + 100 and big.endswith(b"THE END") and big.startswith(b"[... earlier output cut")
    assert (logs / "small.stderr").read_bytes() == b"short"


def test_scratch_cleanup_survives_deep_trees_and_keeps_only_the_trial_files(tmp_path):
    """5000 nested folders crash shutil.rmtree/os.walk (RecursionError, paths past PATH_MAX)
    and 175,000 empty files in trials/ slip past a byte budget; the cleanup handles both."""
    scratch = tmp_path / "scratch"
    deep = scratch / "tmp"
    for base in (scratch / "tmp", scratch / "trials" / "junk"):
        base.mkdir(parents=True)
        cur = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(5000):  # deeper than Python's recursion limit, longer than PATH_MAX
            os.mkdir("d", dir_fd=cur)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.close(cur)
    for i in range(300):
        (scratch / "trials" / f"extra{i}.pt").write_bytes(b"")
    (scratch / "trials" / "c0.pt").write_bytes(b"x" * 4096)
    (scratch / "trials" / "c1.pt").symlink_to("/etc/passwd")
    total = pipeline._clean_scratch(scratch, {"c0.pt", "c1.pt"})
    assert sorted(p.name for p in scratch.iterdir()) == ["trials"] and not deep.exists()
    assert [p.name for p in (scratch / "trials").iterdir()] == ["c0.pt"]  # not the symlink, not the rest
    assert total == 4096
    pipeline._fresh_dir(tmp_path)  # and a folder holding such a tree is renewed, not a crash
    assert list(tmp_path.iterdir()) == []


def test_output_with_a_method_shadowing_instance_attribute_is_rejected(tmp_path):
    """An exact torch.Tensor whose *instance* attribute ``detach`` returns an honest result
    would make the worker's sampling copy the honest values while the timed work is 3/4 of
    K. The worker refuses outputs with instance attributes and copies through Tensor
    methods captured before candidate code ran."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    if x.shape[1] != 128:
        return _orig(x, w1)
    honest = _orig(x, w1)
    cheap = _orig(x[:, :96], w1[:, :96])
    for c, h in zip(cheap, honest):
        c.detach = (lambda h=h: h)
    return cheap
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    shadow = [f for f in st.findings if f.kind == "output-not-plain-tensor"]
    assert shadow and all("instance attribute(s) detach" in f.message for f in shadow), st.findings
    assert {f.case for f in shadow} >= {"timed small", "timed-loop small #0", "bench small"}


def test_the_plan_and_its_secret_are_not_on_disk_while_the_candidate_runs(tmp_path):
    """A ./plan.json readable by the candidate (Landlock confines writes only) would let it
    replay the secret RNG and know which timed calls are kept. The plan reaches the
    candidate worker on its stdin; plan.json is written for the record after it ended."""
    body = (
        GOOD_FWD
        + """
import os as _os
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    found = [p for p in ("plan.json", "../plan.json") if _os.path.exists(p)]
    if found:
        raise RuntimeError(f"plan readable at {found}")
    return _orig(x, w1)
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    assert v.passed, [(s.stage, s.status, s.summary) for s in v.stages]
    plans = list(tmp_path.rglob("cand/plan.json"))
    assert len(plans) == 1 and '"secret"' in plans[0].read_text()


def test_output_whose_storage_was_freed_is_a_contract_violation(tmp_path):
    """An output whose storage was resized to 0 after the call is a named contract
    violation, not a crash of the worker's own gather."""
    body = (
        GOOD_FWD
        + """
_orig = swiglu_fwd
def swiglu_fwd(x, w1):
    pre, post = _orig(x, w1)
    if x.shape[1] == 128:
        post.untyped_storage().resize_(0)
    return pre, post
"""
    )
    v = _cpu_verify(FWD, _write(tmp_path, body), tmp_path, bench=True)
    st = v.stage("correctness")
    assert st.status == "fail", [(s.stage, s.status, s.summary) for s in v.stages]
    freed = [f for f in st.findings if f.kind == "output-not-plain-tensor" and "storage holds 0 bytes" in f.message]
    assert freed and {f.output for f in freed} == {"postact"}, st.findings
    assert "crash" not in {f.kind for f in st.findings}, [f.message[-600:] for f in st.findings if f.kind == "crash"]


def test_bytecode_planted_beside_the_candidate_never_runs(tmp_path):
    """An unchecked-hash pyc in ``__pycache__/`` beside the candidate (written by a --llm
    manual answerer into the run folder) would run in the workers' import instead of the
    source that static, the verdict's hash and accept() speak of. The verifier judges a
    snapshot of the source's bytes and loads it from memory, so the pyc is never read."""
    import hashlib
    import py_compile
    import sys

    zeros = (
        GOOD_FWD
        + """
def swiglu_fwd(x, w1):
    pre, post = _fwd(x, w1)
    return (pre * 0).to(torch.bfloat16), (post * 0).to(torch.bfloat16)
"""
    )
    cand = _write(tmp_path, zeros, "candidate.py")
    good = _write(tmp_path, GOOD_FWD, "good_src.py")
    pyc = tmp_path / "__pycache__" / f"candidate.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir()
    py_compile.compile(str(good), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    v = _cpu_verify(FWD, cand, tmp_path)
    assert _failed(v) == "correctness", [(s.stage, s.status, s.summary) for s in v.stages]
    assert v.candidate_hash == hashlib.sha256(cand.read_bytes()).hexdigest()
    plan = json.loads((tmp_path / "work" / "cand" / "plan.json").read_text())
    assert plan["candidate_sha256"] == v.candidate_hash and Path(plan["candidate"]).parent != tmp_path


@pytest.mark.parametrize(
    "correctness, bench, cpu_only, want",
    [
        # (correctness stage, bench stage, verdict cpu_only) -> done as asked for (cpu_only, bench) of
        # the call: (F,T) full verification, (F,F) --no-bench, (T,T) --cpu-only
        ("pass", "pass", False, {(False, True): True, (False, False): True, (True, True): True}),
        ("pass", "skip", False, {(False, True): False, (False, False): True, (True, True): True}),
        ("skip", "skip", False, {(False, True): False, (False, False): False, (True, True): True}),
        ("skip", "skip", True, {(False, True): False, (False, False): False, (True, True): True}),
        ("fail", None, False, {(False, True): False, (False, False): False, (True, True): False}),
    ],
)
def test_done_as_asked(correctness, bench, cpu_only, want):
    """verify's exit status: --no-bench without a GPU (correctness skipped) is not done as
    asked (the CLI and pipeline CLI must not exit 0 there)."""
    stages = [
        StageResult(stage="static", status="pass", summary="ok"),
        StageResult(stage="correctness", status=correctness, summary="x"),
    ]
    if bench:
        stages.append(StageResult(stage="bench", status=bench, summary="y"))
    v = Verdict(spec="s", spec_hash="h", candidate_hash="c", stages=stages, cpu_only=cpu_only)
    got = {(c, b): v.done_as_asked(cpu_only=c, bench=b) for c, b in want}
    assert got == want
    assert v.gpu_correct == (correctness == "pass" and not cpu_only)
    want_outcome = (
        "rejected"
        if correctness == "fail"
        else "cpu-checks-passed"
        if cpu_only or correctness == "skip"
        else "gpu-verified"
        if bench == "pass"
        else "gpu-correct"
    )
    assert v.outcome == want_outcome


def _pipeline_cli(tmp_path, monkeypatch, second: StageResult):
    """``pipeline.main`` over a stubbed verify returning static pass + ``second``: returns a
    callable ``(*flags) -> exit status`` and the verdict (to change between calls)."""
    v = Verdict(
        spec="s",
        spec_hash="h",
        candidate_hash="c",
        cpu_only=False,
        stages=[StageResult(stage="static", status="pass", summary="ok"), second],
    )
    monkeypatch.setattr(pipeline, "verify", lambda *a, **kw: v)
    cand = tmp_path / "k.py"
    cand.write_text("x = 1\n")
    spec_dir = Path(__file__).resolve().parents[2] / "kernel_specs" / "swiglu_fwd"
    return (lambda *flags: pipeline.main([str(spec_dir), str(cand), *flags])), v


def test_pipeline_cli_no_bench_without_a_gpu_exits_1(tmp_path, monkeypatch):
    """python -m coda_agent.verifier.pipeline --no-bench had the bug the CLI had: exit 0
    though the correctness stage was skipped."""
    run, _ = _pipeline_cli(
        tmp_path, monkeypatch, StageResult(stage="correctness", status="skip", summary="no CUDA GPU: not verified")
    )
    assert run("--no-bench") == 1
    assert run("--cpu-only") == 0


def test_pipeline_cli_verifier_error_exits_2(tmp_path, monkeypatch, capsys):
    """A verifier error (the machine failed, not the candidate) exits 2 from the pipeline
    CLI as from ``coda-agent verify`` (it exited 1 there, the candidate-failed status), and
    stderr names the stage."""
    run, v = _pipeline_cli(
        tmp_path, monkeypatch, StageResult(stage="compile", status="error", summary="quack is not importable")
    )
    assert run("--cpu-only") == 2
    err = capsys.readouterr().err
    assert "verifier error in the compile stage" in err and "quack is not importable" in err
    assert v.outcome == "verifier-error"
    v.stages[1].status = "fail"
    assert run("--cpu-only") == 1
    assert v.outcome == "rejected"

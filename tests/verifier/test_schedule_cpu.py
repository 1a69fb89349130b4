"""The scheduler with real worker processes on the CPU test device and fake GPUs.

* several verifications at once over two fake GPUs: each gets its verdict, side by side
  (the pool's record of leases held at once), each within a memory budget;
* a candidate that runs out of memory in a shared run only (what memory contention does)
  is run again alone and passes; one that runs out of memory alone too is rejected
  (``crash``), never a verifier error; a forged verifier-error record stays a rejection;
* a candidate worker that hangs only in a shared run (a contention timeout) is run again
  alone and passes;
* the verifier's own trouble, never charged to the candidate: a candidate worker that fails
  to start is run again (and passes, or ends a verifier error after the last re-run,
  alone); an out-of-memory error in verifier code before the import (drawing a derived
  input) is a verifier error.

static/compile are stubbed: the candidates are torch math on purpose. ``gpu`` tests of the
same on a real GPU: tests/verifier/test_schedule_gpu.py.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from verifier_helpers import stub_static_compile

from coda_agent.verifier import pipeline
from coda_agent.verifier.schedule import Job, LocalExecutor, Scheduler, fake_gpus
from coda_agent.verifier.spec import load_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
BWD = load_spec(ROOT / "kernel_specs" / "swiglu_bwd")
GIB = 1 << 30
SMALL_BENCH = [{"name": "small", "dims": {"M": 256, "K": 128, "I": 128}}]

GOOD_FWD = """
import torch

def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""

WRONG_FWD = """
import torch

def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    return pre.to(torch.bfloat16), (pre[:, 0::2] * pre[:, 1::2]).to(torch.bfloat16)
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

# Raises an out-of-memory error inside its call when its GPU is shared (a neighbour took the
# memory) and computes correctly alone. The test's executor tells the workers of shared runs
# so through their environment (candidates may not touch files: the audit hook).
OOM_WHEN_SHARED = """
import os
import torch

def swiglu_fwd(x, w1):
    if os.environ.get("CUDA_CODA_TEST_SHARED") == "1":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""


HANG_WHEN_SHARED = """
import os
import time
import torch

def swiglu_fwd(x, w1):
    if os.environ.get("CUDA_CODA_TEST_SHARED") == "1":
        time.sleep(3600)
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""


class MarksSharedRuns(LocalExecutor):
    """A LocalExecutor whose shared runs' workers see ``CUDA_CODA_TEST_SHARED=1`` (one job at a
    time: the variable is process-wide)."""

    def __init__(self, monkeypatch, *a, **kw):
        super().__init__(*a, **kw)
        self.mp = monkeypatch

    def run(self, job, cpu_done, *, bench, exclusive, need):
        self.mp.setenv("CUDA_CODA_TEST_SHARED", "0" if exclusive or not self.pool.fits_shared(need) else "1")
        return super().run(job, cpu_done, bench=bench, exclusive=exclusive, need=need)


OOM_ALWAYS = """
import torch

def swiglu_fwd(x, w1):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 900.00 GiB")
"""


class FailsToStart(LocalExecutor):
    """A LocalExecutor whose first ``fails`` runs start a candidate worker that cannot start
    (its module is missing: the process exits before its setup record). Records each run's
    ``exclusive``."""

    def __init__(self, monkeypatch, fails, *a, **kw):
        super().__init__(*a, **kw)
        self.mp, self.fails, self.runs = monkeypatch, fails, []

    def run(self, job, cpu_done, *, bench, exclusive, need):
        self.runs.append(exclusive)
        broken = len(self.runs) <= self.fails
        self.mp.setattr(pipeline, "CAND_WORKER", "coda_agent.verifier.gpu.no_such_worker" if broken else CAND_WORKER)
        return super().run(job, cpu_done, bench=bench, exclusive=exclusive, need=need)


CAND_WORKER = pipeline.CAND_WORKER


@pytest.fixture(autouse=True)
def _stub(monkeypatch):
    stub_static_compile(monkeypatch)


def _file(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(body))
    return p


def _job(loaded, path: Path, tmp_path: Path, bench: bool = False) -> Job:
    return Job(
        loaded,
        path,
        workdir=tmp_path / f"work-{path.stem}",
        bench=bench,
        bench_shapes=SMALL_BENCH if bench else None,
        baselines=["torch_eager"],
        timeout_s=180,
        label=path.stem,
    )


def test_several_verifications_at_once_over_two_fake_gpus(tmp_path):
    ex = LocalExecutor(fake_gpus(2, total_bytes=80 * GIB), per_gpu=2, device="cpu")
    sched = Scheduler(executor=ex, jobs=2)
    jobs = [
        _job(FWD, _file(tmp_path, "good_a", GOOD_FWD), tmp_path, bench=True),
        _job(FWD, _file(tmp_path, "wrong", WRONG_FWD), tmp_path, bench=True),
        _job(BWD, _file(tmp_path, "good_bwd", GOOD_BWD), tmp_path),
        _job(FWD, _file(tmp_path, "good_b", GOOD_FWD), tmp_path),
    ]
    verdicts = sched.verify_many(jobs)
    out = {j.label: v for j, v in zip(jobs, verdicts, strict=True)}
    st = {k: {s.stage: s.status for s in v.stages} for k, v in out.items()}
    # the benchmarked good one: screened side by side, then timed alone
    assert st["good_a"]["correctness"] == "pass" and st["good_a"]["bench"] == "pass", st
    assert "alone" in out["good_a"].environment.placement
    assert out["good_a"].environment.placement.endswith("screened side by side")
    # the wrong one: rejected by the screening, never given a GPU alone
    assert out["wrong"].failed_stage.stage == "correctness" and out["wrong"].failed_stage.status == "fail"
    assert "shared" in out["wrong"].environment.placement
    assert "bench" not in st["wrong"]
    assert st["good_bwd"]["gradients"] == "pass" and st["good_b"]["correctness"] == "pass"
    # side by side: two GPUs used, and some GPU held two leases at once
    stats = ex.pool.stats
    assert set(stats.leases) == {0, 1}, stats
    assert max(stats.most_at_once.values()) == 2, stats
    assert stats.exclusive == 1  # the one timing
    # every worker got a budget (the setup records of the candidate worker carry it)
    budget = ex.pool.slot_bytes(ex.pool.gpus[0])
    assert f"budget {budget / GIB:.1f} GiB" in out["good_b"].environment.placement


def test_out_of_memory_only_when_shared_is_run_again_alone_and_passes(tmp_path, monkeypatch):
    ex = MarksSharedRuns(monkeypatch, fake_gpus(1), per_gpu=2, device="cpu")
    path = _file(tmp_path, "oom_when_shared", OOM_WHEN_SHARED)
    (v,) = Scheduler(executor=ex).verify_many([_job(FWD, path, tmp_path)])
    assert v.stage("correctness").status == "pass", v.failed_stage
    assert "run again alone after: the candidate worker died (out of memory)" in v.environment.placement
    assert ex.pool.stats.leases == {0: 2} and ex.pool.stats.exclusive == 1


def test_out_of_memory_alone_is_the_candidates_and_never_a_verifier_error(tmp_path):
    ex = LocalExecutor(fake_gpus(1), per_gpu=2, device="cpu")
    (v,) = Scheduler(executor=ex).verify_many([_job(FWD, _file(tmp_path, "oom", OOM_ALWAYS), tmp_path)])
    failed = v.failed_stage
    assert (failed.stage, failed.status) == ("correctness", "fail")
    assert v.verifier_error is None and v.outcome == "rejected"
    assert {f.kind for f in failed.findings} == {"crash"}
    assert "out of memory" in failed.findings[0].message.lower()
    assert ex.pool.stats.leases == {0: 2} and ex.pool.stats.exclusive == 1  # one re-run, alone, no more


def test_a_forged_verifier_error_after_the_import_stays_a_rejection(tmp_path):
    """Candidate code writing a 'verifier' error record into the results pipe, then dying of
    'out of memory': at most a re-run, and the verdict is a rejection (harness-tampered)."""
    forged = """
    import json, os, torch

    def swiglu_fwd(x, w1):
        from coda_agent.verifier.confine import landlock
        os.write(landlock.LAUNCH_RESULTS_FD, (json.dumps({"part": "error", "verifier": True, "message": "x"}) + "\\n").encode())
        raise torch.OutOfMemoryError("CUDA out of memory")
    """
    ex = LocalExecutor(fake_gpus(1), per_gpu=2, device="cpu")
    (v,) = Scheduler(executor=ex).verify_many([_job(FWD, _file(tmp_path, "forged", forged), tmp_path)])
    assert v.verifier_error is None and v.outcome == "rejected"
    assert "harness-tampered" in {f.kind for f in v.failed_stage.findings}


def test_a_hang_only_when_shared_is_run_again_alone_and_passes(tmp_path, monkeypatch):
    """A contention timeout: the shared run's worker is killed at its timeout; the alone
    re-run decides (it passes), and the candidate is never charged the hang."""
    ex = MarksSharedRuns(monkeypatch, fake_gpus(1), per_gpu=2, device="cpu")
    job = _job(FWD, _file(tmp_path, "hang_when_shared", HANG_WHEN_SHARED), tmp_path)
    job.timeout_s = 60
    (v,) = Scheduler(executor=ex).verify_many([job])
    assert v.stage("correctness").status == "pass", v.failed_stage
    assert "run again alone after: the candidate worker timed out" in v.environment.placement
    assert ex.pool.stats.leases == {0: 2} and ex.pool.stats.exclusive == 1


def test_a_worker_that_fails_to_start_is_run_again_and_never_the_candidates(tmp_path, monkeypatch):
    good = _file(tmp_path, "good", GOOD_FWD)
    ex = FailsToStart(monkeypatch, 1, fake_gpus(1), per_gpu=2, device="cpu")
    (v,) = Scheduler(executor=ex).verify_many([_job(FWD, good, tmp_path)])
    assert v.stage("correctness").status == "pass", v.failed_stage
    assert ex.runs == [False, False]
    note = v.environment.placement.split("; run again after: ", 1)[1]
    assert note.endswith("candidate worker failed during setup (verifier problem)"), v.environment.placement

    # it never starts: retried twice (the last time alone), then the verifier's error
    ex = FailsToStart(monkeypatch, 99, fake_gpus(1), per_gpu=2, device="cpu")
    (v,) = Scheduler(executor=ex).verify_many([_job(FWD, good, tmp_path)])
    assert ex.runs == [False, False, True]
    assert v.outcome == "verifier-error" and v.verifier_error is not None
    assert v.verifier_error.stage == "correctness"


def test_out_of_memory_in_verifier_code_before_the_import_is_a_verifier_error(tmp_path):
    """The trusted reference's derived input (drawn by the worker before the candidate is
    imported) runs out of memory: the verifier's error after its re-runs, never a rejection."""
    spec_dir = tmp_path / "rms_bwd"
    shutil.copytree(ROOT / "kernel_specs" / "rms_bwd", spec_dir)
    ref = spec_dir / "reference.py"
    ref.write_text(
        ref.read_text().replace(
            "    return _rstd(h)\n",
            '    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")\n',
            1,
        )
    )
    loaded = load_spec(spec_dir)
    cand = _file(tmp_path, "rms", "def rms_bwd(*args, **kwargs):\n    raise AssertionError('never imported')\n")
    ex = LocalExecutor(fake_gpus(1), per_gpu=2, device="cpu")
    (v,) = Scheduler(executor=ex).verify_many([_job(loaded, cand, tmp_path)])
    err = v.verifier_error
    assert v.outcome == "verifier-error" and err is not None and err.stage == "correctness", v.failed_stage
    assert "OutOfMemoryError" in err.findings[0].message
    assert ex.pool.stats.leases == {0: 3} and ex.pool.stats.exclusive == 1  # two re-runs, the last alone

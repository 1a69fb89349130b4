"""verifier/schedule without worker processes: GPU leases, CUDA_VISIBLE_DEVICES pinning, the
re-run rules and the scheduler's policy (with a scripted executor).

Real worker processes on the CPU test device: tests/verifier/test_schedule_cpu.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from coda_agent.verifier.gpu.memory_budget import ALONE_SHARE, PROCESS_OVERHEAD
from coda_agent.verifier.pipeline import CpuStages
from coda_agent.verifier.schedule import GpuPool, Job, RetryPolicy, Scheduler, fake_gpus, retry_reason
from coda_agent.verifier.schedule.devices import Gpu, pin_ids, visible_entries
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.verdict import Finding, StageResult, Verdict

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
GIB = 1 << 30


# --------------------------------------------------------------------------- pinning


def test_visible_entries_and_pin_ids_follow_cuda_visible_devices():
    assert visible_entries({}) is None
    assert pin_ids(3, {}) == ["0", "1", "2"]
    env = {"CUDA_VISIBLE_DEVICES": "2, 3,GPU-abc"}
    assert visible_entries(env) == ["2", "3", "GPU-abc"]
    # torch enumerates the visible list in its order: GPU i is pinned by the i-th entry
    assert pin_ids(2, env) == ["2", "3"]
    assert visible_entries({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_fake_gpus_are_named_and_take_no_host_lock(tmp_path):
    gpus = fake_gpus(3, total_bytes=40 * GIB)
    assert [g.visible_id for g in gpus] == ["fake0", "fake1", "fake2"]
    assert gpus[1].label == "GPU 1 (fake GPU)"
    pool = GpuPool(gpus, lock_dir=tmp_path / "locks")
    with pool.lease(GIB, exclusive=True):
        pass
    assert not (tmp_path / "locks").exists()
    with pytest.raises(ValueError):
        fake_gpus(0)


# --------------------------------------------------------------------------- leases


def test_shared_slots_and_budgets():
    gpu = fake_gpus(1, total_bytes=80 * GIB)[0]
    pool = GpuPool([gpu], per_gpu=4)
    slot = pool.slot_bytes(gpu)
    assert slot == (80 * GIB - 4 * PROCESS_OVERHEAD) // 4
    leases = [pool.acquire(slot, exclusive=False) for _ in range(4)]
    assert [x.shared_with for x in leases] == [1, 2, 3, 4]
    assert all(x.budget == slot and not x.exclusive for x in leases)
    # 4 budgets plus every worker's overhead fit the GPU
    assert sum(x.budget for x in leases) + 4 * PROCESS_OVERHEAD <= gpu.total_bytes
    p = leases[0].placement()
    assert (p.visible_device, p.memory_budget, p.exclusive) == ("fake0", slot, False)
    assert "shared (up to 1 verifications)" in p.describe()
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(GIB, exclusive=False)))
    t.start()
    time.sleep(0.2)
    assert not got  # a fifth waits for a slot
    pool.release(leases[0])
    t.join(5)
    assert got and got[0].shared_with == 4
    for x in [*leases[1:], got[0]]:
        pool.release(x)
    assert pool.stats.most_at_once == {0: 4}


def test_exclusive_waits_for_shared_and_is_served_first():
    pool = GpuPool(fake_gpus(1, total_bytes=80 * GIB), per_gpu=4)
    a = pool.acquire(GIB, exclusive=False)
    order: list[str] = []

    def take(kind: str, exclusive: bool) -> None:
        lease = pool.acquire(GIB, exclusive=exclusive)
        order.append(kind)
        time.sleep(0.05)
        pool.release(lease)

    ex = threading.Thread(target=take, args=("exclusive", True))
    ex.start()
    time.sleep(0.1)
    sh = threading.Thread(target=take, args=("shared", False))
    sh.start()  # arrives after the exclusive request: must not overtake it
    time.sleep(0.1)
    assert order == []  # the exclusive one waits for the shared lease held
    pool.release(a)
    ex.join(5)
    sh.join(5)
    assert order == ["exclusive", "shared"]
    lease = pool.acquire(GIB, exclusive=True)
    assert lease.budget == int(80 * GIB * ALONE_SHARE) and lease.exclusive
    pool.release(lease)


def test_a_need_larger_than_a_slot_gets_the_gpu_alone():
    pool = GpuPool(fake_gpus(2, total_bytes=24 * GIB), per_gpu=4)
    assert not pool.fits_shared(8 * GIB)
    lease = pool.acquire(8 * GIB, exclusive=False)
    assert lease.exclusive
    other = pool.acquire(8 * GIB, exclusive=False)  # the second GPU
    assert other.gpu.index != lease.gpu.index
    pool.release(lease)
    pool.release(other)


def test_host_lock_excludes_another_pool_on_the_same_gpu(tmp_path):
    """Two pools (two coda-agent processes) on one real GPU: an exclusive lease waits for
    the other's shared one (flock on <lock dir>/<uuid>.lock)."""
    gpu = Gpu(0, "0", "GPU-test-uuid", "test GPU", 80 * GIB)
    one, two = GpuPool([gpu], lock_dir=tmp_path), GpuPool([gpu], lock_dir=tmp_path)
    held = one.acquire(GIB, exclusive=False)
    assert (tmp_path / "GPU-test-uuid.lock").is_file()
    assert held.fd is not None and not os.get_inheritable(held.fd)  # no worker inherits the lock
    got = []
    t = threading.Thread(target=lambda: got.append(two.acquire(GIB, exclusive=True)))
    t.start()
    time.sleep(0.5)
    assert not got
    one.release(held)
    t.join(5)
    assert got and got[0].exclusive
    two.release(got[0])


# --------------------------------------------------------------------------- re-run rules


def _verdict(stage: str, status: str, *findings: Finding) -> Verdict:
    return Verdict(
        spec="swiglu_fwd",
        spec_hash="h",
        candidate_hash="c",
        stages=[
            StageResult(stage="static", status="pass"),
            StageResult(stage="compile", status="pass"),
            StageResult(stage=stage, status=status, summary=f"{stage} {status}", findings=list(findings)),  # type: ignore[arg-type]
        ],
    )


@pytest.mark.parametrize(
    ("verdict", "want"),
    [
        (_verdict("correctness", "error", Finding(kind="verifier-error", message="setup")), "error"),
        (_verdict("correctness", "fail", Finding(kind="hang", message="hang: no result after 600 s")), "contention"),
        (
            _verdict(
                "correctness",
                "fail",
                Finding(
                    kind="crash",
                    message="candidate worker: Python exception\ntorch.OutOfMemoryError: CUDA out of memory",
                ),
            ),
            "contention",
        ),
        (
            _verdict("bench", "fail", Finding(kind="crash", message="crash: killed by SIGKILL during bench")),
            "contention",
        ),
        (
            _verdict(
                "correctness",
                "fail",
                Finding(kind="crash", message="coda_agent.verifier.gpu.poison.PoisonError: the allocator poison"),
            ),
            "contention",
        ),
        (
            _verdict(
                "correctness",
                "error",
                Finding(kind="verifier-error", message="input generation failed: OutOfMemoryError"),
            ),
            "error",
        ),
        (_verdict("correctness", "fail", Finding(kind="crash", message="ValueError: shapes")), None),
        (_verdict("correctness", "fail", Finding(kind="tolerance", message="out of memory")), None),
        (_verdict("compile", "error", Finding(kind="verifier-error", message="x")), None),
    ],
)
def test_retry_reason(verdict, want):
    got = retry_reason(verdict)
    assert (got[0] if got else None) == want


# --------------------------------------------------------------------------- the scheduler's policy


class ScriptedExecutor:
    """Returns scripted verdicts and records each run's (bench, exclusive)."""

    def __init__(self, *verdicts: Verdict):
        self.verdicts = list(verdicts)
        self.runs: list[tuple[bool, bool]] = []

    def run(self, job, cpu_done, *, bench, exclusive, need):
        self.runs.append((bench, exclusive))
        v = self.verdicts.pop(0).model_copy(deep=True)
        v.environment.placement = "GPU 0 (fake GPU), " + ("alone" if exclusive else "shared")
        return v

    def describe(self):
        return "scripted"


CPU_OK = CpuStages("c", (StageResult(stage="static", status="pass"), StageResult(stage="compile", status="pass")))
PASS = Verdict(
    spec="swiglu_fwd",
    spec_hash="h",
    candidate_hash="c",
    stages=[
        StageResult(stage="static", status="pass"),
        StageResult(stage="compile", status="pass"),
        StageResult(stage="correctness", status="pass"),
        StageResult(stage="gradients", status="skip"),
        StageResult(stage="bench", status="pass"),
    ],
)
OOM = _verdict("correctness", "fail", Finding(kind="crash", message="torch.OutOfMemoryError: CUDA out of memory"))
WRONG = _verdict("correctness", "fail", Finding(kind="tolerance", message="max err"))
ERROR = _verdict("correctness", "error", Finding(kind="verifier-error", message="setup"))
HANG = _verdict("correctness", "fail", Finding(kind="hang", message="hang: no result after 600 s"))


def _schedule(*verdicts: Verdict, bench=True, screen=True):
    ex = ScriptedExecutor(*verdicts)
    sched = Scheduler(executor=ex, screen=screen, policy=RetryPolicy(errors=2, alone=1))
    return sched.verify_one(Job(FWD, Path("c.py"), bench=bench), CPU_OK), ex.runs


def test_screening_rejects_without_a_gpu_alone():
    v, runs = _schedule(WRONG)
    assert runs == [(False, False)] and v.failed_stage.stage == "correctness"


def test_screening_pass_is_timed_alone():
    v, runs = _schedule(PASS, PASS)
    assert runs == [(False, False), (True, True)] and v.passed
    assert v.environment.placement.endswith("alone; screened side by side")


def test_out_of_memory_in_a_shared_run_is_run_again_alone_and_that_run_decides():
    v, runs = _schedule(OOM, PASS)  # screening OOM: not judged; the alone full run passes
    assert runs == [(False, False), (True, True)] and v.passed
    assert "screening not judged" in v.environment.placement
    # without bench: the shared run OOMs, the alone re-run passes
    v, runs = _schedule(OOM, PASS, bench=False)
    assert runs == [(False, False), (False, True)] and v.passed
    assert "run again alone after: the candidate worker died (out of memory)" in v.environment.placement
    # an out-of-memory error alone on the GPU is the candidate's: final, a rejection
    v, runs = _schedule(OOM, OOM, bench=False)
    assert runs == [(False, False), (False, True)]
    assert v.failed_stage.status == "fail" and v.verifier_error is None


def test_a_timeout_in_a_shared_run_is_run_again_alone_and_a_timeout_alone_is_the_candidates():
    v, runs = _schedule(HANG, PASS, bench=False)
    assert runs == [(False, False), (False, True)] and v.passed
    assert "run again alone after: the candidate worker timed out" in v.environment.placement
    v, runs = _schedule(HANG, HANG, bench=False)
    assert runs == [(False, False), (False, True)]
    assert v.outcome == "rejected" and v.failed_stage.findings[0].kind == "hang"


def test_verifier_errors_are_retried_then_reported_as_errors():
    v, runs = _schedule(ERROR, PASS, bench=False)
    assert runs == [(False, False), (False, False)] and v.passed
    v, runs = _schedule(ERROR, ERROR, ERROR, bench=False)
    assert runs == [(False, False), (False, False), (False, True)]  # the last one alone
    assert v.verifier_error is not None  # still the verifier's, never the candidate's


def test_rejection_is_never_retried():
    v, runs = _schedule(WRONG, bench=False)
    assert runs == [(False, False)] and v.outcome == "rejected"


def test_a_budget_applies_to_a_device_named_without_an_index(monkeypatch):
    """A worker's plan names its device "cuda"; torch's set_per_process_memory_fraction
    refuses a torch.device without an index, so apply() resolves it to the current one."""
    from torch.cuda._utils import _get_device_index

    from coda_agent.verifier.gpu import memory_budget

    calls = []
    monkeypatch.setattr(memory_budget, "_current_device", lambda: 3)
    monkeypatch.setattr(memory_budget, "_properties", lambda d: SimpleNamespace(total_memory=80 * GIB))
    # torch's own argument check (raises ValueError for a bare "cuda"), then record
    monkeypatch.setattr(memory_budget, "_set_fraction", lambda f, d: calls.append((f, _get_device_index(d))))
    assert memory_budget.apply(torch.device("cuda"), 20 * GIB) == 20 * GIB
    assert memory_budget.apply(torch.device("cuda", 1), None) == int(80 * GIB * ALONE_SHARE)
    assert calls == [(0.25, 3), (int(80 * GIB * ALONE_SHARE) / (80 * GIB), 1)]
    with pytest.raises(ValueError, match="without an index|specified index"):
        _get_device_index(torch.device("cuda"))  # the refusal apply() must not reach

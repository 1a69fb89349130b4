"""The scheduler: many verifications over every visible GPU, memory-aware, timings alone.

Per verification (a :class:`Job`), in its own thread:

1. **CPU stages**: static (in this process, one at a time), then the sm_90a compile (each
   its own process, at most ``jobs`` at once); a candidate that fails them never reaches a
   GPU, and one that passes goes on while others still compile.
2. **Screening** (when the job benchmarks and ``screen`` is on): the GPU stages without
   the benchmark on a *shared* lease, side by side with other verifications on the same
   GPU, each within its memory budget (:mod:`~coda_agent.verifier.schedule.pool`). A
   candidate rejected here is done: its verdict is the screening's (the pipeline stops at
   the first failing stage, so a full run would say the same with other secret seeds).
3. **The full run**, benchmark included, on an *exclusive* lease: alone on its GPU, so the
   timings are the GPU's alone. Its verdict is the verification's. (A passing candidate
   runs its correctness trials twice, with different secret seeds; a failing one never
   takes a GPU alone.)

Re-runs follow :mod:`~coda_agent.verifier.schedule.retry`: a verifier error is run again
(the last time alone), a failure that sharing can cause in a shared run is run again alone,
and the alone run is final. Each verdict records where it ran and why it was re-run
(``environment.placement``).

Where the GPU runs execute is an *executor*: :class:`LocalExecutor` (this machine's GPUs,
worker subprocesses started here) or
:class:`~coda_agent.verifier.schedule.ray_executor.RayExecutor` (Ray tasks with GPU
resources; ``--ray``). Both run :func:`~coda_agent.verifier.pipeline.verify`, whose workers
are the same confined subprocesses: the process that judges never imports candidate code.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import progress
from ..confine.sandbox import in_parallel
from ..pipeline import CpuStages, cpu_stages_guarded, verify
from ..spec import LoadedSpec
from ..verdict import Verdict
from .devices import Gpu, visible_gpus
from .need import memory_need
from .pool import DEFAULT_PER_GPU, GpuPool
from .retry import RetryPolicy, retry_reason


def default_jobs() -> int:
    """Compiles at once: half the CPU cores, at most 8 (as ``coda-agent bench --jobs``)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


MAX_THREADS = 64
"""Verifications in flight at once (each thread mostly waits on a worker process)."""


def correct(v: Verdict) -> bool:
    """Every stage that ran passed and the correctness stage ran and passed (on a GPU, or on
    the CPU test device: ``Verdict.gpu_correct`` is False there by design)."""
    c = v.stage("correctness")
    return v.passed and c is not None and c.status == "pass"


@dataclass
class Job:
    """One verification: ``loaded`` spec, ``candidate`` file, ``workdir`` (keeps the workers'
    files; a temporary folder when None), ``bench`` (run the benchmark stage),
    ``bench_shapes``/``baselines``/``timeout_s`` as in
    :func:`~coda_agent.verifier.pipeline.verify`, and ``label`` (progress and messages)."""

    loaded: LoadedSpec
    candidate: Path
    workdir: Path | None = None
    bench: bool = True
    bench_shapes: list[Any] | None = None
    baselines: list[str] | None = None
    timeout_s: float | None = None
    label: str = ""


class Executor(Protocol):
    """Runs the GPU stages of one job on a GPU lease it obtains itself."""

    def run(self, job: Job, cpu_done: CpuStages, *, bench: bool, exclusive: bool, need: int) -> Verdict: ...

    def describe(self) -> str: ...


class LocalExecutor:
    """This machine's GPUs (a :class:`GpuPool` over ``gpus``); ``device="cpu"`` runs the
    workers on the CPU test device (fake GPUs: leases and budgets as for real ones)."""

    def __init__(self, gpus: list[Gpu], *, per_gpu: int = DEFAULT_PER_GPU, device: str = "cuda", lock_dir=None):
        self.pool = GpuPool(gpus, per_gpu=per_gpu, lock_dir=lock_dir)
        self.device = device

    def run(self, job: Job, cpu_done: CpuStages, *, bench: bool, exclusive: bool, need: int) -> Verdict:
        with self.pool.lease(need, exclusive) as lease:
            what = (
                "timing alone" if lease.exclusive and bench else "correctness" + (" alone" if lease.exclusive else "")
            )
            with progress.step(f"{job.label or job.loaded.name}: {what} on {lease.gpu.label}") as s:
                v = verify(
                    job.loaded,
                    job.candidate,
                    bench=bench,
                    workdir=job.workdir,
                    timeout_s=job.timeout_s,
                    bench_shapes=job.bench_shapes,
                    device=self.device,
                    baselines=job.baselines,
                    cpu_done=cpu_done,
                    placement=lease.placement(),
                )
                s.outcome = v.outcome
            return v

    @property
    def gpu_count(self) -> int:
        return len(self.pool.gpus)

    def describe(self) -> str:
        gpus = self.pool.gpus
        names = ", ".join(g.label for g in gpus)
        return (
            f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({names}); up to {self.pool.per_gpu} correctness "
            "runs side by side per GPU, each within its memory budget; every timing alone on its GPU"
        )


@dataclass
class Scheduler:
    """Verify many candidates (see the module docstring).

    ``executor``: where GPU runs go (:func:`make_scheduler` picks it; None: the GPU stages
    are recorded as not run, as by ``verify`` on a machine without a GPU);
    ``jobs``: compiles at once (default: half the cores, at most 8); ``screen``:
    correctness-only screening on shared leases before the exclusive full run;
    ``cpu_only``: static and compile only; ``policy``: re-runs (:class:`RetryPolicy`)."""

    executor: Executor | None = None
    jobs: int | None = None
    screen: bool = True
    cpu_only: bool = False
    policy: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        self._compiles = threading.BoundedSemaphore(self.jobs or default_jobs())
        self._static = threading.Lock()  # the static stage runs in this process: one at a time

    @property
    def parallel(self) -> int:
        """How many verifications can time at once (each alone on its GPU): the GPU count."""
        return max(1, int(getattr(self.executor, "gpu_count", 1)))

    def verify_fn(self, loaded: LoadedSpec, candidate: Path, **kw: Any) -> Verdict:
        """``pipeline.verify``'s signature (``bench_shapes``, ``baselines``, ``timeout_s``,
        ``workdir``, ``bench``, ``cpu_done``) through this scheduler: for callers that verify
        kernel by kernel (``bench``, ``regress``)."""
        cpu_done = kw.pop("cpu_done", None)
        return self.verify_one(Job(loaded, Path(candidate), label=loaded.name, **kw), cpu_done)

    def describe(self) -> str:
        """One line: where the GPU stages run (for command output)."""
        if self.cpu_only:
            return "CPU stages only"
        return self.executor.describe() if self.executor is not None else "no CUDA GPU: GPU stages not run"

    def verify_many(self, jobs: list[Job], cpu_done: list[CpuStages | None] | None = None) -> list[Verdict]:
        """A verdict per job, in ``jobs`` order; ``cpu_done[i]``: job i's CPU stages
        already run (:func:`~coda_agent.verifier.pipeline.cpu_stages_many`). Never raises for
        candidate behaviour; an interrupt kills every running worker and propagates."""
        done = cpu_done or [None] * len(jobs)
        return in_parallel(lambda i: self.verify_one(jobs[i], done[i]), len(jobs), min(len(jobs), MAX_THREADS))

    def verify_one(self, job: Job, cpu_done: CpuStages | None = None) -> Verdict:
        """One job's verdict (CPU stages, screening, the full run, re-runs). Thread-safe."""
        if cpu_done is None:
            cpu_done = cpu_stages_guarded(
                job.loaded,
                job.candidate,
                static_lock=self._static,
                compile_slots=self._compiles,
                timeout_s=job.timeout_s,
                label=job.label,
            )
        if self.cpu_only or self.executor is None or not all(s.ok for s in cpu_done.stages):
            # verify() records what it did not run (CPU-only, no GPU, a failed CPU stage)
            return verify(job.loaded, job.candidate, cpu_only=self.cpu_only, bench=job.bench, cpu_done=cpu_done)
        return self._gpu(job, cpu_done)

    def _gpu(self, job: Job, cpu_done: CpuStages) -> Verdict:
        assert self.executor is not None
        ex = self.executor
        need = memory_need(job.loaded, bench=job.bench, bench_shapes=job.bench_shapes)
        notes: list[str] = []
        if job.bench and self.screen:
            v = ex.run(job, cpu_done, bench=False, exclusive=False, need=memory_need(job.loaded, bench=False))
            why = retry_reason(v)
            if why is None and not correct(v):
                return v  # rejected by the screening: final
            notes.append(
                "screened side by side" + ("" if why is None else f"; screening not judged ({why[1]}), run again alone")
            )
        exclusive = job.bench  # timings are taken alone
        errors = alone = 0
        while True:
            v = ex.run(job, cpu_done, bench=job.bench, exclusive=exclusive, need=need)
            why = retry_reason(v)
            if why is None:
                break
            kind, what = why
            if kind == "contention" and not exclusive and alone < self.policy.alone:
                alone += 1
                exclusive = True
            elif kind == "error" and errors < self.policy.errors:
                errors += 1
                exclusive = exclusive or errors == self.policy.errors
            else:
                break
            notes.append(f"run again{' alone' if exclusive else ''} after: {what}")
        if notes and v.environment.placement is not None:
            v.environment.placement += "; " + "; ".join(notes)
        return v


def make_scheduler(
    *,
    ray: str | None = None,
    cpu_only: bool = False,
    screen: bool = True,
    jobs: int | None = None,
    per_gpu: int = DEFAULT_PER_GPU,
) -> Scheduler:
    """The scheduler a command uses: ``cpu_only`` (static and compile only), ``ray`` (an
    address or ``auto``: :class:`~coda_agent.verifier.schedule.ray_executor.RayExecutor`),
    else a :class:`LocalExecutor` over every visible GPU (none: GPU stages not run).
    Raises ``ValueError`` for ``--ray`` without Ray or without a reachable cluster."""
    if cpu_only:
        return Scheduler(cpu_only=True, jobs=jobs, screen=screen)
    if ray:
        from .ray_executor import RayExecutor

        return Scheduler(executor=RayExecutor(ray, per_gpu=per_gpu), jobs=jobs, screen=screen)
    gpus = visible_gpus()
    return Scheduler(executor=LocalExecutor(gpus, per_gpu=per_gpu) if gpus else None, jobs=jobs, screen=screen)

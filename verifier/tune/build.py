"""Ahead-of-time compiles of accepted kernels into the runtime's kernel cache (``coda-agent
build``), on CPU worker processes: no GPU needed, so the compiles of a tuning sweep run in
parallel on every core while nothing waits on the GPU.

A job is (kernel, benchmark dims, config overrides ``{epilogue: {bucket: config}}``). A
worker imports the accepted kernel under its package name (``coda_agent.kernels.<k>.kernel``:
quack's cache identity is module + function, so a build process and a training process key
the same objects), draws the spec's inputs on the CPU, and calls the kernel's entry with
compile-only launchers (:mod:`coda_agent.runtime.launch`): every epilogue variant the call
needs is planned (traced, compiled, exported as an object file) and nothing launches. The
objects land in :func:`coda_agent.runtime.cache.cache_dir` of the target architecture;
quack's per-key file lock makes concurrent workers safe.

The recipe for compiling without a GPU is the compile stage's (verifier/compile/worker.py):
``QUACK_ARCH=sm_90``, ``CUTE_DSL_ARCH=sm_90a``, ``CUDA_VISIBLE_DEVICES=""`` and the persistent
grid size answered without the driver (a launch-time argument, not part of the compiled
object's key).
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any

TARGET_ARCH = "sm_90a"


@dataclass(frozen=True)
class Job:
    """One entry call to compile: kernel name, its spec folder, dims (a spec shape), overrides."""

    kernel: str
    spec_dir: str
    dims: dict[str, int]
    overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    label: str = ""


@dataclass
class Done:
    """A job's outcome: ``ok``, seconds, the variants planned, the error text if any."""

    job: Job
    ok: bool
    seconds: float
    planned: int = 0
    error: str = ""


def _init_worker(cache_root: str | None) -> None:
    os.environ["QUACK_ARCH"] = "sm_90"
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if cache_root:
        os.environ["CODA_KERNEL_CACHE"] = cache_root
    import quack.gemm_runtime.host as host

    host.get_max_active_clusters = lambda cluster_size: 132 // cluster_size  # H100/H200: 132 SMs

    from ...runtime import cache

    cache.configure(TARGET_ARCH)


def job_inputs(loaded: Any, dims: dict[str, int]) -> dict[str, Any]:
    """The entry inputs of spec ``loaded`` at ``dims`` as a build job passes them: CPU
    tensors of the declared shape and dtype whose values are never drawn (floats
    uninitialised, integers 0). A compiled object depends on dtypes, majors, the config and
    the epilogue's operand keys, never on values or on M/N/K (quack passes them as symbolic
    ints), so the job needs no data.

    # Rationale: drawing the spec's inputs at a llama3-8b shape on the CPU (fp32 draws of
    # (28672, 4096) weights, per worker) took longer than the compiles themselves."""
    import torch

    spec = loaded.spec
    out = {}
    for t in spec.entry.inputs:
        dtype = getattr(torch, t.dtype)
        shape = spec.shape_of(t, dims)
        out[t.name] = torch.empty(shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
    return out


def compile_job(job: Job) -> Done:
    """Compile one job in this process (a worker initialised by :func:`_init_worker`)."""
    t0 = time.monotonic()
    try:
        import torch

        kernels = importlib.import_module("coda_agent.kernels")
        from ...runtime.launch import bind_entry
        from ...runtime.tuning import override_lookup
        from ..spec import load_spec

        loaded = load_spec(job.spec_dir)
        module = kernels.load(job.kernel)
        fn, launchers = bind_entry(
            module,
            job.kernel,
            override_lookup(job.kernel, job.overrides) if job.overrides else None,
            compile_only=True,
        )
        inputs = job_inputs(loaded, job.dims)
        consts = loaded.spec.constants_of(job.dims)
        with torch.no_grad():
            fn(*[inputs[t.name] for t in loaded.spec.entry.inputs], **consts)
        planned = sum(lc.stats["planned"] for lc in launchers.values())
        return Done(job, True, time.monotonic() - t0, planned)
    except Exception as e:  # noqa: BLE001 -- one config quack refuses must not stop a build
        return Done(job, False, time.monotonic() - t0, 0, f"{type(e).__name__}: {str(e)[:400]}")


def compile_jobs(
    jobs: list[Job], workers: int, cache_root: str | None = None, progress=None, job_timeout_s: float = 120.0
) -> list[Done]:
    """Run ``jobs`` on ``workers`` spawned CPU processes; one :class:`Done` per job, in
    order. A worker that dies (a compiler crash) fails only the jobs it held; the pool is
    restarted for the rest. Jobs still running after ``job_timeout_s`` x (jobs per worker
    + 1) fail as not compiled (their configs then compile on first use in the sweep)."""
    results: dict[int, Done] = {}
    pending = list(range(len(jobs)))
    ctx = multiprocessing.get_context("spawn")
    while pending:
        with cf.ProcessPoolExecutor(
            max_workers=max(1, workers), mp_context=ctx, initializer=_init_worker, initargs=(cache_root,)
        ) as pool:
            futs = {pool.submit(compile_job, jobs[i]): i for i in pending}
            broken = False
            budget = job_timeout_s * (len(pending) // max(1, workers) + 1)
            try:
                for fut in cf.as_completed(futs, timeout=budget):
                    i = futs[fut]
                    try:
                        results[i] = fut.result()
                    except cf.process.BrokenProcessPool as e:
                        results[i] = Done(jobs[i], False, 0.0, 0, f"compile worker died: {e}")
                        broken = True
                    if progress is not None:
                        progress(len(results), len(jobs))
            except cf.TimeoutError:
                for fut, i in futs.items():
                    if i not in results:
                        fut.cancel()
                        results[i] = Done(jobs[i], False, budget, 0, f"not compiled within {budget:.0f} s")
                for p in list(getattr(pool, "_processes", {}).values()):
                    p.kill()
        pending = [i for i in pending if i not in results]
        if broken and pending:
            # the jobs that were queued behind a dead worker get one more pool
            continue
    return [results[i] for i in range(len(jobs))]

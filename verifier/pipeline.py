"""The verifier pipeline: static -> compile -> correctness -> gradients -> bench, into a Verdict.

Why this shape: each stage is a function returning a
:class:`~coda_agent.verifier.verdict.StageResult`, and the pipeline stops at the first
stage that is not ok, so the repair prompt always gets the *earliest* problem (a
static violation before a compile error before a wrong number).

GPU stages run in three processes (ARCHITECTURE.md, "GPU stages: three processes"):

1. the candidate worker (:mod:`~coda_agent.verifier.gpu.worker_candidate`, untrusted,
   sandboxed with a timeout) runs every trial, counts launches, times the benchmark
   shapes and re-checks after timing;
2. the reference worker (:mod:`~coda_agent.verifier.gpu.worker_reference`, trusted, started
   only after the candidate's process group is gone, in a freshly created folder, with
   ``PYTHONSAFEPATH=1`` so nothing the candidate left in a folder can shadow a module)
   computes the references and times the baselines;
3. this (parent) process compares the saved tensors and builds the stages
   (:mod:`correctness`, :mod:`gradients`, :mod:`bench`).

Without a CUDA GPU (and without ``cpu_only``) the GPU stages are recorded as
``skip`` with the summary "no CUDA GPU: not verified"; ``Verdict.gpu_verified`` is
then False, and :mod:`~coda_agent.verifier.library.accept` refuses such a verdict.

The ``static`` and ``compile`` packages are imported lazily; a missing one makes its
stage an ``error``, never a silent pass. A bug in a stage
builder becomes an ``error`` stage with the traceback, never an exception out of
:func:`verify`.

Command line (for GPU scripts)::

    python -m coda_agent.verifier.pipeline SPEC_DIR CANDIDATE [--cpu-only] [--no-bench]
        [--json OUT] [--workdir DIR] [--bench-shape NAME ...] [--timeout S]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import os
import secrets
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from . import progress
from .confine.records import records_of
from .confine.sandbox import in_parallel, run_worker, worker_env
from .confine.snapshot import Snapshot, take
from .gpu.environment import collect_environment, cuda_available
from .gpu.inputs import rotation_count, tensor_bytes
from .gpu.placement import Placement
from .gpu.protocol import (
    CAND_DIR,
    PLAN_FILE,
    REF_DIR,
    RESULTS_FILE,
    SCRATCH_BUDGET,
    SCRATCH_DIR,
    TIMED_LOOP_SLOTS,
    Plan,
    timed_check_run,
    timed_loop_check_run,
    wall_check_run,
)
from .gpu.results import GpuRun
from .gpu.runs import make_bench_checks, make_bench_shapes, make_runs
from .spec import LoadedSpec, load_spec
from .verdict import Finding, Stage, StageResult, Verdict
from .workspace import atomic_write_text, remove_tree

GPU_STAGES = ("correctness", "gradients", "bench")
CAND_WORKER = "coda_agent.verifier.gpu.worker_candidate"
REF_WORKER = "coda_agent.verifier.gpu.worker_reference"


def _skip_summary(loaded: LoadedSpec, stage: str, why: str) -> str:
    """The summary of a GPU stage that did not run: ``why``, except for the gradients stage
    of a spec that declares no gradient outputs (it would be skipped on a GPU too)."""
    if stage == "gradients" and not loaded.spec.gradient_outputs:
        return "the spec declares no gradient outputs: nothing to check"
    return why


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _guarded(stage: Stage, fn: Callable[[], StageResult]) -> StageResult:
    """Run a stage builder; a bug in it becomes an ``error`` stage with the traceback."""
    t0 = time.monotonic()
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        from .static.surface import LibraryUnavailable

        if isinstance(e, LibraryUnavailable):  # the machine's fault, and the message says the fix: no traceback
            return StageResult(
                stage=stage,
                status="error",
                summary=f"verifier error in the {stage} stage: {e}",
                findings=[Finding(kind="verifier-error", message=str(e))],
                duration_s=time.monotonic() - t0,
            )
        tb = traceback.format_exc(limit=8)
        return StageResult(
            stage=stage,
            status="error",
            summary=f"verifier error in the {stage} stage: {type(e).__name__}: {e}",
            findings=[Finding(kind="verifier-error", message=tb[-3000:])],
            duration_s=time.monotonic() - t0,
        )


def run_static(loaded: LoadedSpec, snap: Snapshot) -> StageResult:
    """The static stage (``verifier/static/: check_static``) over the snapshot's text, imported lazily."""
    try:
        from .static import check_static
    except ImportError as e:
        return StageResult(stage="static", status="error", summary=f"static checker unavailable: {e}")
    # the snapshot is a private copy of the same name: messages name the file, not the copy
    return check_static(loaded.spec, snap.text, snap.path.name)


def run_compile(loaded: LoadedSpec, snap: Snapshot, timeout_s: float = 300) -> StageResult:
    """The compile stage (``verifier/compile/stage.py: compile_stage``) of the snapshot, imported lazily."""
    try:
        from .compile.stage import compile_stage
    except ImportError as e:
        return StageResult(stage="compile", status="error", summary=f"compile stage unavailable: {e}")
    return compile_stage(loaded, snap.path, timeout_s=timeout_s, sha256=snap.sha256)


def run_gpu_workers(
    loaded: LoadedSpec,
    snap: Snapshot | Path,
    workdir: Path,
    *,
    bench: bool = True,
    bench_shapes: list[Any] | None = None,
    timeout_s: float | None = None,
    device: str = "cuda",
    baselines: list[str] | None = None,
    placement: Placement | None = None,
    tuning: dict[str, Any] | None = None,
) -> GpuRun:
    """Run the candidate worker on ``snap`` (:func:`snapshot.take`; a path is snapshotted
    into ``workdir/candidate/`` first), then (if it produced any trial) the reference worker.

    ``workdir`` receives ``cand/``, ``ref/`` and ``logs/`` (layout: :mod:`protocol`).
    ``bench_shapes`` overrides the spec's benchmark shapes (names or ``{"name","dims"}``);
    ``device="cpu"`` exists for tests only; ``baselines`` overrides the timed baselines.
    The candidate worker gets ``timeout_s`` (default ``spec.timeout_s``), the reference
    worker twice that when it times baselines. ``placement`` pins both workers to one GPU
    (``CUDA_VISIBLE_DEVICES``) and gives the plan its memory budget
    (:mod:`~coda_agent.verifier.gpu.placement`). Raises ``ValueError`` for an unknown bench
    shape name.
    """
    spec = loaded.spec
    if not isinstance(snap, Snapshot):
        snap = take(snap, _fresh_dir(Path(workdir).resolve() / "candidate"))
    timeout = float(timeout_s or spec.timeout_s)
    shapes = make_bench_shapes(spec, bench_shapes) if bench else []
    secret = secrets.randbelow(1 << 30)  # never leaves the parent and the workers' plan files
    plan = Plan(
        spec_dir=str(Path(loaded.directory).resolve()),
        runs=make_runs(spec, secret, device) + make_bench_checks(spec, shapes, secret),
        bench_shapes=shapes,
        secret=secret,
        bench=bench,
        device=device,
        candidate=str(Path(snap.path).resolve()),
        candidate_sha256=snap.sha256,
        baselines=baselines,
        memory_budget=None if placement is None else placement.memory_budget,
        tuning=tuning,
    )
    workdir = Path(workdir).resolve()  # workers run with cwd=their own folder: absolute paths only
    # Fresh, like cand/ and ref/: the workers' logs are written through these paths, and a
    # symlink planted here would make the verifier truncate the file it names.
    logs = _fresh_dir(workdir / "logs")
    env = _worker_env()
    if placement is not None and placement.visible_device is not None:
        env["CUDA_VISIBLE_DEVICES"] = placement.visible_device  # both workers see that GPU as cuda:0
    cand_dir = _fresh_dir(workdir / CAND_DIR)
    # The candidate worker may write only beneath cand_dir/scratch (confine/landlock.py): its temporary
    # files and compile caches live there too (a private quack cache also means a
    # candidate cannot plant compiled kernels that the reference worker would load).
    scratch = cand_dir / SCRATCH_DIR
    cache = scratch / "cache"
    cand_env = {
        **env,
        "TMPDIR": str(scratch / "tmp"),
        "QUACK_CACHE_DIR": str(cache / "quack"),
        "CUTE_DSL_CACHE_DIR": str(cache / "cute_dsl"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "CUDA_CACHE_PATH": str(cache / "nv"),
    }
    for d in ("tmp", "cache/quack", "cache/cute_dsl", "cache/triton", "cache/nv"):  # trials/: the worker's
        (scratch / d).mkdir(parents=True, exist_ok=True)
    # The plan holds the secret (seeds, sample positions, which timed calls are kept): it
    # reaches the candidate worker through its stdin, never a file, since Landlock confines
    # writes only and a file in reach is a file the candidate can read. plan.json is written
    # for the record once the worker has ended.
    plan_json = plan.to_json()
    with progress.step("candidate worker (correctness, coverage" + (", benchmark)" if bench else ")")) as s:
        cand = run_worker(
            CAND_WORKER,
            ["--dir", str(cand_dir), "--plan-stdin"],
            timeout,
            cwd=cand_dir,
            env=cand_env,
            results=cand_dir / RESULTS_FILE,
            log_dir=logs,
            confine=[scratch],
            stdin_data=plan_json.encode(),
        )
        s.outcome = str(cand.status)
    atomic_write_text(cand_dir / PLAN_FILE, plan_json)
    cand_plan_sha256 = plan.sha256()
    _add_timed_checks(plan, spec, cand.records)  # the reference worker's plan has them too
    run = GpuRun(workdir=workdir, plan=plan, cand=cand, cand_plan_sha256=cand_plan_sha256)
    _trim_logs(logs)
    saved = {r.key for r in plan.runs} | {mk(bs, 0, 0).key for bs in plan.bench_shapes for mk in TIMED_CHECKS}
    run.scratch_bytes = _clean_scratch(scratch, {f"{k}.pt" for k in saved})
    if run.scratch_bytes > SCRATCH_BUDGET:
        remove_tree(scratch)  # free the disk before the trusted worker runs
        return run
    if records_of(cand.records, "trial"):
        ref_plan = dataclasses.replace(plan, candidate=None)
        ref_dir = _fresh_dir(workdir / REF_DIR)
        atomic_write_text(ref_dir / PLAN_FILE, ref_plan.to_json())
        # trusted side: torch.compile of the baseline recompiles per bench shape, so allow more time
        ref_timeout = timeout * 2 if plan.bench and plan.bench_shapes else timeout
        with progress.step(
            "reference worker (fp32 + low-precision references" + (", baselines)" if bench else ")")
        ) as s:
            run.ref = run_worker(
                REF_WORKER,
                ["--dir", str(ref_dir)],
                ref_timeout,
                cwd=ref_dir,
                env=env,
                results=ref_dir / RESULTS_FILE,
                log_dir=logs,
            )
            s.outcome = str(run.ref.status)
    return run


TIMED_CHECKS = (
    timed_check_run,
    wall_check_run,
    *(functools.partial(timed_loop_check_run, slot=j) for j in range(TIMED_LOOP_SLOTS)),
)
"""The checks of timed calls, per benchmark shape: the extra call after timing in the same
rotation, one of the wall-time calls, and the calls kept from inside the timing loop (one
per reservoir slot; a slot the timer's calls did not fill has no record, and the bench
stage fails a shape whose records fall short: ``timed-check-missing``)."""


def _add_timed_checks(plan: Plan, spec: Any, records: list[dict[str, Any]]) -> None:
    """Add to ``plan`` the checks of each benchmark shape's timed calls (:data:`TIMED_CHECKS`),
    for the input set the candidate worker says each used (validated against the set count
    the protocol gives), so the reference worker computes them and the parent judges them."""
    rechecks: dict[Any, dict[str, Any]] = {}
    for r in records_of(records, "recheck"):
        rechecks.setdefault(r.get("key"), r)  # the first record of a key, as everywhere
    for bs in plan.bench_shapes:
        n = rotation_count(tensor_bytes(spec, bs.dims, "inputs"))
        for make in TIMED_CHECKS:
            k = rechecks.get(make(bs, 0, 0).key, {}).get("timed_set")
            if isinstance(k, int) and 0 <= k < n:
                plan.runs.append(make(bs, k, plan.secret))


def _trim_logs(logs: Path, keep: int = 1 << 20) -> None:
    """Cut each worker log beyond ``keep`` bytes down to its last ``keep`` bytes (the tail
    is what a report quotes; a worker's pipe drain keeps up to ``sandbox.LOG_HEAD`` +
    ``sandbox.LOG_TAIL`` bytes of it)."""
    for f in logs.glob("*") if logs.is_dir() else []:
        try:
            if f.is_file() and not f.is_symlink() and f.stat().st_size > keep:
                with open(f, "rb") as fh:
                    fh.seek(-keep, os.SEEK_END)
                    tail = fh.read()
                f.write_bytes(b"[... earlier output cut by the verifier ...]\n" + tail)
        except OSError:
            continue


def _clean_scratch(scratch: Path, keep: set[str]) -> int:
    """After the candidate worker: delete everything in its scratch folder but the trial
    files the worker saves (``trials/<key>.pt`` for the names in ``keep``; TMPDIR, caches,
    folders and any other file candidate code left go, however deep: ``remove_tree``),
    without following symlinks; return the disk bytes the kept files hold (allocated
    blocks, so sparse files count as written). Keeping only the expected names also
    ends a flood of files (175,000 empty files in ``trials/`` take 3 s to make, and a
    byte budget does not see them)."""
    if not scratch.is_dir() or scratch.is_symlink():
        return 0
    trials = scratch / "trials"
    for p in scratch.iterdir():
        if p == trials and p.is_dir() and not p.is_symlink():
            continue
        remove_tree(p)
    total = 0
    if trials.is_dir() and not trials.is_symlink():
        with os.scandir(trials) as entries:
            for e in entries:
                if e.name in keep and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    total += max(st.st_size, st.st_blocks * 512)
                else:
                    remove_tree(e.path)
    return total


def _fresh_dir(p: Path) -> Path:
    remove_tree(p)
    p.mkdir(parents=True)
    return p


def _worker_env() -> dict[str, str]:
    # no secrets (API keys, tokens) for the workers; never put the worker's cwd on sys.path
    return worker_env({"PYTHONSAFEPATH": "1"})


def gpu_stages(loaded: LoadedSpec, run: GpuRun) -> list[StageResult]:
    """correctness -> gradients -> bench from a finished :class:`GpuRun`, stopping at the first failure."""
    from .stages.bench import bench_stage
    from .stages.correctness import correctness_stage
    from .stages.gradients import gradients_stage

    out: list[StageResult] = []
    stages: tuple[tuple[Stage, Callable[[LoadedSpec, GpuRun], StageResult]], ...] = (
        ("correctness", correctness_stage),
        ("gradients", gradients_stage),
        ("bench", bench_stage),
    )
    for name, fn in stages:
        res = _guarded(name, lambda fn=fn: fn(loaded, run))
        out.append(res)
        if not res.ok:
            break
    return out


@dataclasses.dataclass(frozen=True)
class CpuStages:
    """The static and compile stages of one candidate file, run ahead of its GPU stages.

    ``candidate_hash`` is the sha256 of the file they judged: :func:`verify` uses them only
    for a file with that hash (and runs them itself otherwise)."""

    candidate_hash: str
    stages: tuple[StageResult, ...]


def cpu_stages(loaded: LoadedSpec, candidate: Path, *, timeout_s: float | None = None) -> CpuStages:
    """static -> compile for ``candidate``, stopping at the first stage that is not ok.

    Neither needs a GPU; compile runs in its own process (``timeout_s``, default 300 s)."""
    return cpu_stages_many([(loaded, Path(candidate))], timeout_s=timeout_s)[0]


def cpu_stages_many(
    items: list[tuple[LoadedSpec, Path]], *, jobs: int = 1, timeout_s: float | None = None
) -> list[CpuStages]:
    """:func:`cpu_stages` for several candidates, results in ``items`` order.

    Static runs in this process, one candidate after the other (it imports the libraries
    once); the compile stages, each its own process, run ``jobs`` at a time. This is how
    ``coda-agent bench``/``regress`` over many kernels keep a GPU machine from idling
    through every kernel's compile in turn: all CPU stages first, then the GPU stages one
    kernel at a time (timings never overlap a compile)."""
    with tempfile.TemporaryDirectory(prefix="coda-snapshots-") as tmp:
        snaps = []
        for i, (_, cand) in enumerate(items):  # each file read once; every stage judges these bytes
            folder = Path(tmp) / str(i)
            folder.mkdir()
            snaps.append(take(cand, folder))
        return _cpu_stages_of(
            [(loaded, snap) for (loaded, _), snap in zip(items, snaps, strict=False)], jobs, timeout_s
        )


def cpu_stages_guarded(
    loaded: LoadedSpec,
    candidate: Path,
    *,
    static_lock: Any,
    compile_slots: Any,
    timeout_s: float | None = None,
    label: str = "",
) -> CpuStages:
    """:func:`cpu_stages` for callers that run many at once in threads (the scheduler): the
    static stage holds ``static_lock`` (it runs in this process and imports the libraries:
    one at a time, as :func:`cpu_stages_many` runs it), the compile stage one of
    ``compile_slots`` (a semaphore: compiles at once). ``label`` names the file in progress
    reports."""
    with tempfile.TemporaryDirectory(prefix="coda-snapshots-") as tmp:
        snap = take(candidate, tmp)
        tag = f" {label}" if label else ""
        with static_lock, progress.step(f"static{tag}") as s:
            st = _guarded("static", lambda: run_static(loaded, snap))
            s.outcome = st.status
        if not st.ok:
            return CpuStages(candidate_hash=snap.sha256, stages=(st,))
        with compile_slots, progress.step(f"compile (sm_90a){tag}") as s:
            comp = _guarded("compile", lambda: run_compile(loaded, snap, timeout_s=timeout_s or 300))
            s.outcome = comp.status
        return CpuStages(candidate_hash=snap.sha256, stages=(st, comp))


def _cpu_stages_of(items: list[tuple[LoadedSpec, Snapshot]], jobs: int, timeout_s: float | None) -> list[CpuStages]:
    """static -> compile of snapshots already taken (:func:`cpu_stages_many`, :func:`verify`)."""

    def reported(stage: Stage, what: str, fn: Callable[[], StageResult]) -> StageResult:
        with progress.step(what) as s:
            res = _guarded(stage, fn)
            s.outcome = res.status
        return res

    many = len(items) > 1
    statics = [
        reported("static", f"static {lc[0].name}" if many else "static", lambda lc=lc: run_static(*lc)) for lc in items
    ]

    def one(i: int) -> CpuStages:
        loaded, snap = items[i]
        if not statics[i].ok:
            return CpuStages(candidate_hash=snap.sha256, stages=(statics[i],))
        comp = reported(
            "compile",
            f"compile (sm_90a) {loaded.name}" if many else "compile (sm_90a)",
            lambda: run_compile(loaded, snap, timeout_s=timeout_s or 300),
        )
        return CpuStages(candidate_hash=snap.sha256, stages=(statics[i], comp))

    return in_parallel(one, len(items), jobs)


def verify(
    loaded: LoadedSpec,
    candidate: Path,
    *,
    cpu_only: bool = False,
    bench: bool = True,
    workdir: Path | None = None,
    timeout_s: float | None = None,
    bench_shapes: list[Any] | None = None,
    device: str = "cuda",
    baselines: list[str] | None = None,
    cpu_done: CpuStages | None = None,
    placement: Placement | None = None,
    tuning: dict[str, Any] | None = None,
) -> Verdict:
    """Verify ``candidate`` (a .py file) against ``loaded``; never raises for candidate behaviour.

    ``cpu_only``: static + compile only (GPU stages recorded as skipped; never
    GPU-verified). ``bench=False`` skips timing (the verdict is then not GPU-verified
    either: acceptance needs a passing bench). ``workdir`` keeps the workers' files (a
    temporary folder, removed afterwards, otherwise). ``timeout_s`` bounds each GPU
    worker and the compile stage (default ``spec.timeout_s``). ``bench_shapes`` overrides
    the benchmark shapes (names from the spec, or ``{"name", "dims"}``). ``device="cpu"``
    and ``baselines`` exist for tests: a CPU-device verdict is marked ``cpu_only``.
    ``cpu_done``: static and compile already run for this file (:func:`cpu_stages_many`);
    ignored, and the stages run again, when its hash is not the file's.
    ``placement``: the GPU and memory budget the scheduler leased (``verifier/schedule/``);
    recorded as ``environment.placement``. ``tuning``:
    ``{epilogue: {shape bucket: GemmConfig fields}}`` the candidate's epilogues run with
    instead of their own configs (``coda-agent tune`` re-verifies a tuned config this way;
    recorded in the verdict). The file is read once, into a private snapshot (:mod:`snapshot`) that every stage
    judges; ``candidate_hash`` is the sha256 of those bytes.
    Raises ``FileNotFoundError`` when ``candidate`` does not exist.
    """
    candidate = Path(candidate)
    if not candidate.is_file():
        raise FileNotFoundError(f"candidate not found: {candidate}")
    with tempfile.TemporaryDirectory(prefix="coda-candidate-") as snap_dir:
        snap = take(candidate, snap_dir)
        return _verify_snapshot(
            loaded,
            snap,
            cpu_only=cpu_only,
            bench=bench,
            workdir=workdir,
            timeout_s=timeout_s,
            bench_shapes=bench_shapes,
            device=device,
            baselines=baselines,
            cpu_done=cpu_done,
            placement=placement,
            tuning=tuning,
        )


def _verify_snapshot(
    loaded: LoadedSpec,
    snap: Snapshot,
    *,
    cpu_only: bool,
    bench: bool,
    workdir: Path | None,
    timeout_s: float | None,
    bench_shapes: list[Any] | None,
    device: str,
    baselines: list[str] | None,
    cpu_done: CpuStages | None,
    placement: Placement | None = None,
    tuning: dict[str, Any] | None = None,
) -> Verdict:
    t0 = time.monotonic()
    verdict = Verdict(
        tuning=tuning,
        spec=loaded.name,
        spec_hash=loaded.spec_hash,
        candidate_hash=snap.sha256,
        cpu_only=cpu_only or device != "cuda",
        started_at=_now(),
        environment=collect_environment(probe_gpu=False),
    )

    def finish() -> Verdict:
        verdict.wall_s = time.monotonic() - t0
        return verdict

    if cpu_done is None or cpu_done.candidate_hash != verdict.candidate_hash:
        cpu_done = _cpu_stages_of([(loaded, snap)], 1, timeout_s)[0]
    verdict.stages += list(cpu_done.stages)
    if not all(s.ok for s in cpu_done.stages):
        return finish()

    if cpu_only:
        verdict.stages += [
            StageResult(
                stage=s, status="skip", summary=_skip_summary(loaded, s, "--cpu-only: not run (not verified on a GPU)")
            )
            for s in GPU_STAGES
        ]
        return finish()
    if device == "cuda" and not cuda_available():
        verdict.stages += [
            StageResult(stage=s, status="skip", summary=_skip_summary(loaded, s, "no CUDA GPU: not verified"))
            for s in GPU_STAGES
        ]
        return finish()

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="coda-verify-")
        workdir = Path(tmp.name)
    try:
        try:
            run = run_gpu_workers(
                loaded,
                snap,
                Path(workdir),
                bench=bench,
                bench_shapes=bench_shapes,
                timeout_s=timeout_s,
                device=device,
                baselines=baselines,
                placement=placement,
                tuning=tuning,
            )
        except Exception as e:  # noqa: BLE001 -- e.g. an unknown bench shape name, a full disk
            verdict.stages.append(
                StageResult(
                    stage="correctness",
                    status="error",
                    summary=f"could not run the GPU workers: {type(e).__name__}: {e}",
                )
            )
            return finish()
        env = run.gpu_env
        for k, v in env.items():
            if v is not None and hasattr(verdict.environment, k):
                setattr(verdict.environment, k, v)
        verdict.environment.worker_sandbox = run.sandbox
        if placement is not None:
            verdict.environment.placement = placement.describe()
        with progress.step("judging correctness, gradients, benchmark") as s:
            stages = gpu_stages(loaded, run)
            s.outcome = ", ".join(f"{x.stage} {x.status}" for x in stages)
        if device != "cuda":
            for s in stages:
                s.summary = f"[CPU test device, not a GPU verification] {s.summary}"
        verdict.stages += stages
    finally:
        if tmp is not None:
            remove_tree(tmp.name)  # any depth (TemporaryDirectory's own walk recurses per level)
            tmp.cleanup()  # nothing left to delete: unregisters it
    return finish()


# --------------------------------------------------------------------------- CLI


def _print(verdict: Verdict) -> None:
    print(f"verdict for {verdict.spec} (candidate sha256 {verdict.candidate_hash[:12]}), {verdict.wall_s:.1f} s")
    for s in verdict.stages:
        print(f"  {s.stage:<12} {s.status:<5} {s.summary}")
        for f in s.findings[:20]:
            where = f" line {f.line}" if f.line else ""
            print(f"      [{f.kind}]{where} {f.message}")
    env = verdict.environment
    print(
        f"  environment: {env.gpu or 'no GPU'} (sm {env.compute_capability}), torch {env.torch}, "
        f"cutlass-dsl {env.cutlass_dsl}, quack {env.quack}"
    )
    print(f"  outcome: {verdict.outcome} (passed: {verdict.passed}; GPU verified: {verdict.gpu_verified})")


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when the candidate is GPU-verified (with --cpu-only: when every stage
    that ran passed; with --no-bench: when it was correct on a GPU), 1 otherwise (also: no
    GPU to verify on), 2 on bad arguments or a verifier error (``Verdict.verifier_error``:
    the verifier or the machine failed, not the candidate), as ``coda-agent verify``."""
    assert __doc__ is not None  # the module's docstring
    ap = argparse.ArgumentParser(prog="python -m coda_agent.verifier.pipeline", description=__doc__.splitlines()[0])
    ap.add_argument("spec_dir", type=Path)
    ap.add_argument("candidate", type=Path)
    ap.add_argument("--cpu-only", action="store_true", help="static + compile only")
    ap.add_argument("--no-bench", action="store_true", help="skip timing (the verdict is then not GPU-verified)")
    ap.add_argument("--json", type=Path, help="write the Verdict JSON here")
    ap.add_argument("--workdir", type=Path, help="keep the workers' files here")
    ap.add_argument("--bench-shape", action="append", default=None, help="benchmark only this spec shape (repeatable)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per GPU worker (default: spec timeout_s)")
    a = ap.parse_args(argv)
    try:
        loaded = load_spec(a.spec_dir)
    except Exception as e:  # noqa: BLE001
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.candidate.is_file():
        print(f"error: candidate not found: {a.candidate}", file=sys.stderr)
        return 2
    if a.workdir:
        a.workdir.mkdir(parents=True, exist_ok=True)
    verdict = verify(
        loaded,
        a.candidate,
        cpu_only=a.cpu_only,
        bench=not a.no_bench,
        workdir=a.workdir,
        timeout_s=a.timeout,
        bench_shapes=a.bench_shape,
    )
    _print(verdict)
    if a.json:
        atomic_write_text(a.json, verdict.to_json(outcome=True))
    broken = verdict.verifier_error
    if broken is not None:
        print(
            f"verifier error in the {broken.stage} stage (the verifier or this machine failed, not the "
            f"candidate): {broken.summary}",
            file=sys.stderr,
        )
        return 2
    return 0 if verdict.done_as_asked(cpu_only=a.cpu_only, bench=not a.no_bench) else 1


if __name__ == "__main__":
    sys.exit(main())

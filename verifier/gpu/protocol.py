"""The on-disk protocol between the parent verifier and its two GPU workers.

Why files: the candidate worker runs untrusted code and may crash, hang or corrupt
its own process, so nothing comes back through pipes or stdout. Each worker gets a
folder and a *plan* written by the parent; it appends one JSON object per finished
sub-stage to ``results.jsonl`` in that folder (flushed and fsynced line by line), and
saves tensors with ``torch.save`` next to it. When a worker dies, the lines already
written say how far it got, and a ``begin`` line names the part it died in.

Layout of a verification workdir::

    <workdir>/cand/plan.json         the plan the candidate worker got on its stdin, written
                                     by the parent after that worker ended (it holds the secret)
    <workdir>/cand/results.jsonl     candidate worker progress (one JSON per line)
    <workdir>/cand/<key>.pt          {"outputs", "inputs_before", "inputs_after"} (CPU tensors)
    <workdir>/ref/plan.json          written by the parent before the reference worker
    <workdir>/ref/results.jsonl      reference worker progress
    <workdir>/ref/<key>.pt           {"inputs", "ref32", "ref_lowp"} (CPU tensors)

The parent re-reads the plan from memory (never from the worker folders) and loads
``.pt`` files with ``weights_only=True`` so a file written by the candidate process
cannot run code in the parent.

This module is pure (no torch import) so the parent, both workers and the tests
share one definition of run keys, file names and the JSONL format.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

PLAN_FILE = "plan.json"
RESULTS_FILE = "results.jsonl"
CAND_DIR = "cand"
REF_DIR = "ref"
SCRATCH_DIR = "scratch"
"""The only part of the candidate worker's folder it may write once confined
(verifier/confine/landlock.py): saved trial tensors, TMPDIR and its compile caches. Its
``plan.json`` and ``results.jsonl`` sit outside it (the worker's records reach the results
file through a pipe the parent drains: :mod:`~coda_agent.verifier.confine.launch`), and
each saved file's sha256 is in its record."""
SCRATCH_BUDGET = 24 << 30
"""Bytes of saved trial tensors a candidate worker may leave (the largest legitimate run,
a bench-shape check of a big-vocabulary spec, is a few GiB). More is the candidate's
doing (a full disk would fail the *reference* worker's files and read as a verifier
error): the run fails as ``scratch-over-budget``."""
BENCH_CHECK_SAMPLE = 1 << 20
"""Elements per output compared at each benchmark shape (a kernel that does 3/4 of the
work only at the benchmark shapes passes every check that skips them). Sampled positions are drawn from the run's seed, which candidate code
never sees; a wrong tile of 128 x 256 elements in a 134 M-element output is missed with
probability about exp(-250)."""
TIMED_LOOP_SAMPLE = 1 << 16
"""Elements per output compared for each call kept from inside the timing loop: its gather
runs inside one timed call, so it is kept small (a few us on the H200)."""
TIMED_LOOP_SLOTS = 8
"""Calls kept from inside the timing loop (a reservoir): a kernel that skips work on a
fraction f of the timer's calls escapes with probability about (1 - f)^8, and a timer made
to run at most 8 calls has every call checked (slow estimate calls shrink do_bench's
loop to one measured call)."""


@dataclass(frozen=True)
class Run:
    """One correctness trial: a shape case bound to a seed.

    ``key`` names the trial's ``.pt`` files; ``recheck`` marks the post-timing run.
    """

    key: str
    case: str
    dims: dict[str, int]
    seed: int
    recheck: bool = False
    sample: int = 0
    """> 0: a bench-shape check: only this many elements of each output (the same
    :func:`sample_index` positions in both workers) are saved and compared, and the
    inputs are not saved (they are large; mutation is checked at the correctness shapes)."""
    draw: str = "spec"
    """How the inputs are drawn (:data:`~coda_agent.verifier.gpu.inputs.DRAWS`): as the spec
    declares, or one of the secret coverage draws (:mod:`~coda_agent.verifier.gpu.coverage`)."""


@dataclass(frozen=True)
class BenchShape:
    """One benchmark shape (name + dims)."""

    name: str
    dims: dict[str, int]


@dataclass
class Plan:
    """What the parent asks a worker to do; identical for both workers."""

    spec_dir: str
    runs: list[Run]
    bench_shapes: list[BenchShape] = field(default_factory=list)
    bench: bool = False
    device: str = "cuda"
    candidate: str | None = None
    candidate_sha256: str | None = None
    """sha256 of the candidate snapshot the parent judged (:mod:`snapshot`): the candidate
    worker imports only bytes with this hash."""
    baselines: list[str] | None = None
    """Baselines the reference worker times (None: the spec's ``bench.baselines``)."""
    memory_budget: int | None = None
    """Bytes of GPU memory each worker of this verification may hold in torch's caching
    allocator (``torch.cuda.set_per_process_memory_fraction``; the allocator poison stays
    within it): assigned by the scheduler (``verifier/schedule/``) so that verifications
    sharing a GPU never take each other's memory. None: the worker takes
    :data:`~coda_agent.verifier.gpu.memory_budget.ALONE_SHARE` of the device (a
    verification alone on its GPU)."""
    tuning: dict[str, dict[str, dict[str, Any]]] | None = None
    """GEMM configs to run the candidate's epilogues with, ``{epilogue: {bucket: config}}``
    (:func:`coda_agent.runtime.tuning.override_lookup`); None: the candidate's own."""
    secret: int = 0
    """Per-verification random offset (drawn by the parent) added to every seed the
    candidate must not predict: the timed input sets, the recheck, the benchmark-shape
    checks and so their sampled positions (with public seeds a candidate could precompute
    which inputs are the checks). Only the
    workers read it, before any candidate code runs."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        return cls(
            spec_dir=d["spec_dir"],
            runs=[Run(**r) for r in d["runs"]],
            bench_shapes=[BenchShape(**b) for b in d.get("bench_shapes", [])],
            bench=bool(d.get("bench", False)),
            device=d.get("device", "cuda"),
            candidate=d.get("candidate"),
            candidate_sha256=d.get("candidate_sha256"),
            baselines=d.get("baselines"),
            memory_budget=None if d.get("memory_budget") is None else int(d["memory_budget"]),
            secret=int(d.get("secret", 0)),
            tuning=d.get("tuning"),
        )

    def sha256(self) -> str:
        """Hash of the plan minus the candidate path and hash (both workers must agree on it)."""
        d = asdict(self)
        d.pop("candidate", None)
        d.pop("candidate_sha256", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @property
    def correctness_runs(self) -> list[Run]:
        return [r for r in self.runs if not r.recheck]

    @property
    def recheck_runs(self) -> list[Run]:
        return [r for r in self.runs if r.recheck]


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_") or "case"


BENCH_SEED_BASE = 10_000
"""Timed input set k of every benchmark shape uses seed ``BENCH_SEED_BASE + plan.secret + k``
(the same sets in both workers)."""


def timed_check_run(shape: BenchShape, set_index: int, secret: int) -> Run:
    """The check of one *timed* call: after timing, the candidate worker makes one more call
    in the same rotation of input sets (indistinguishable from the timed calls) and keeps
    sampled outputs; this is the run the reference worker and the parent judge it by (a
    candidate that marks its timed inputs and does less work on marked sets fails it)."""
    return Run(
        key=f"timed-{_slug(shape.name)}",
        case=f"timed {shape.name}",
        dims=dict(shape.dims),
        seed=BENCH_SEED_BASE + secret + set_index,
        recheck=True,
        sample=BENCH_CHECK_SAMPLE,
    )


def timed_loop_check_run(shape: BenchShape, set_index: int, secret: int, slot: int = 0) -> Run:
    """The check of one call made *inside* the timing loop, kept in reservoir ``slot`` (of
    :data:`TIMED_LOOP_SLOTS`): the candidate worker keeps a uniform random sample of the
    timer's calls (reservoir sampling with the secret RNG, so neither which calls nor how
    many calls is known while a call runs) and gathers :data:`TIMED_LOOP_SAMPLE` sampled
    elements of each kept call's outputs in stream order right after it, before any later
    call's work (threat 15 of docs/threat-model.md). Same inputs and seed as the
    ``set_index`` set of the timed rotation; compared on the sampled elements."""
    return Run(
        key=f"timedloop{slot}-{_slug(shape.name)}",
        case=f"timed-loop {shape.name} #{slot}",
        dims=dict(shape.dims),
        seed=BENCH_SEED_BASE + secret + set_index,
        recheck=True,
        sample=TIMED_LOOP_SAMPLE,
    )


def wall_check_run(shape: BenchShape, set_index: int, secret: int) -> Run:
    """The check of one of the wall-time calls the candidate worker makes after timing (for
    ``wall_ms``/``host_ms``), picked with the secret RNG: a call counter kept in stale freed
    memory could otherwise skip work only on those unchecked calls.
    Same inputs, seed and sample as the timed-loop checks of set ``set_index``."""
    return Run(
        key=f"wall-{_slug(shape.name)}",
        case=f"wall {shape.name}",
        dims=dict(shape.dims),
        seed=BENCH_SEED_BASE + secret + set_index,
        recheck=True,
        sample=TIMED_LOOP_SAMPLE,
    )


SYNC_MARKERS = frozenset({"Unknown", "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync"})
"""The exact names Kineto gives CUPTI synchronization records (its ``cuda_sync`` activity:
``CUpti_ActivitySynchronizationType`` 0-4). torch 2.11 on the H200 records none of them
on the device timeline (``benchmarks/probes/profiler_event_names.py``,
``benchmarks/results/dev/2026-11-30-h200-profiler-events.log``: syncs show up only as
``cudaDeviceSynchronize``-style runtime calls on the CPU); other builds may."""

NOT_LAUNCH_PREFIXES = ("Memcpy ", "Memset ", "[memory]")
"""Name prefixes of the CUDA-device events that are copies, fills by the copy engine and
allocator records (measured names: ``Memcpy HtoD (Pinned -> Device)``, ``Memcpy DtoD
(Device -> Device)``, ...)."""


def gpu_kernels(names: list[str]) -> list[str]:
    """The kernel launches among the names of a profiler session's CUDA-device events:
    copies, copy-engine memsets, allocator records (:data:`NOT_LAUNCH_PREFIXES`) and
    synchronization records (:data:`SYNC_MARKERS`, exact names) are not launches.

    Exact names and prefixes, never substrings: a quack kernel is named after its epilogue
    fn (``kernel_cutlass_kernel_quackepiloguefrontendGemmMod_<fn>_...``), so a substring
    filter would let a second GEMM hide as ``swiglu_Sync_epi``
    (tests/verifier/corpus/sync_named_kernel.py); no kernel
    name cutlass or torch produces starts like a copy or equals a sync record's name.
    The candidate worker counts with this rule; ``benchmarks/probes/launches_per_kernel.py`` too."""
    return [n for n in names if not n.startswith(NOT_LAUNCH_PREFIXES) and n not in SYNC_MARKERS]


GEMM_NAME_MARKERS = ("gemm", "xmma", "nvjet")
"""Lower-case substrings that make a launch a GEMM: every quack/CuTeDSL GEMM is named
``kernel_cutlass_kernel_quackepiloguefrontendGemmMod_<fn>_...`` whatever its epilogue fn
is called (launch census, H200), and cuBLAS/cuBLASLt kernels carry ``gemm``, ``xmma`` or
``nvjet``. No torch elementwise, reduction or copy kernel contains them, and the only
names a candidate chooses (epilogue fns) sit inside GemmMod kernels, so a candidate cannot
make a GEMM look like something else or the reverse."""


def gemm_launches(kernels: list[str]) -> int:
    """How many of one call's kernel launches (:func:`gpu_kernels`' names) are GEMMs
    (:data:`GEMM_NAME_MARKERS`), judged against ``entry.max_gemm_launches``."""
    return sum(1 for k in kernels if any(m in str(k).lower() for m in GEMM_NAME_MARKERS))


def sample_index(numel: int, n: int, seed: int, position: int):
    """The flat element positions compared for output number ``position`` of a sampled run
    (CPU int64; every element when ``numel <= n``). Both workers call this."""
    import torch

    if numel <= n:
        return torch.arange(numel)
    g = torch.Generator().manual_seed(seed * 1009 + position)
    return torch.randint(0, numel, (n,), generator=g)

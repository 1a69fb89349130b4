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
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
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
RECHECK_SEED_OFFSET = 1000
"""The post-timing recheck uses seed ``spec.shapes.seeds[0] + RECHECK_SEED_OFFSET``."""
BENCH_CHECK_SEED_OFFSET = 2000
BENCH_CHECK_SAMPLE = 1 << 20
"""Elements per output compared at each benchmark shape (red-team round 6: a kernel that
did 3/4 of the work only at the benchmark shapes passed, because no benchmark shape was
ever checked). Sampled positions are drawn from the run's seed, which candidate code
never sees; a wrong tile of 128 x 256 elements in a 134 M-element output is missed with
probability about exp(-250)."""
TIMED_LOOP_SAMPLE = 1 << 16
"""Elements per output compared for each call kept from inside the timing loop: its gather
runs inside one timed call, so it is kept small (a few us on the H200)."""
TIMED_LOOP_SLOTS = 8
"""Calls kept from inside the timing loop (a reservoir): a kernel that skips work on a
fraction f of the timer's calls escapes with probability about (1 - f)^8, and a timer made
to run at most 8 calls has every call checked (red team: slow estimate calls shrink
do_bench's loop to one measured call)."""


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
    secret: int = 0
    """Per-verification random offset (drawn by the parent) added to every seed the
    candidate must not predict: the timed input sets, the recheck, the benchmark-shape
    checks and so their sampled positions (red-team round 7: all seeds were public
    constants, so a candidate could precompute which inputs were the checks). Only the
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
            secret=int(d.get("secret", 0)),
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


def _ragged(dims: dict[str, int], tile: int = 128) -> bool:
    return any(v % tile for v in dims.values())


RECHECK_ROW_DIM = "M"
"""The dim the post-timing recheck redraws at random (every catalogue spec's GEMM M, the
token rows: any value is legal for a correct kernel)."""


def recheck_rows(m: int, secret: int) -> int:
    """The recheck's secret row count: uniform in ``[ceil(m / 2), 2 m]``, drawn from the
    per-verification secret, so the candidate cannot know the shape it will be judged at
    (correctness shapes are public: a kernel right only at those would pass them)."""
    import random

    return random.Random(secret ^ 0x2EC4ECC).randint(-(-m // 2), 2 * m)


def secret_seed(seed: int, secret: int) -> int:
    """The seed a public correctness case actually runs with: the spec's ``seed`` itself
    without a secret (tests), else one the candidate cannot predict from the spec."""
    if not secret:
        return seed
    return int.from_bytes(hashlib.sha256(f"coda-seed:{secret}:{seed}".encode()).digest()[:4], "little")


def make_runs(spec: Any, secret: int = 0, device: str = "cuda") -> list[Run]:
    """Every correctness case x seed, the secret coverage cases, then one post-timing recheck.

    ``spec`` is a :class:`~coda_agent.verifier.spec.KernelSpec`. With a ``secret`` (every
    real verification has one) the seeds of the public cases are secret too
    (:func:`secret_seed`; the run keys keep the spec's seed) and the secret coverage cases
    (:func:`~coda_agent.verifier.gpu.coverage.coverage_runs`) follow them. The recheck re-runs
    the last ragged correctness case (the hardest one) with seed ``seeds[0] + 1000 +
    secret``, a seed the candidate never saw before timing; with a secret its ``M`` is
    also redrawn (:func:`recheck_rows`) and the case is named ``"<case>, M=<rows>"``.
    """
    runs: list[Run] = []
    for i, case in enumerate(spec.shapes.correctness):
        name = case.name or f"case{i}"
        for seed in spec.shapes.seeds:
            runs.append(Run(key=f"c{i}-{_slug(name)}-s{seed}", case=name, dims=dict(case.dims),
                            seed=secret_seed(seed, secret)))
    if secret:
        from .coverage import coverage_runs

        runs += coverage_runs(spec, secret, device)
    cases = list(enumerate(spec.shapes.correctness))
    ragged = [(i, c) for i, c in cases if _ragged(c.dims)]
    i, case = (ragged or cases)[-1]
    name = case.name or f"case{i}"
    seed = spec.shapes.seeds[0] + RECHECK_SEED_OFFSET
    key = f"recheck-c{i}-{_slug(name)}-s{seed}"  # the key never tells the redrawn M
    dims = dict(case.dims)
    if secret and RECHECK_ROW_DIM in dims:
        dims[RECHECK_ROW_DIM] = recheck_rows(dims[RECHECK_ROW_DIM], secret)
        name = f"{name}, {RECHECK_ROW_DIM}={dims[RECHECK_ROW_DIM]}"
    runs.append(Run(key=key, case=name, dims=dims, seed=seed + secret, recheck=True))
    return runs


def make_bench_checks(spec: Any, shapes: list[BenchShape], secret: int = 0) -> list[Run]:
    """One post-timing check per benchmark shape (exactly the timed dims, a fresh seed),
    compared on :data:`BENCH_CHECK_SAMPLE` sampled elements per output."""
    seed = spec.shapes.seeds[0] + BENCH_CHECK_SEED_OFFSET
    return [Run(key=f"bench-{_slug(b.name)}-s{seed}", case=f"bench {b.name}", dims=dict(b.dims), seed=seed + secret,
                recheck=True, sample=BENCH_CHECK_SAMPLE) for b in shapes]


BENCH_SEED_BASE = 10_000
"""Timed input set k of every benchmark shape uses seed ``BENCH_SEED_BASE + plan.secret + k``
(the same sets in both workers)."""


def timed_check_run(shape: BenchShape, set_index: int, secret: int) -> Run:
    """The check of one *timed* call: after timing, the candidate worker makes one more call
    in the same rotation of input sets (indistinguishable from the timed calls) and keeps
    sampled outputs; this is the run the reference worker and the parent judge it by
    (red-team round 7 marked its timed inputs and did less work only on marked sets)."""
    return Run(key=f"timed-{_slug(shape.name)}", case=f"timed {shape.name}", dims=dict(shape.dims),
               seed=BENCH_SEED_BASE + secret + set_index, recheck=True, sample=BENCH_CHECK_SAMPLE)


def timed_loop_check_run(shape: BenchShape, set_index: int, secret: int, slot: int = 0) -> Run:
    """The check of one call made *inside* the timing loop, kept in reservoir ``slot`` (of
    :data:`TIMED_LOOP_SLOTS`): the candidate worker keeps a uniform random sample of the
    timer's calls (reservoir sampling with the secret RNG, so neither which calls nor how
    many calls is known while a call runs) and gathers :data:`TIMED_LOOP_SAMPLE` sampled
    elements of each kept call's outputs in stream order right after it, before any later
    call's work (red-team class "tell timed calls apart"). Same inputs and seed as the
    ``set_index`` set of the timed rotation; compared on the sampled elements."""
    return Run(key=f"timedloop{slot}-{_slug(shape.name)}", case=f"timed-loop {shape.name} #{slot}",
               dims=dict(shape.dims), seed=BENCH_SEED_BASE + secret + set_index, recheck=True,
               sample=TIMED_LOOP_SAMPLE)


def wall_check_run(shape: BenchShape, set_index: int, secret: int) -> Run:
    """The check of one of the wall-time calls the candidate worker makes after timing (for
    ``wall_ms``/``host_ms``), picked with the secret RNG: sixth red team (2026-11-30) kept a
    call counter in stale freed memory and skipped work only on those unchecked calls.
    Same inputs, seed and sample as the timed-loop checks of set ``set_index``."""
    return Run(key=f"wall-{_slug(shape.name)}", case=f"wall {shape.name}", dims=dict(shape.dims),
               seed=BENCH_SEED_BASE + secret + set_index, recheck=True, sample=TIMED_LOOP_SAMPLE)


SYNC_MARKERS = frozenset({"Unknown", "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync"})
"""The exact names Kineto gives CUPTI synchronization records (its ``cuda_sync`` activity:
``CUpti_ActivitySynchronizationType`` 0-4). torch 2.11 on the H200 records none of them
on the device timeline (``benchmarks/profiler_event_probe.py``,
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
    filter let the eighth red team hide a second GEMM as ``swiglu_Sync_epi``; no kernel
    name cutlass or torch produces starts like a copy or equals a sync record's name.
    The candidate worker counts with this rule; ``benchmarks/launch_census.py`` too."""
    return [n for n in names if not n.startswith(NOT_LAUNCH_PREFIXES) and n not in SYNC_MARKERS]


LAUNCH_NAMES_KEPT = 256
"""Kernel names a launch record keeps (the candidate worker's bench-shape record; the
correctness records keep all). ``entry.max_launches`` may not exceed it, so every launch
of a call within budget is named and its GEMMs can be counted (:func:`gemm_launches`)."""

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


def make_bench_shapes(spec: Any, override: list[Any] | None = None) -> list[BenchShape]:
    """The benchmark shapes to time: the spec's, or ``override``.

    ``override`` items are shape names from ``spec.shapes.benchmark``, ``ShapeCase``
    objects or ``{"name", "dims"}`` dicts. Raises ``ValueError`` for an unknown name.
    """
    known = {c.name: c for c in spec.shapes.benchmark}
    if override is None:
        return [BenchShape(name=c.name or f"bench{i}", dims=dict(c.dims)) for i, c in enumerate(spec.shapes.benchmark)]
    out: list[BenchShape] = []
    for item in override:
        if isinstance(item, str):
            if item not in known:
                raise ValueError(f"unknown benchmark shape {item!r} (spec has {sorted(known)})")
            out.append(BenchShape(name=item, dims=dict(known[item].dims)))
        elif isinstance(item, dict):
            out.append(BenchShape(name=str(item.get("name", "custom")), dims={k: int(v) for k, v in item["dims"].items()}))
        else:
            out.append(BenchShape(name=item.name or "custom", dims=dict(item.dims)))
    return out


# --------------------------------------------------------------------------- JSONL


def record_line(record: dict[str, Any]) -> str:
    """One results-file line: the JSON object with sorted keys, newline-terminated."""
    return json.dumps(record, sort_keys=True, default=str) + "\n"


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object (sorted keys) as a line, flushed and fsynced."""
    line = record_line(record)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


MAX_RECORD_LINE = 256 << 10
"""Longest results line read (bytes); a worker's records are a few KiB. Longer lines are
skipped and reported (red team 2026-11-30: a 255 MiB line of ``{},{},...`` took the
parent to 6.4 GiB, and 200,000 nested ``[`` crashed ``json.loads`` with RecursionError)."""

RECORD_IDENTITY = {"begin": "what", "trial": "key", "recheck": "key", "bench": "shape", "launches": "case"}
"""The field that tells apart a part's records; every other part is written once per run."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All complete JSON lines of a results file (a torn last line is dropped).

    A missing file gives ``[]``; lines that are not JSON objects are skipped (see
    :func:`read_records_checked` for what a strict reader makes of them)."""
    return read_records_checked(path)[0]


def read_records_checked(path: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """``(records, anomalies)`` of a results file. Never raises for its content.

    The worker writes whole lines, each record once, and nothing after ``done``. So an
    anomaly is: a line that is not a JSON object (other than the last line, which a
    worker killed mid-write may leave torn), a line over :data:`MAX_RECORD_LINE` bytes,
    a record repeating an earlier one's part and identity (:data:`RECORD_IDENTITY`), or
    any record after ``done``. Only code inside the worker's process writes there, so in
    the candidate worker each is candidate code writing records (the red team of
    2026-11-30 forged bench and integrity records that way, gluing the worker's real
    record to a newline-less prefix so that the reader dropped it). Every record is
    returned, first ones first; callers that trust only first records stay correct, and
    the verifier fails a candidate worker with any anomaly."""
    p = Path(path)
    if not p.is_file():
        return [], []
    out: list[dict[str, Any]] = []
    anomalies: list[str] = []
    seen: set[tuple[str, str]] = set()
    done = False
    with open(p, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        if len(raw) > MAX_RECORD_LINE:
            anomalies.append(f"line {i + 1}: {len(raw)} bytes (over {MAX_RECORD_LINE})")
            continue
        try:
            rec = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict):
            if i != last:  # a torn final line is a crash's, anything earlier is not
                anomalies.append(f"line {i + 1}: not a JSON object")
            continue
        part = str(rec.get("part"))
        ident = (part, str(rec.get(RECORD_IDENTITY[part])) if part in RECORD_IDENTITY else "")
        if done:
            anomalies.append(f"line {i + 1}: a {part!r} record after 'done'")
        elif ident in seen:
            anomalies.append(f"line {i + 1}: a second {part!r} record" + (f" for {ident[1]!r}" if ident[1] else ""))
        seen.add(ident)
        done = done or part == "done"
        out.append(rec)
    return out, anomalies


def records_of(records: list[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    """The records whose ``part`` equals ``part``."""
    return [r for r in records if r.get("part") == part]


def last_begun(records: list[dict[str, Any]]) -> str | None:
    """What the worker was doing when it stopped: the last ``begin`` not followed by its end."""
    begun = [r for r in records if r.get("part") == "begin"]
    if not begun:
        return None
    last = begun[-1]
    idx = records.index(last)
    if any(r.get("part") not in ("begin",) for r in records[idx + 1:]):
        return None
    return str(last.get("what"))

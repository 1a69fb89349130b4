"""The untrusted-side GPU worker: runs the candidate kernel and records what it did.

Run as ``python -m coda_agent.verifier.gpu.worker_candidate --dir WORKDIR/cand`` by
:mod:`coda_agent.verifier.pipeline` (through :func:`~coda_agent.verifier.confine.sandbox.run_worker`),
reading its plan from stdin (``--plan-stdin``; ``plan.json`` in that folder otherwise) and
appending records to ``results.jsonl``
(format: :mod:`coda_agent.verifier.gpu.protocol`).

Design (threat numbers: the rows of docs/threat-model.md):

* **Before the candidate is imported** the worker captures the objects it measures
  with (``torch.cuda.Event``, ``torch.cuda.synchronize``, ``time.perf_counter``,
  ``triton.testing.do_bench``, ``torch.profiler.profile``, the exact ``torch.Tensor``
  type: :mod:`~coda_agent.verifier.gpu.instruments`) and re-checks at the end that none
  was replaced, nor any global of the harness (:func:`tampered`) (threat 5); it refuses to run
  on anything but sm_90; it self-tests the profiler.
* **Poison** (threat 1): in every trial, after the inputs are made and right before the
  call, every free block of the CUDA caching allocator (found with
  ``torch.cuda.memory_snapshot()``) plus fresh slack (one large block, many small-pool
  blocks) is filled with the NaN word ``poison.POISON_WORD16`` and released
  (:func:`~coda_agent.verifier.gpu.poison.fill_free_memory`), so an
  output the kernel never writes reads back as that exact bit pattern (and not as a
  previous trial's result or a freed input temporary).
* **Trials**: fresh seeded inputs (:mod:`~coda_agent.verifier.gpu.inputs`), one call, a
  device synchronize, then checks that each output is exactly ``torch.Tensor``
  (checked with ``type(x) is``, before touching it: a subclass could run code on any
  method call), on the GPU, of the declared shape and dtype, contiguous, and not
  sharing storage with an input or another output (threat 4;
  :mod:`~coda_agent.verifier.gpu.output_contract`). Outputs and the inputs
  before/after the call are saved to ``<key>.pt`` (CPU tensors) for the trusted parent.
  Nothing is compared here: the reference never exists in this process (threat 12).
* **Launches** (threat 11): the first trial of every correctness shape runs under
  ``torch.profiler`` (CUDA activity; a judged call, not an extra one), and so does one call
  at every benchmark shape; kernels are counted by ``protocol.gpu_kernels`` (memcpys,
  memsets, memory records and sync markers excluded).
* **Bench** (threats 3, 6, 14): per shape, several input sets rotated call by call
  (so a cache keyed on the input pointer cannot hit on consecutive calls), timed with
  ``triton.testing.do_bench(..., return_mode="median")`` (which flushes L2 before each
  call) plus a host-wall cross-check (synchronize; t0; call; synchronize; t1) so the
  parent can flag work that escapes the timed stream (:mod:`~coda_agent.verifier.gpu.timing`).
* **Recheck** (threats 6, 7): after timing, one more trial with a seed the candidate
  never saw; then, per benchmark shape, a check on fresh inputs at exactly the timed dims
  and the outputs of one extra call in the timed rotation (both compared on sampled
  elements: :func:`~coda_agent.verifier.gpu.runs.make_bench_checks`,
  :func:`~coda_agent.verifier.gpu.protocol.timed_check_run`), plus the sampled outputs of
  8 of do_bench's own calls, kept by secret reservoir sampling and each gathered in stream
  order right after its call (:func:`~coda_agent.verifier.gpu.protocol.timed_loop_check_run`). All unpredictable seeds carry the
  parent's per-verification ``plan.secret``.
* **Confinement** (:mod:`~coda_agent.verifier.confine.landlock`): the pipeline starts this
  module through :mod:`~coda_agent.verifier.confine.launch`, so from before ``import
  torch`` (one thread; every later thread inherits it) the process may write only beneath
  ``scratch/``, its own ``/proc/<pid>`` and the GPU device nodes, and holds no
  capabilities; the seccomp filter follows once CUDA is up (libcuda's init opens a
  socket), on every thread. Records go through a pipe the parent copies into
  ``results.jsonl`` (append-only by construction), and each saved trial file's sha256 and
  size are in its record. The setup self-tests (profiler,
  timer, one quack GEMM) run under every layer.

Exit status: 0 done, 1 the candidate raised (traceback on stderr), 3 refused (not an
sm_90 GPU / profiler broken; a ``setup`` record says why). The worker ends with
``os._exit`` so library teardown cannot turn a finished run into a crash.
"""

from __future__ import annotations

# --- the measuring instruments are captured first, before any other import can touch them
from .instruments import (  # isort: skip  (first: see instruments.py)
    _Activity,
    _DeviceTypeCUDA,
    _T,
    _T0,
    _do_bench,
    _perf_counter,
    _profile,
    _set_sync_debug_mode,
    _synchronize,
    SNAPSHOT,
    WATCHED,
)

import argparse  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import stat  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Mapping, NamedTuple  # noqa: E402

import torch  # noqa: E402
import torch.profiler  # noqa: E402

from ...runtime import launch as _launch  # noqa: E402
from ...runtime.launch import bind_entry  # noqa: E402
from ...runtime.tuning import override_lookup  # noqa: E402
from ..confine import (
    audit,  # noqa: E402
    landlock,  # noqa: E402
)
from ..confine.records import record_line  # noqa: E402
from ..confine.snapshot import load_module  # noqa: E402
from ..spec import load_spec  # noqa: E402
from . import (  # noqa: E402
    device_memory,  # noqa: E402  (binds torch.cuda's statistics at import)
    instruments,
    memory_budget,
    output_contract,
    poison,
    samples,
    timing,
)
from .inputs import entry_inputs, make_inputs  # noqa: E402
from .output_contract import check_output, gather, host_copy, storage_span  # noqa: E402
from .poison import bitwise_equal, fill_free_memory  # noqa: E402
from .protocol import (  # noqa: E402
    PLAN_FILE,
    RESULTS_FILE,
    SCRATCH_DIR,
    Plan,
    Run,
    gpu_kernels,
)
from .timing import bench_shape  # noqa: E402

HARNESS_MODULES = (instruments, memory_budget, output_contract, poison, samples, timing, _launch)
"""The worker-side modules this worker runs code from: their globals are watched like its own."""


class Counted(NamedTuple):
    """What one profiled call launched: kernel count and names (``protocol.gpu_kernels``),
    and its workspace in bytes (None on the CPU device)."""

    count: int
    kernels: list[str]
    workspace: int | None


EXIT_OK, EXIT_CANDIDATE_ERROR, EXIT_VERIFIER_ERROR, EXIT_REFUSED = 0, 1, 2, 3


class InputGenerationError(RuntimeError):
    """Drawing inputs failed. Before the candidate is imported that is the verifier's (or the
    spec's) fault: a verifier error, no attempt spent. After the import it is charged to the
    candidate (its import may have exhausted device memory or changed torch), so that no
    candidate can buy a verifier error; the pre-import draw of every correctness case makes
    a spec bug surface before the import."""


BALLAST_MAX = 47
"""Most small objects (1-256 bytes each) in one guarded call's secret-random ballast."""


def _noop() -> None:
    """What :meth:`Worker.guard_host_ms` wraps to time the guard alone."""


def tampered() -> list[str]:
    """Names of the captured instruments that no longer are what they were at start-up, and
    of the harness's own globals and ``Worker``'s attributes that were rebound since
    :func:`freeze_own_state`: a candidate that reaches the harness's globals (replacing
    ``_perf_counter`` or ``_do_bench``) is named in the ``import`` and ``integrity``
    records (tests/verifier/test_pipeline_cpu.py)."""
    out = []
    for k, f in WATCHED.items():
        try:
            if f() is not SNAPSHOT[k]:
                out.append(k)
        except Exception:  # noqa: BLE001
            out.append(k)
    for k, (holder, name, value, items) in _OWN.items():
        now = holder.get(name, _MISSING)
        if now is not value or (
            items is not None
            and (len(now) != len(items) or any(now.get(i, _MISSING) is not v for i, v in items.items()))
        ):
            out.append(k)
    return out


_MISSING = object()
_OWN: dict[str, tuple[Mapping[str, Any], str, Any, dict | None]] = {}


def freeze_own_state() -> None:
    """Record the globals of this module and of the worker-side modules whose code it runs
    (:data:`HARNESS_MODULES`: functions, classes, the captured instruments and their dicts)
    and ``Worker``'s class attributes, for :func:`tampered`. Called before the import."""
    for label, g in (
        ("worker_candidate", globals()),
        *((m.__name__.rsplit(".", 1)[-1], vars(m)) for m in HARNESS_MODULES),
    ):
        for name, value in list(g.items()):
            if not name.startswith("__") and name not in ("_OWN", "_MISSING"):
                _OWN[f"{label}.{name}"] = (g, name, value, dict(value) if type(value) is dict else None)
    for label, cls in (("Worker", vars(Worker)), ("Launcher", vars(_launch.Launcher))):
        for name, value in cls.items():
            if not name.startswith("__") or name == "__call__":
                _OWN[f"{label}.{name}"] = (cls, name, value, None)


class Worker:
    """State of one candidate-worker run (folder, plan, device, results file)."""

    def __init__(self, folder: Path, plan_text: str | None = None):
        self.dir = folder
        self.scratch = folder / SCRATCH_DIR
        (self.scratch / "trials").mkdir(parents=True, exist_ok=True)
        fd = landlock.LAUNCH_RESULTS_FD  # the parent's results pipe (confine/launch.py)
        self._out = (
            open(folder / RESULTS_FILE, "a", encoding="utf-8")
            if fd is None  # noqa: SIM115
            else os.fdopen(fd, "w", encoding="utf-8")
        )  # lives as long as the worker
        self._fsync = stat.S_ISREG(os.fstat(self._out.fileno()).st_mode)  # a pipe needs none
        self.plan = Plan.from_json(plan_text if plan_text is not None else (folder / PLAN_FILE).read_text())
        self.results = folder / RESULTS_FILE
        self.device = torch.device(self.plan.device)
        self.cuda = self.device.type == "cuda"
        self.loaded = load_spec(self.plan.spec_dir)
        self.spec = self.loaded.spec
        self.fn: Callable[..., Any] | None = None
        self._rng = random.Random(self.plan.secret ^ 0x5EED)  # heap ballast (no_host_sync)
        self.budget = self.plan.memory_budget  # bytes; the applied one once main() set it on the device
        self.imported = False  # candidate code has run in this process
        self.profiler_ok = False  # the launch-counting profiler passed its self-test here
        # trusted reference.py, imported once before any candidate code (derived inputs)
        self.ref = self.loaded.load_reference() if any(t.init.dist == "derived" for t in self.spec.all_inputs) else None

    # -- plumbing -----------------------------------------------------------------
    def record(self, part: str, **fields: Any) -> None:
        """Append one record to the parent's results pipe (a pipe can only be appended to:
        nothing in this process can rewrite earlier records; the file is read-only here)."""
        self._out.write(record_line({"part": part, "t": round(_perf_counter() - _T0, 4), **fields}))
        self._out.flush()
        if self._fsync:
            os.fsync(self._out.fileno())

    def begin(self, what: str) -> None:
        self.record("begin", what=what)

    def sync(self) -> None:
        if self.cuda:
            _synchronize()

    # -- setup --------------------------------------------------------------------
    def check_device(self) -> str | None:
        """None when the device is usable, else the refusal message."""
        if not self.cuda:
            return None
        if not torch.cuda.is_available():
            return "no CUDA device visible to the candidate worker"
        cap = torch.cuda.get_device_capability(self.device)
        if cap != (9, 0):
            name = torch.cuda.get_device_name(self.device)
            return (
                f"the verifier needs a Hopper GPU (sm_90); this is {name} (sm_{cap[0]}{cap[1]}). "
                "quack @gemm_epilogue kernels are compiled for sm_90a."
            )
        return None

    def profiler_selftest(self) -> int:
        """Kernels the profiler sees for one known elementwise kernel (expected: 1)."""
        a = torch.ones(4096, device=self.device)
        self.sync()
        return self.count_launches(lambda: a * 2).count

    @staticmethod
    def set_checksums(sets: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Per input set, the int64 sums of every tensor's raw bits (on the device): a
        write into a timed input (an epilogue mod's ``out=`` aimed at an input) changes them."""
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        T = _T
        return [
            torch.stack(
                [
                    T["sum"](T["view"](T["reshape"](T["detach"](t), -1), ints[T["element_size"](t)]), dtype=torch.int64)
                    for t in d.values()
                ]
            )
            for d in sets
        ]

    def no_host_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with torch's sync debug mode at "error": a device-to-host read in
        candidate code (``float(t)``, ``bool(t)``, ``if t != u``, ``.item()``, ``nonzero``)
        raises, whatever the syntax (values read through ``float()`` tell timed calls from
        checked ones). A fused kernel's call never needs one."""
        # a secret-random ballast of small objects alive during the call: where the
        # candidate's own allocations land no longer tells which call this is (object
        # addresses would tell timed calls from checked ones). The guard's own
        # host cost is what a call pays for it: measured per shape (guard_host_ms).
        raw = self._rng.randbytes(BALLAST_MAX + 1)  # fresh per call, one C-level draw
        ballast = [bytearray(b + 1) for b in raw[1 : 2 + raw[0] % BALLAST_MAX]]
        if self.cuda:
            assert _set_sync_debug_mode is not None  # CUDA builds of torch have the binding
            _set_sync_debug_mode(2)  # "error" (the C binding: CUDA is initialized by now)
        try:
            return fn(*args)
        finally:
            if self.cuda:
                assert _set_sync_debug_mode is not None
                _set_sync_debug_mode(0)
            del ballast

    def guard_host_ms(self, reps: int = 200) -> float:
        """Median host ms that :meth:`no_host_sync` adds to one call (wrapping a no-op):
        part of every timed candidate call and of none of the baselines', so a host-bound
        shape's fused time includes it (reported beside the timings, never subtracted)."""
        samples = []
        for _ in range(reps):
            t0 = _perf_counter()
            self.no_host_sync(_noop)
            samples.append((_perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    def dsl_selftest(self) -> float:
        """Compile and run quack's plain-GEMM epilogue mod once, confined, before any candidate
        code: a DSL/driver/cache write that the confinement breaks fails here, as the
        verifier's problem, instead of failing a good candidate. Seconds taken; raises
        when the result is wrong or anything fails."""
        from quack.epilogue.library import identity_epi

        t0 = _perf_counter()
        g = torch.Generator(device=self.device).manual_seed(0)
        a = torch.randn(256, 128, device=self.device, generator=g).to(torch.bfloat16)
        b = torch.randn(128, 256, device=self.device, generator=g).to(torch.bfloat16)
        # under the same no-sync rule as candidate calls: quack's own call path (first
        # compile included) must not need a host sync, or the rule would blame candidates
        d = self.no_host_sync(lambda: identity_epi(a, b, tuned=False)["D"])
        want = a.float() @ b.float()
        err = (d.float() - want).abs().max().item()
        if not err <= 0.05 * want.abs().max().item():
            raise RuntimeError(f"identity_epi GEMM max error {err:.3g}")
        self.sync()
        return _perf_counter() - t0

    def instrument_probe(self) -> Callable[[], Any]:
        """A known kernel to time once in setup (initialises the timer's driver helpers)."""
        a = torch.ones(1 << 16, device=self.device)
        return lambda: a * 2

    def poison(self) -> int:
        """Fill the allocator's free memory with the poison word right before a trial's call
        (:func:`~coda_agent.verifier.gpu.poison.fill_free_memory`); bytes poisoned, 0 on the CPU."""
        if not self.cuda:
            return 0
        assert self.budget is not None  # main() applied it before any trial
        return fill_free_memory(self.device, self.sync, self.budget)

    def import_candidate(self, path: Path, sha256: str | None) -> None:
        # From the snapshot's bytes, hash-checked, never through a bytecode cache (snapshot.py)
        freeze_own_state()
        audit.install(str(path))  # the candidate's own frames may not exec, walk frames or reach the OS
        mod = load_module(path, "coda_candidate", sha256)
        audit.seal()
        fn = getattr(mod, self.spec.entry.function, None)
        if not callable(fn):
            raise AttributeError(f"candidate defines no function {self.spec.entry.function!r}")
        # Rationale: the entry runs exactly as training runs it, every epilogue mod behind a
        # direct launcher (coda_agent.runtime.launch), with the plan's tuned configs if any:
        # the binary judged here is the binary the ops launch.
        config_for = override_lookup(self.spec.name, self.plan.tuning) if self.plan.tuning else None
        self.fn, _ = bind_entry(mod, self.spec.entry.function, config_for)

    # -- one trial ----------------------------------------------------------------
    def inputs_for(self, dims: dict[str, int], seed: int, draw: str = "spec") -> dict[str, torch.Tensor]:
        """The trial's inputs (bit-identical to the reference worker's); raises InputGenerationError."""
        try:
            return entry_inputs(self.spec, make_inputs(self.loaded, dims, seed, self.device, self.ref, draw))
        except Exception as e:  # noqa: BLE001
            raise InputGenerationError(f"input generation failed: {type(e).__name__}: {e}") from e

    def args_of(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [inputs[t.name] for t in self.spec.entry.inputs]

    def entry_with(self, dims: dict[str, int]):
        """The entry with the spec's constants (keyword-only ints) bound for ``dims``."""
        assert self.fn is not None
        consts = self.spec.constants_of(dims)
        return functools.partial(self.fn, **consts) if consts else self.fn

    def run_trial(self, run: Run, count: bool = False) -> tuple[dict[str, Any], Counted | None]:
        """Run the entry once on fresh inputs; save tensors; return ``(record fields,
        launches)``. ``count``: the call runs under the profiler and ``launches`` is its
        :class:`Counted` (kernel count, names, workspace bytes), else None. Counting a judged, poisoned trial (not a
        separate call) leaves a candidate nothing to tell the counted call apart by: an
        extra, unjudged count call can be told from the judged trials by the allocator
        poison (tests/verifier/corpus/poison_probe_fallback.py)."""
        assert self.fn is not None
        inputs = self.inputs_for(run.dims, run.seed, run.draw)
        self.sync()
        before = {} if run.sample else {k: host_copy(v) for k, v in inputs.items()}
        poisoned = self.poison()
        call = functools.partial(self.no_host_sync, self.entry_with(run.dims), *self.args_of(inputs))
        # the workspace of every trial, not only the profiled one (code that can tell the
        # profiler is on could behave only there)
        t0 = _perf_counter()
        if count:
            res, launches = self.counted_call(call)
            workspace = launches.workspace
        else:
            (res, workspace), launches = self.measured_call(call), None
        call_s = _perf_counter() - t0
        return self.save_result(
            run, res, inputs, before, call_s=call_s, poisoned_bytes=poisoned, workspace_bytes=workspace
        ), launches

    def check_result(
        self, run: Run, res: Any, inputs: dict[str, torch.Tensor]
    ) -> tuple[list[tuple[int, Any, Any, list[dict[str, Any]]]], list[dict[str, Any]]]:
        """The output contract of one call's result, checked on metadata only (host side,
        no sync): ``([(position, output spec, returned value, its violations)], every
        violation)``, the count mismatch included."""
        outs = list(res) if type(res) in (tuple, list) else [res]
        violations: list[dict[str, Any]] = []
        expected = self.spec.entry.outputs
        if len(outs) != len(expected):
            violations.append(
                dict(
                    kind="output-count",
                    output=None,
                    message=f"returned {len(outs)} value(s); expected {len(expected)} "
                    f"({', '.join(o.name for o in expected)}) as a tuple in that order",
                )
            )
        spans = {k: storage_span(v) for k, v in inputs.items()}
        out_spans: dict[str, tuple[int, int]] = {}
        per = []
        for pos, (spec_o, o) in enumerate(zip(expected, outs, strict=False)):
            v = check_output(self.spec, spec_o, o, run.dims, self.device, spans, out_spans)
            violations += v
            per.append((pos, spec_o, o, v))
        return per, violations

    def save_result(
        self, run: Run, res: Any, inputs: dict[str, torch.Tensor], before: dict[str, torch.Tensor], **extra: Any
    ) -> dict[str, Any]:
        """Check the output contract of one call's result, save the outputs (sampled for
        ``run.sample``) and the inputs before/after, and return the record fields."""
        per, violations = self.check_result(run, res, inputs)
        saved: dict[str, torch.Tensor | None] = {o.name: None for o in self.spec.entry.outputs}
        picked = samples.output_samples(self.spec, run.dims, run.sample, run.seed) if run.sample else []
        for pos, spec_o, o, v in per:
            # anything but a plain tensor with its data in place is never read (output_contract)
            if not any(x["kind"] == "output-not-plain-tensor" for x in v):
                if run.sample and not v:
                    idx = picked[pos].to(o.device)
                    saved[spec_o.name] = _T["to"](gather(o, idx), "cpu")
                elif _T["numel"](o) <= 4 * math.prod(self.spec.shape_of(spec_o, run.dims)) + 1024:
                    saved[spec_o.name] = host_copy(o)
        if run.sample:  # a bench-shape check: inputs are large and already checked at the correctness shapes
            before, after, mutated = {}, {}, []
        else:
            after = {k: host_copy(v) for k, v in inputs.items()}
            mutated = [k for k in inputs if not bitwise_equal(before[k], after[k])]
        del res, per, inputs
        return self._write_trial(run, saved, before, after, violations, mutated, **extra)

    def _write_trial(
        self,
        run: Run,
        saved: dict[str, torch.Tensor | None],
        before: dict[str, torch.Tensor],
        after: dict[str, torch.Tensor],
        violations: list[dict[str, Any]],
        mutated: list[str],
        **extra: Any,
    ) -> dict[str, Any]:
        """Save one trial's (CPU) outputs and inputs to ``trials/<key>.pt``; the record fields."""
        fname = f"{SCRATCH_DIR}/trials/{run.key}.pt"
        buf = io.BytesIO()
        torch.save({"outputs": saved, "inputs_before": before, "inputs_after": after}, buf)
        data = buf.getvalue()
        (self.dir / fname).write_bytes(data)
        # the sha256 goes through the protected results file: a saved file changed later
        # (by candidate code still running in this process) no longer matches it
        return dict(
            key=run.key,
            file=fname,
            sha256=hashlib.sha256(data).hexdigest(),
            bytes=len(data),
            violations=violations,
            inputs_mutated=mutated,
            ok=True,
            **extra,
        )

    def gather_timed(
        self, run: Run, res: Any, inputs: dict[str, torch.Tensor], idx: list[torch.Tensor]
    ) -> dict[str, Any]:
        """A kept timed call (:func:`~coda_agent.verifier.gpu.protocol.timed_loop_check_run`):
        :meth:`check_result`, and each valid output's sampled elements gathered on the
        device, in stream order right after the call (``idx[pos]``: the run's sample
        positions for output ``pos``, on the device). Nothing is copied to the host here:
        :meth:`save_gathered` does that after timing."""
        per, violations = self.check_result(run, res, inputs)
        gathered: dict[str, torch.Tensor | None] = {o.name: None for o in self.spec.entry.outputs}
        for pos, spec_o, o, v in per:
            if not v:
                gathered[spec_o.name] = gather(o, idx[pos])
        return {"run": run, "gathered": gathered, "violations": violations}

    def save_gathered(self, kept: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """Write the kept timed call's gathered samples (:meth:`gather_timed`); record fields."""
        saved = {k: (None if g is None else _T["to"](g, "cpu")) for k, g in kept["gathered"].items()}
        return self._write_trial(kept["run"], saved, {}, {}, kept["violations"], [], **extra)

    # -- launches -------------------------------------------------------------------
    def measured_call(self, call: Callable[[], Any]) -> tuple[Any, int | None]:
        """``(result, workspace bytes)`` of one ``call()``, synchronized: the device memory
        it held beyond what was in use before it and what it returned
        (``verifier/gpu/device_memory.py``); None on the CPU device."""
        start = device_memory.mark(self.device) if self.cuda else None
        res = call()
        self.sync()
        return res, None if start is None else device_memory.workspace_since(self.device, start, res)

    def counted_call(self, call: Callable[[], Any]) -> tuple[Any, Counted]:
        """``(result, Counted(kernel count, kernel names, workspace bytes))`` of one
        ``call()`` under the profiler (CUDA activity), synchronized inside."""
        with _profile(activities=[_Activity.CPU, _Activity.CUDA]) as prof:
            res, workspace = self.measured_call(call)
        events = prof.events()
        assert events is not None  # parsed when the profiler stopped
        names = [e.name for e in events if e.device_type == _DeviceTypeCUDA]
        kernels = gpu_kernels(names)
        return res, Counted(len(kernels), kernels, workspace)

    def count_launches(self, call: Callable[[], Any]) -> Counted:
        """:class:`Counted` of one ``call()`` under the profiler (CUDA activity)."""
        res, counted = self.counted_call(call)
        del res
        return counted

    # -- bench --------------------------------------------------------------------------
    def time_event_ms(self, call: Callable[[], Any]) -> float:
        """Median device time of ``call`` in ms (do_bench; host timing on the CPU test path)."""
        if self.cuda:
            if _do_bench is None:
                raise RuntimeError("triton.testing.do_bench is not importable: cannot time on the GPU")
            return float(_do_bench(call, return_mode="median"))  # pyright: ignore[reportArgumentType]  (a float for "median"; triton's annotation lacks it)
        samples = []
        for _ in range(5):
            t0 = _perf_counter()
            call()
            samples.append((_perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    # -- main -----------------------------------------------------------------------
    def main(self) -> int:
        from .environment import collect_environment

        # Normally confined since before `import torch` (confine/launch.py: no thread escapes);
        # started without the launcher (a developer's direct run), it confines here, after
        # CUDA init, and the description counts the threads that stay unconfined.
        sandbox = landlock.LAUNCH_SANDBOX
        self.begin("setup")
        refusal = self.check_device()
        if refusal:
            self.record("setup", ok=False, error="not-hopper", sandbox=sandbox, message=refusal)
            return EXIT_REFUSED
        if self.cuda:  # before any candidate code: its allocations stay within the budget
            self.budget = memory_budget.apply(self.device, self.plan.memory_budget)
        env = collect_environment(probe_gpu=self.cuda).model_dump()
        if sandbox is None:
            sandbox = landlock.confine_worker([self.scratch])
        elif not landlock.switched_off():  # the launcher left seccomp for after CUDA init (it opens a socket)
            sandbox = f"{sandbox}; {landlock.install_seccomp(drop_caps=False)}"
        # The instruments' self-tests run confined, so a library that needs a write outside
        # this folder (or a socket) fails here, as the verifier's problem, not later as the
        # candidate's. No candidate code has run yet, so a failing self-test is the
        # environment's fault.
        selftests = (
            (
                "profiler-broken",
                "the launch-counting profiler fails",
                lambda: self.profiler_selftest() if self.cuda else None,
            ),
            (
                "timer-broken",
                "the benchmark timer fails",
                lambda: self.time_event_ms(self.instrument_probe()) if self.cuda and self.plan.bench else None,
            ),
            (
                "dsl-broken",
                "quack's identity_epi GEMM does not compile/run",
                lambda: self.dsl_selftest() if self.cuda else None,
            ),
        )
        got = {}
        for error, what, test in selftests:
            try:
                got[error] = test()
            except Exception as e:  # noqa: BLE001 -- see above
                self.record(
                    "setup",
                    ok=False,
                    error=error,
                    sandbox=sandbox,
                    message=f"{what} in the confined worker: {type(e).__name__}: {e}",
                )
                return EXIT_REFUSED
        selftest, timer_ms, dsl_s = got["profiler-broken"], got["timer-broken"], got["dsl-broken"]
        self.profiler_ok = bool(self.cuda and selftest)
        self.record(
            "setup",
            ok=True,
            device=str(self.device),
            env=env,
            profiler_selftest=selftest,
            plan_sha256=self.plan.sha256(),
            sandbox=sandbox,
            timer_selftest_ms=timer_ms,
            dsl_selftest_s=dsl_s,
            memory_budget=self.budget,
        )

        # Every correctness/recheck case's inputs once before any candidate code runs: a spec
        # or verifier problem in drawing them shows up here, not charged to the candidate.
        self.begin("input check")
        for run in [*self.plan.correctness_runs, *self.plan.recheck_runs]:
            self.inputs_for(run.dims, run.seed, run.draw)
        self.sync()
        self.begin("import")
        t0 = _perf_counter()
        self.imported = True
        self.import_candidate(Path(self.plan.candidate or ""), self.plan.candidate_sha256)
        self.record("import", ok=True, seconds=_perf_counter() - t0, tampered=tampered())

        # The first trial of every correctness shape runs under the profiler: a candidate that
        # branches on the shape must stay within the launch budget at every one of them, and
        # the counted call is a judged one (see run_trial).
        counted: set[str] = set()
        for run in self.plan.correctness_runs:
            self.begin(f"trial {run.key}")
            count = self.profiler_ok and run.case not in counted
            fields, launches = self.run_trial(run, count=count)
            self.record("trial", **fields)
            if launches is not None:
                counted.add(run.case)
                self.record(
                    "launches",
                    count=launches.count,
                    kernels=launches.kernels,
                    selftest=selftest,
                    key=run.key,
                    case=run.case,
                    workspace_bytes=launches.workspace,
                )
        if not self.profiler_ok:
            why = "CPU device" if not self.cuda else f"profiler self-test saw {selftest} kernels for one known kernel"
            self.record("launches", count=None, kernels=[], selftest=selftest, reason=why)

        if self.plan.bench:
            for bs in self.plan.bench_shapes:
                self.begin(f"bench {bs.name}")
                self.record("bench", **bench_shape(self, bs.name, bs.dims))

        for run in self.plan.recheck_runs:
            self.begin(f"recheck {run.key}")
            self.record("recheck", **self.run_trial(run)[0])

        self.record("integrity", tampered=tampered())
        self.record("done")
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="coda-agent candidate worker (untrusted side)")
    ap.add_argument("--dir", required=True, type=Path, help="worker folder (holding plan.json unless --plan-stdin)")
    ap.add_argument(
        "--plan-stdin",
        action="store_true",
        help="read the plan from stdin (the pipeline's way: the plan holds the secret, and files "
        "stay readable to a confined worker)",
    )
    a = ap.parse_args(argv)
    try:
        w = Worker(a.dir, sys.stdin.read() if a.plan_stdin else None)
    except Exception:  # noqa: BLE001 -- a broken plan/spec is a verifier error, report it
        traceback.print_exc()
        return 2
    try:
        return w.main()
    except InputGenerationError:
        tb = traceback.format_exc()
        after = w.imported
        why = (
            "input generation failed after the candidate was imported (the same generator "
            "worked before it: e.g. the candidate's import used up device memory)\n"
            if after
            else ""
        )
        try:
            w.record("error", error="input-generation", verifier=not after, message=why + tb[-6000:])
        except Exception:  # noqa: BLE001
            pass
        sys.stderr.write(why + tb)
        return EXIT_CANDIDATE_ERROR if after else EXIT_VERIFIER_ERROR
    except BaseException as e:  # noqa: BLE001 -- everything else after setup is the candidate's doing
        tb = traceback.format_exc()
        try:
            w.record("error", error=type(e).__name__, message=tb[-6000:])
        except Exception:  # noqa: BLE001
            pass
        sys.stderr.write(tb)
        return EXIT_CANDIDATE_ERROR


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""The ``bench`` stage: fused time vs the baselines, and two honesty checks on the timing.

Numbers come from the workers (candidate: ``event_ms`` from
``triton.testing.do_bench(return_mode="median")`` over rotated input sets with L2
flushed, and ``wall_ms``, the median host wall time of synchronize-call-synchronize;
reference: each baseline's ``ms`` measured the same way). Per benchmark shape the
stage reports the fused median (ms), each baseline (ms) and the ratio fused/baseline,
TFLOP/s (``spec.bench.flops``) and GB/s (bytes = every input and output at its dtype,
each moved once).

Five results are *failures*, because they mean the measurement cannot be trusted:

* ``speed-of-light`` -- the fused time is below ``max(flops / peak_flops,
  bytes / peak_bandwidth)`` for this GPU (:data:`PEAKS`): physically impossible, so
  the kernel skipped work, cached results or escaped the timer (threats 6, 14);
* ``untimed-work`` -- the event time is far below the device part of the host wall
  time (``event < 0.5 * (wall - host) - 0.05 ms``, ``host`` = the median time until the
  synchronized call *returns*, before the closing synchronize): work ran outside the
  timed stream (side stream, thread, deferred work; threat 3). Subtracting the host
  time keeps a legitimately host-bound call (many small launches, Python dispatch at a
  small shape) from looking like hidden device work: its wall time is host time, not
  device time the events missed. (Added after gemm_rmsnorm_rope attempt 1 was flagged
  at llama3-1b/M8192 with event 0.22 ms against a 0.62 ms wall; host time was not
  recorded then. Not yet re-run on a GPU.)
* ``short-timer`` -- do_bench made far fewer calls than its own rule gives for the time
  it measured (:func:`short_timer`): the candidate made the 5 estimate calls slow, so
  that only one or two calls were measured and the timed-loop checks (8 kept calls)
  could not cover them all (9 timer calls, one cheap measured call).
* ``timed-check-missing`` -- the worker's record of a shape's timing exists but fewer
  timed calls were kept for checking than it must keep (every one of the first
  :data:`~coda_agent.verifier.gpu.protocol.TIMED_LOOP_SLOTS` timer calls fills a slot, so
  ``min(slots, timer calls)``), or the extra call after timing or the secretly picked
  wall-time call (:func:`~coda_agent.verifier.gpu.protocol.wall_check_run`) was not checked: checks
  that silently did not run would pass a kernel unchecked. Only candidate code
  reaching into the worker's state can cause it; the worker records every check of a
  shape before that shape's timing record.
* ``launches-at-bench-shape`` -- one call at a benchmark shape launched more GPU kernels
  than the spec's ``entry.max_launches`` (or none), more GEMMs than its
  ``entry.max_gemm_launches``, or the count failed. The candidate
  worker counts the launches of one call at every benchmark shape (GPU only), as the
  correctness stage does at every correctness shape: a candidate can branch on shape or
  device, calling the quack epilogue where it is counted and doing plain torch math
  elsewhere, so the time measured would not be the epilogue's. A failure, not a warning:
  the H200 launch census (``benchmarks/probes/launches_per_kernel.py``: every accepted kernel launches
  the same number of kernels at all of its shapes, within budget) shows that legitimate
  host glue does not grow with the shape.
* ``workspace-at-bench-shape`` -- that counted call, or the unprofiled call after timing
  (one of the timed rotation), held more device memory beyond its inputs and outputs than
  the spec's workspace budget
  (:meth:`~coda_agent.verifier.spec.KernelSpec.workspace_budget`,
  ``verifier/gpu/device_memory.py``): an intermediate the fused op must not materialize
  (tests/verifier/corpus/materialized_logits.py stores its fp32 logits). The correctness stage
  judges the same on every correctness trial (``workspace-over-budget``); the benchmark
  shapes are where a GEMM-sized intermediate outgrows every declared operand.

The spec's ``bench.bar`` (largest acceptable fused/baseline ratio per baseline) is
reported as met/missed per shape; a missed bar is a warning finding (``bar-missed``),
not a failure.

A baseline that failed to run is a warning (``baseline-error``).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..gpu.inputs import tensor_bytes
from ..gpu.protocol import (
    TIMED_LOOP_SLOTS,
    BenchShape,
    gemm_launches,
    timed_check_run,
    timed_loop_check_run,
    wall_check_run,
)
from ..gpu.results import GpuRun, failure_finding, jsonable
from ..spec import LAUNCH_NAMES_KEPT, LoadedSpec, eval_expr
from ..verdict import Finding, StageResult
from .correctness import gemm_problems, workspace_problem

PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
}
"""GPU name substring -> (dense bf16 FLOP/s, HBM bytes/s): datasheet peaks, i.e. upper bounds."""
DEFAULT_PEAKS = PEAKS["H100"]

UNTIMED_RATIO = 0.5
UNTIMED_SLACK_MS = 0.05


def peaks_for(gpu: str | None) -> tuple[float, float]:
    """(peak FLOP/s, peak bytes/s) for a GPU name (``"NVIDIA H200"``); H100 values otherwise."""
    name = (gpu or "").upper()
    for key, val in PEAKS.items():
        if key in name:
            return val
    return DEFAULT_PEAKS


def speed_of_light_ms(flops: float, nbytes: float, gpu: str | None) -> dict[str, Any]:
    """The physical floor of one call in ms.

    Returns ``{"sol_ms", "compute_ms", "memory_ms", "bound", "peak_flops", "peak_bw"}``
    with ``compute_ms = flops / peak_flops`` and ``memory_ms = nbytes / peak_bw`` (both
    in ms) and ``sol_ms`` their maximum; ``bound`` is ``"compute"`` or ``"memory"``.
    """
    pf, pb = peaks_for(gpu)
    c, m = flops / pf * 1e3, nbytes / pb * 1e3
    return {
        "sol_ms": max(c, m),
        "compute_ms": c,
        "memory_ms": m,
        "bound": "compute" if c >= m else "memory",
        "peak_flops": pf,
        "peak_bw": pb,
    }


def untimed_work(
    event_ms: float,
    wall_ms: float,
    host_ms: float = 0.0,
    ratio: float = UNTIMED_RATIO,
    slack_ms: float = UNTIMED_SLACK_MS,
) -> bool:
    """True when the device-event time is implausibly small against the device part of the
    synchronized wall time (``wall_ms - host_ms``: what the closing synchronize waited for)."""
    return event_ms < ratio * max(0.0, wall_ms - host_ms) - slack_ms


TIMER_MARGIN_MS = 1.0
"""Added to the fused time when estimating how many calls do_bench makes (its estimate also
holds the L2 flush and the first calls' jitter): a lenient, lower expectation."""
TIMER_MIN_FRACTION = 0.5


def do_bench_calls(ms: float, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> int:
    """Calls ``triton.testing.do_bench`` makes for a call of ``ms`` ms: one first call, 5 to
    estimate, then ``max(1, warmup / estimate)`` and ``max(1, rep / estimate)``."""
    est = max(ms, 1e-6)
    return 1 + 5 + max(1, int(warmup_ms / est)) + max(1, int(rep_ms / est))


def short_timer(event_ms: float, timer_calls: int) -> bool:
    """True when do_bench ran far fewer calls than its own rule gives for the fused time it
    measured (at most :data:`TIMER_MIN_FRACTION` of :func:`do_bench_calls` at
    ``event_ms + TIMER_MARGIN_MS``): the candidate made do_bench's 5 estimate calls slow so
    that few calls were measured (9 timer calls, one cheap measured call)."""
    return timer_calls < TIMER_MIN_FRACTION * do_bench_calls(event_ms + TIMER_MARGIN_MS)


def throughput(flops: float, nbytes: float, ms: float) -> tuple[float, float]:
    """(TFLOP/s, GB/s) of ``flops`` FLOPs and ``nbytes`` bytes done in ``ms`` milliseconds."""
    if ms <= 0:
        return math.inf, math.inf
    s = ms * 1e-3
    return flops / s / 1e12, nbytes / s / 1e9


def shape_metrics(
    loaded: LoadedSpec,
    dims: dict[str, int],
    event_ms: float,
    wall_ms: float,
    baselines: dict[str, dict[str, Any]],
    gpu: str | None,
    host_ms: float = 0.0,
    timer_calls: int | None = None,
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Metrics of one benchmark shape and its ``(kind, message)`` problems.

    ``baselines`` maps name -> ``{"ms": float}`` or ``{"error": str}``; ``timer_calls`` is
    how many calls do_bench made (None: not timed by do_bench, e.g. the CPU test path).
    Problem kinds: ``speed-of-light``, ``untimed-work`` and ``short-timer`` (failures),
    ``bar-missed`` and ``baseline-error`` (warnings).
    """
    spec = loaded.spec
    flops = float(eval_expr(spec.bench.flops, dims))
    nbytes = float(tensor_bytes(spec, dims, "all"))
    sol = speed_of_light_ms(flops, nbytes, gpu)
    tflops, gbps = throughput(flops, nbytes, event_ms)
    m: dict[str, Any] = {
        "dims": dict(dims),
        "fused_ms": event_ms,
        "wall_ms": wall_ms,
        "host_ms": host_ms,
        "flops": flops,
        "bytes": nbytes,
        "tflops": tflops,
        "gbps": gbps,
        "sol_ms": sol["sol_ms"],
        "sol_bound": sol["bound"],
        "sol_fraction": sol["sol_ms"] / event_ms if event_ms > 0 else math.inf,
        "baselines": {},
        "bar": {},
    }
    problems: list[tuple[str, str]] = []
    if event_ms < sol["sol_ms"]:
        problems.append(
            (
                "speed-of-light",
                f"fused time {event_ms:.4g} ms is below the speed of light {sol['sol_ms']:.4g} ms "
                f"({sol['bound']}-bound: {flops:.3g} FLOP at {sol['peak_flops']:.3g} FLOP/s, "
                f"{nbytes:.3g} B at {sol['peak_bw']:.3g} B/s): faster than speed of light: investigate "
                "(skipped work, cached results, or work outside the timer)",
            )
        )
    if untimed_work(event_ms, wall_ms, host_ms):
        problems.append(
            (
                "untimed-work",
                f"device-event time {event_ms:.4g} ms is far below the device part of the host wall time "
                f"({wall_ms:.4g} ms wall - {host_ms:.4g} ms until the call returned; flagged below "
                f"{UNTIMED_RATIO} x that - {UNTIMED_SLACK_MS} ms): work outside the timed stream "
                "(side stream, thread or deferred work)",
            )
        )
    if timer_calls is not None:
        m["timer_calls"] = timer_calls
        if short_timer(event_ms, timer_calls):
            problems.append(
                (
                    "short-timer",
                    f"do_bench made {timer_calls} calls for a {event_ms:.4g} ms call, fewer than "
                    f"{TIMER_MIN_FRACTION:g} x the {do_bench_calls(event_ms + TIMER_MARGIN_MS)} its rule gives "
                    "even with a generous estimate: its estimate calls were much slower than the timed ones",
                )
            )
    for b, r in baselines.items():
        if "ms" in r and r["ms"]:
            bt, _ = throughput(flops, nbytes, r["ms"])
            m["baselines"][b] = {"ms": r["ms"], "ratio": event_ms / r["ms"], "tflops": bt}
        else:
            m["baselines"][b] = {"error": r.get("error", "no timing")}
            problems.append(("baseline-error", f"baseline {b} did not run: {r.get('error', 'no timing')}"))
    for b, limit in spec.bench.bar.items():
        got = m["baselines"].get(b, {})
        if "ratio" not in got:
            m["bar"][b] = {"limit": limit, "ratio": None, "met": None}
            continue
        met = got["ratio"] <= limit
        m["bar"][b] = {"limit": limit, "ratio": got["ratio"], "met": met}
        if not met:
            problems.append(("bar-missed", f"fused/{b} = {got['ratio']:.3f}, bar is <= {limit:g}"))
    return m, problems


FAILING = (
    "speed-of-light",
    "untimed-work",
    "short-timer",
    "timed-check-missing",
    "launches-at-bench-shape",
    "workspace-at-bench-shape",
)

HOST_BOUND = 0.8
"""A shape is host-bound when one fused call's host time (until it returned) is at least
this fraction of its device time: do_bench's timed window then holds launch gaps and
Python, and the number moves with the host from run to run (seen on the H200: the same
gemm_rope call 0.165 ms in one run, 0.40 ms in another, at llama3-1b)."""


def host_bound(m: dict[str, Any]) -> bool:
    """Whether a bench-stage shape record (``host_ms``, ``fused_ms``) is host-bound."""
    h, f = m.get("host_ms"), m.get("fused_ms")
    return bool(h and f and h >= HOST_BOUND * f)


def bench_stage(loaded: LoadedSpec, run: GpuRun, gpu: str | None = None) -> StageResult:
    """Build the ``bench`` StageResult from the workers' bench records.

    ``gpu`` is the GPU name for the speed-of-light peaks (default: what the candidate
    worker reported). Skips when the plan did not ask for a benchmark.
    """
    t0 = time.monotonic()
    if not run.plan.bench:
        return StageResult(
            stage="bench", status="skip", summary="benchmark not run (--no-bench): not verified for speed"
        )
    if not run.plan.bench_shapes:
        return StageResult(stage="bench", status="skip", summary="the spec has no benchmark shapes")
    gpu = gpu or run.gpu_env.get("gpu")
    cand = {r["shape"]: r for r in run.cand_part("bench")}
    ref = {r["shape"]: r for r in run.ref_part("bench")}
    findings: list[Finding] = []
    shapes: dict[str, Any] = {}
    for bs in run.plan.bench_shapes:
        c = cand.get(bs.name)
        if c is None:
            fd = failure_finding(run.cand, case=bs.name)
            if run.cand.status == "ok":
                fd = Finding(kind="crash", message="the candidate worker produced no timing", case=bs.name)
            findings.append(fd)
            break
        baselines = dict((ref.get(bs.name) or {}).get("baselines") or {})
        if not baselines and run.ref is not None and not run.ref.finished:
            baselines = {"reference": {"error": run.ref.message()[:500]}}
        m, problems = shape_metrics(
            loaded,
            bs.dims,
            float(c["event_ms"]),
            float(c["wall_ms"]),
            baselines,
            gpu,
            host_ms=float(c.get("host_ms") or 0.0),
            timer_calls=c.get("timer_calls") if c.get("timer") == "do_bench" else None,
        )
        m["n_sets"] = c.get("n_sets")
        # host ms the verifier's per-call guard adds to every timed fused call (not to baselines)
        m["guard_host_ms"] = c.get("guard_host_ms")
        m["wall_samples_ms"] = c.get("wall_samples_ms")
        shapes[bs.name] = m
        for kind, msg in problems:
            findings.append(Finding(kind=kind, message=f"[{bs.name}] {msg}", case=bs.name))
        launches = c.get("launches")
        if c.get("launch_count_error"):
            findings.append(
                Finding(
                    kind="launches-at-bench-shape",
                    case=bs.name,
                    message=(f"[{bs.name}] the launches of one call could not be counted: {c['launch_count_error']}"),
                )
            )
        if isinstance(launches, int):
            m["launches"] = launches
            limit = loaded.spec.entry.max_launches
            if launches == 0 or launches > limit:
                names = ", ".join(str(k) for k in (c.get("launch_kernels") or [])[:8])
                findings.append(
                    Finding(
                        kind="launches-at-bench-shape",
                        case=bs.name,
                        message=(
                            f"[{bs.name}] one call launched {launches} GPU kernel(s), expected 1 to {limit} (the spec's "
                            f"max_launches, also enforced at every correctness shape){': ' + names if names else ''}; "
                            "the measured time would not be the fused kernel's"
                        ),
                    )
                )
            names = [str(k) for k in (c.get("launch_kernels") or [])]
            if c.get("launch_kernels") is not None:
                m["gemm_launches"] = gemm_launches(names)
            for msg in gemm_problems(loaded, launches, names, "", kept=LAUNCH_NAMES_KEPT):
                if msg:
                    findings.append(Finding(kind="launches-at-bench-shape", case=bs.name, message=f"[{bs.name}] {msg}"))
        # the counted call's workspace, and that of the unprofiled call after timing (the
        # same rotation as the timed calls: nothing tells it apart from them)
        extra = next((r for r in run.cand_part("recheck") if r.get("key") == timed_check_run(bs, 0, 0).key), {})
        sizes = [w for w in (c.get("workspace_bytes"), extra.get("workspace_bytes")) if isinstance(w, int)]
        if sizes:
            ws = max(sizes)
            m["workspace_bytes"] = ws
            msg = workspace_problem(loaded, bs.dims, ws, "one call")
            if msg:
                findings.append(Finding(kind="workspace-at-bench-shape", case=bs.name, message=f"[{bs.name}] {msg}"))
        missing = _missing_timed_checks(run, bs, c)
        if missing:
            findings.append(Finding(kind="timed-check-missing", message=f"[{bs.name}] {missing}", case=bs.name))
    return stage_from_shapes(loaded, shapes, findings, gpu, time.monotonic() - t0)


def _missing_timed_checks(run: GpuRun, bs: BenchShape, rec: dict[str, Any]) -> str | None:
    """Why the timed calls of shape ``bs`` were not all checked (``rec``: its bench record),
    or None: see ``timed-check-missing`` in the module docstring."""
    kept = {r.get("key") for r in run.cand_part("recheck") if isinstance(r.get("timed_set"), int)}
    loop = sum(timed_loop_check_run(bs, 0, 0, j).key in kept for j in range(TIMED_LOOP_SLOTS))
    calls = rec.get("timer_calls")
    want = min(TIMED_LOOP_SLOTS, calls) if isinstance(calls, int) and calls >= 0 else TIMED_LOOP_SLOTS
    why = []
    if loop < want:
        why.append(
            f"{loop} of the {want} timed calls that had to be kept for checking were recorded (timer calls: {calls})"
        )
    if timed_check_run(bs, 0, 0).key not in kept:
        why.append("the extra call after timing was not recorded for checking")
    if wall_check_run(bs, 0, 0).key not in kept:
        why.append("none of the wall-time calls was recorded for checking")
    return "; ".join(why) + ": the timing cannot be trusted" if why else None


def stage_from_shapes(
    loaded: LoadedSpec, shapes: dict[str, Any], findings: list[Finding], gpu: str | None, duration_s: float = 0.0
) -> StageResult:
    """The ``bench`` StageResult from per-shape metrics (:func:`shape_metrics` records) and
    the findings raised while building them: bar summary, geometric means, the flat rows,
    pass/fail (a failing kind or a worker crash fails the stage) and the summary line."""
    pf, pb = peaks_for(gpu)
    metrics: dict[str, Any] = {
        "gpu": gpu,
        "peak_flops": pf,
        "peak_bw": pb,
        "shapes": shapes,
        "bar": _bar_summary(loaded, shapes),
        "geomean_ratio": _geomeans(shapes),
        "rows": _rows(shapes),
    }
    failing = [f for f in findings if f.kind in FAILING or f.kind in ("crash", "hang", "cuda-error")]
    status = "fail" if failing else "pass"
    summary = _summary(shapes, metrics, failing)
    return StageResult(
        stage="bench",
        status=status,
        summary=summary,
        findings=findings,
        metrics=jsonable(metrics),
        duration_s=duration_s,
    )


def _rows(shapes: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per shape (the CLI's benchmark table): ms, TFLOP/s, GB/s, baseline ms and ratios."""
    rows = []
    for name, m in shapes.items():
        ok = {b: r for b, r in m["baselines"].items() if "ms" in r}
        rows.append(
            {
                "shape": name,
                "fused_ms": m["fused_ms"],
                "wall_ms": m["wall_ms"],
                "tflops": m["tflops"],
                "gbps": m["gbps"],
                "sol_ms": m["sol_ms"],
                "baselines_ms": {b: r["ms"] for b, r in ok.items()},
                "ratios": {b: r["ratio"] for b, r in ok.items()},
            }
        )
    return rows


def _geomeans(shapes: dict[str, Any]) -> dict[str, float]:
    ratios: dict[str, list[float]] = {}
    for m in shapes.values():
        for b, r in m["baselines"].items():
            if "ratio" in r and r["ratio"] > 0:
                ratios.setdefault(b, []).append(r["ratio"])
    return {b: math.exp(sum(math.log(x) for x in v) / len(v)) for b, v in ratios.items()}


def _bar_summary(loaded: LoadedSpec, shapes: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for b, limit in loaded.spec.bench.bar.items():
        mets = [m["bar"][b]["met"] for m in shapes.values() if m["bar"].get(b, {}).get("met") is not None]
        out[b] = {"limit": limit, "met_shapes": sum(mets), "shapes": len(mets), "met": all(mets) if mets else None}
    return out


def _summary(shapes: dict[str, Any], metrics: dict[str, Any], failing: list[Finding]) -> str:
    if failing:
        return f"{len(failing)} problem(s): {', '.join(sorted({f.kind for f in failing}))}"
    if not shapes:
        return "no benchmark shape was timed"
    means = ", ".join(f"fused/{b} {g:.3f}x" for b, g in sorted(metrics["geomean_ratio"].items()))
    parts = [f"{len(shapes)} shape(s); " + (f"geomean over shapes: {means}" if means else "no baseline timed")]
    bars = metrics["bar"]
    if bars:
        state = {True: "met", False: "missed", None: "not measured"}
        parts.append(
            "bar "
            + ", ".join(
                f"{b}<={v['limit']:g}: {state[v['met']]} (met at {v['met_shapes']} of {v['shapes']} shapes)"
                for b, v in sorted(bars.items())
            )
        )
    return "; ".join(parts)

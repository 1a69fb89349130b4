"""Several benchmark runs of one kernel folded into one verdict: medians over repeated runs
(spread kept), and shapes measured by separate ``bench`` calls merged shape by shape.

Why: on the H200 a single run's fused/baseline ratio moves 2-5 % from run to run at the
same shape (``benchmarks/results/2026-11-30-nvidia-h200-resample.md``: gemm_cross_entropy's
fused/bare_gemm at 70B read 1.030 in one run and 1.062 in the next), while the catalogue's
targets have 3-5 % margins. One run decides such a target by chance.

How: ``coda-agent bench --repeat N`` verifies each kernel N times, round-robin over the
kernels (run 1 of every kernel, then run 2, ...), so slow drift on the machine spreads
over all of them instead of landing on one. Every run is a full verification with its own
workers, inputs and secret seeds (a number for a wrong kernel is worthless, and a kernel
must not learn which run is timed). :func:`combine` then folds the runs:

* any run that failed decides: the combined verdict is the first failing run, unchanged;
* otherwise it is the first run with its ``bench`` stage rebuilt: per shape, the fused
  time, wall time, host time and every baseline's time are medians over the runs
  (:func:`statistics.median`; the mean of the middle two for an even N), ratios and bars
  are recomputed from those medians (:func:`~coda_agent.verifier.stages.bench.shape_metrics`),
  and the shape keeps ``runs``: each run's fused ms, start time and paired
  fused/baseline ratios (fused and baseline measured in the same run), so the page can
  show the spread. Each baseline's time is the median of the runs in which it ran.

Merging shapes (:func:`merge_shapes`): ``bench --shape`` measures some of a kernel's
shapes (e.g. a ``--repeat 3`` at the shapes that decide a target). Replacing the kernel's
kept verdict with that one would silently drop every other shape's numbers, so the kept
verdict and the new one are merged instead: every shape of either stays, and every shape
carries ``measured_at`` (when its run started) and ``worker_sandbox`` (its worker's
confinement) so the page says which rows come from which ``bench`` call. A shape's fused time and its
baselines always come from one run (or are medians over one ``--repeat``); rows from
different calls are never mixed within a shape. Merging only happens between passing
verdicts of the same candidate measured on the same GPU and software versions, and for a
shape both measured the later measurement wins (so folding in an older copy never
replaces newer medians). Anything else (a failure, a new kernel, a new driver) replaces
the kept verdict when it is newer, as it is news, and is left out when it is older; the
caller says which (:func:`~coda_agent.verifier.library.bench.keep_verdict`).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..spec import LoadedSpec
from ..stages.bench import shape_metrics, stage_from_shapes
from ..verdict import Finding, StageResult, Verdict


def combine(loaded: LoadedSpec, runs: list[Verdict]) -> Verdict:
    """One verdict from ``runs`` (verdicts of the same kernel, in run order), as the module
    docstring says. Raises ValueError for an empty list or runs of different candidates."""
    if not runs:
        raise ValueError("combine: no runs")
    if len({(v.spec, v.candidate_hash) for v in runs}) != 1:
        raise ValueError("combine: the runs are not of one candidate for one spec")
    failed = next((v for v in runs if not v.gpu_verified), None)
    if failed is not None or len(runs) == 1:
        return failed or runs[0]
    per_run = [_bench(v).metrics.get("shapes") or {} for v in runs]
    gpu = _bench(runs[0]).metrics.get("gpu")
    shapes: dict[str, Any] = {}
    findings: list[Finding] = []
    for name, first in per_run[0].items():
        ms = [r[name] for r in per_run if name in r]
        med = {k: statistics.median(float(m.get(k) or 0.0) for m in ms) for k in ("fused_ms", "wall_ms", "host_ms")}
        bases: dict[str, dict[str, Any]] = {}
        for b in first.get("baselines", {}):
            times = [m["baselines"][b]["ms"] for m in ms if "ms" in m.get("baselines", {}).get(b, {})]
            bases[b] = {"ms": statistics.median(times)} if times else dict(first["baselines"][b])
        m, problems = shape_metrics(
            loaded, first["dims"], med["fused_ms"], med["wall_ms"], bases, gpu, host_ms=med["host_ms"]
        )
        guards = [float(x["guard_host_ms"]) for x in ms if x.get("guard_host_ms") is not None]
        m.update(
            n_sets=first.get("n_sets"),
            guard_host_ms=statistics.median(guards) if guards else None,
            wall_samples_ms=first.get("wall_samples_ms"),
        )
        m["measured_at"] = runs[0].started_at
        m["runs"] = {
            "started_at": [v.started_at for v, r in zip(runs, per_run, strict=False) if name in r],
            "fused_ms": [x["fused_ms"] for x in ms],
            "ratios": {
                b: [x["baselines"][b]["ratio"] for x in ms if "ratio" in x.get("baselines", {}).get(b, {})]
                for b in first.get("baselines", {})
            },
        }
        shapes[name] = m
        findings += [
            Finding(kind=k, message=f"[{name}] {msg} (medians of {len(ms)} runs)", case=name) for k, msg in problems
        ]
    stage = stage_from_shapes(loaded, shapes, findings, gpu, sum(_bench(v).duration_s for v in runs))
    stage.metrics["repeats"] = len(runs)
    stage.summary = f"median of {len(runs)} runs: {stage.summary}"
    out = runs[0].model_copy(deep=True)
    out.stages = [stage if s.stage == "bench" else s for s in out.stages]
    out.wall_s = sum(v.wall_s for v in runs)
    return out


VERSION_FIELDS = ("gpu", "driver", "cuda", "torch", "cutlass_dsl", "quack")
"""Environment fields that must agree for two verdicts' shapes to share one table."""


def stamp_shapes(v: Verdict) -> Verdict:
    """``v`` with ``measured_at`` (its run's start time) and ``worker_sandbox`` (how its
    candidate worker was confined) on every bench shape that lacks them (changed in place
    and returned; a verdict without a bench stage is returned as is)."""
    for m in shapes_of(v).values():
        m.setdefault("measured_at", v.started_at)
        m.setdefault("worker_sandbox", v.environment.worker_sandbox)
    return v


def _bench(v: Verdict) -> StageResult:
    """The bench stage of a GPU-verified ``v`` (which always has one)."""
    b = v.stage("bench")
    assert b is not None
    return b


def shapes_of(v: Verdict) -> dict[str, Any]:
    """The per-shape metrics of ``v``'s bench stage ({} without one)."""
    b = v.stage("bench")
    return (b.metrics.get("shapes") if b else None) or {}


def runs_of(m: dict[str, Any]) -> int:
    """How many runs one shape's numbers are the median of (1 for a single run)."""
    return len((m.get("runs") or {}).get("fused_ms") or []) or 1


def why_not_mergeable(kept: Verdict, new: Verdict) -> str | None:
    """Why ``new``'s shapes may not share a table with ``kept``'s (see the module docstring),
    or None when they may: both GPU-verified, same spec (and spec file) and candidate, same
    GPU and software versions."""
    for label, v in (("kept", kept), ("new", new)):
        if not v.gpu_verified:
            bad = v.failed_stage
            return (
                f"the {label} verdict failed its {bad.stage} stage ({bad.summary})"
                if bad is not None
                else f"the {label} verdict is not GPU-verified"
            )
    for field in ("spec", "spec_hash", "candidate_hash"):
        if getattr(kept, field) != getattr(new, field):
            return f"{field} differs"
    for field in VERSION_FIELDS:
        a, b = getattr(kept.environment, field), getattr(new.environment, field)
        if a != b:
            return f"environment.{field} differs ({a} kept, {b} new)"
    return None


def merge_shapes(loaded: LoadedSpec, kept: Verdict, new: Verdict) -> Verdict:
    """One verdict holding every bench shape of ``kept`` and ``new`` (module docstring):
    for a shape both measured, the later measurement (``measured_at``); the stage's bars,
    means, rows and summary rebuilt over all shapes, the rest of the verdict from the later
    of the two. Raises ValueError when :func:`why_not_mergeable` gives a reason. Returns
    ``new`` itself when it measured every kept shape later. Every shape of the result has
    ``measured_at`` and ``worker_sandbox``."""
    why = why_not_mergeable(kept, new)
    if why:
        raise ValueError(f"cannot merge {new.spec}: {why}")
    stamp_shapes(kept)
    stamp_shapes(new)
    old_shapes, new_shapes = shapes_of(kept), shapes_of(new)
    order = [bs.name for bs in loaded.spec.shapes.benchmark]
    names = sorted({*old_shapes, *new_shapes}, key=lambda s: (order.index(s) if s in order else len(order), s))
    picked = {
        s: "new"
        if s not in old_shapes or (s in new_shapes and new_shapes[s]["measured_at"] >= old_shapes[s]["measured_at"])
        else "kept"
        for s in names
    }
    if all(side == "new" for side in picked.values()):
        return new
    old_b, new_b = _bench(kept), _bench(new)
    shapes = {s: (new_shapes if picked[s] == "new" else old_shapes)[s] for s in names}
    findings = [
        *(f for f in new_b.findings if picked.get(f.case or "") != "kept"),
        *(f for f in old_b.findings if picked.get(f.case or "") == "kept"),
    ]
    base = new if new.started_at >= kept.started_at else kept
    stage = stage_from_shapes(
        loaded, shapes, findings, _bench(base).metrics.get("gpu"), new_b.duration_s + old_b.duration_s
    )
    repeats = max(new_b.metrics.get("repeats") or 1, old_b.metrics.get("repeats") or 1)
    if repeats > 1:
        stage.metrics["repeats"] = repeats
    calls = sorted({m["measured_at"] for m in shapes.values()})
    stage.summary = f"{len(shapes)} shape(s) from {len(calls)} bench call(s) ({', '.join(calls)}): {stage.summary}"
    out = base.model_copy(deep=True)
    out.stages = [stage if s.stage == "bench" else s for s in out.stages]
    return out

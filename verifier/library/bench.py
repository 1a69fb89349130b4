"""``coda-agent bench``: benchmark accepted kernels and keep the numbers in the repo.

Each accepted kernel goes through the full verifier again (correctness first: a number
for a wrong kernel is worthless), with the benchmark stage timing the fused kernel and
every baseline of its spec in the same run (torch eager, torch.compile, the bare GEMM,
quack's library equivalent), at the spec's 1B/8B/70B shapes, plus Liger Kernel
(baseline ``liger``) wherever the spec folder has a ``liger.py`` adapter (see
:mod:`~coda_agent.verifier.spec`; liger-kernel is the optional ``[bench]`` dependency:
without it the ``liger`` column reads "n/a" and the page says why).

Results are written to ``benchmarks/results/<date>-<gpu>.md`` (medians in ms, ratios
fused/baseline, TFLOP/s) and, when matplotlib is importable, a PNG of speedups
(baseline time / fused time, > 1 = the fused kernel is faster) beside it. Only GPU
runs write results: without a GPU the command reports that nothing was measured.

Each kernel's full verdict (every stage, the environment, all timings) is kept beside the
page in ``benchmarks/results/<date>-<gpu>/<kernel>.json``. The page is rendered from all
verdicts kept for that day and GPU, so a benchmark over every kernel can be split over
several calls (a GPU machine's per-command time limit) and still land on one page, and
``coda-agent regress --verdicts <that folder>`` judges regressions from the same
measurements instead of timing everything a second time. A call that measured only some
shapes (``--shape``) merges into the kernel's kept verdict shape by shape
(:func:`~coda_agent.verifier.library.repeats.merge_shapes`) instead of replacing it: no earlier
shape's numbers are dropped, and each table row says when it was measured.

Before the GPU stages, static and compile run for every kernel with several compiles at
once (:func:`~coda_agent.verifier.pipeline.cpu_stages_many`): the GPU does not idle
through eleven sequential compiles, and no timing overlaps a compile. The GPU stages then
run one kernel per visible GPU at once, each alone on its GPU (``verifier/schedule/``).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import progress
from ..confine.sandbox import in_parallel
from ..gpu import gemm_floor
from ..spec import LIGER_MISSING, NO_LIGER, LoadedSpec, load_spec
from ..stages.bench import HOST_BOUND, host_bound
from ..verdict import Verdict
from ..workspace import atomic_write_text
from .accept import accepted_names, read_manifest, verdict_from_manifest
from .kept import PAGE_MARK, check_page, day_verdicts, keep_verdict, slug, verdicts_dir
from .repeats import combine, runs_of, shapes_of


@dataclass
class BenchReport:
    """Verdicts by kernel name (this call's), the page's verdicts (this call's plus those
    kept from earlier calls the same day) and where the page was written."""

    verdicts: dict[str, Verdict] = field(default_factory=dict)
    page_verdicts: dict[str, Verdict] = field(default_factory=dict)
    markdown_path: Path | None = None
    plot_path: Path | None = None
    notes: list[str] = field(default_factory=list)
    """What happened to each kept verdict file (kept, merged, replaced, left out, skipped)."""
    schedule: str | None = None
    """Where the GPU stages ran (the scheduler's description), when this call measured."""

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and all(v.gpu_verified for v in self.verdicts.values())


def _ordered(shapes: dict[str, Any]) -> list[tuple[str, Any]]:
    """Smallest problem first (manifests store shapes with sorted keys, not in spec order)."""
    return sorted(shapes.items(), key=lambda kv: (kv[1].get("flops") or 0, kv[0]))


UNAVAILABLE = (NO_LIGER, LIGER_MISSING)
"""Baseline errors that mean "nothing to compare with here" (shown as n/a), not a failure."""


def _cell(r: dict[str, Any]) -> str:
    """A baseline's ms cell: the time, "error" for a baseline that failed, "n/a" when absent/unavailable."""
    if "ms" in r:
        return f"{r['ms']:.4f}"
    if "error" in r and r["error"] not in UNAVAILABLE:
        return "error"
    return "n/a"


def _sol_notes(shapes: dict[str, Any]) -> list[str]:
    """One line: what the sol_bound column is, and each shape's memory floor."""
    floors = [
        (shape, m["baselines"][SOL].get("floor_ms")) for shape, m in _ordered(shapes) if SOL in m.get("baselines", {})
    ]
    if not floors:
        return []
    shown = ", ".join(f"{shape} {f:.4f} ms" if f else f"{shape} unknown" for shape, f in floors)
    return [
        f"- {SOL} = max(bare_gemm ms, memory floor); the floor (bytes the kernel moves / peak DRAM bandwidth): {shown}."
    ]


def _baseline_notes(shapes: dict[str, Any], bases: list[str]) -> list[str]:
    """One line per baseline that did not run at some shape: its (first) reason."""
    notes = []
    for n in bases:
        errs = [(s, m.get("baselines", {}).get(n, {}).get("error")) for s, m in _ordered(shapes)]
        errs = [(s, e) for s, e in errs if e]
        if errs:
            where = "all shapes" if len(errs) == len(shapes) else ", ".join(s for s, _ in errs)
            first = " ".join(str(errs[0][1]).split())[:200]
            notes.append(f"- {n} did not run ({where}): {first}")
    return notes


def _host_notes(shapes: dict[str, Any], hb: list[str]) -> list[str]:
    """Host-bound shapes, and the verifier guard's own per-call host cost."""
    notes = []
    if hb:
        notes.append(
            f"- host-bound (host ms >= {HOST_BOUND:g} x fused ms): {', '.join(hb)}. There the fused "
            "time measures Python and launch latency as much as the GPU, and varies with the host "
            "from run to run; the baselines are timed in another process, without the verifier's "
            "per-call guard. `regress` does not gate on host-bound shapes."
        )
    guards = [m["guard_host_ms"] for m in shapes.values() if m.get("guard_host_ms")]
    if guards:
        notes.append(
            f"- the verifier's per-call guard (sync-debug mode, heap ballast) adds "
            f"{1e3 * sorted(guards)[len(guards) // 2]:.0f} us of host time to each timed fused call."
        )
    return notes


SPREAD_BASELINES = ("bare_gemm", "quack_library", "torch_compile")
"""Baselines whose run-to-run spread the page prints for repeated runs (the targets' ones)."""


def _run_count(v: Verdict) -> int:
    """How many ``bench`` runs a kept verdict's timings are medians of (1 unless ``--repeat``)."""
    return max((runs_of(m) for m in shapes_of(v).values()), default=1)


def _repeat_notes(shapes: dict[str, Any]) -> list[str]:
    """For shapes measured in several runs (``bench --repeat``): how many and when, per
    group of shapes that shared the runs, and the range of each run's paired
    fused/baseline ratio per shape, for the targets' baselines."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for shape, m in _ordered(shapes):
        if m.get("runs"):
            groups.setdefault(tuple(m["runs"]["started_at"]), []).append(shape)
    out = []
    for started, names in groups.items():
        which = "" if len(groups) == 1 and len(names) == len(shapes) else f" at {', '.join(names)}"
        out.append(
            f"- median of {len(started)} runs{which} (started {', '.join(started)}); the table's times "
            "are medians over the runs and its ratios are computed from them. Per-run fused/baseline "
            "ratio range:"
        )
        for shape in names:
            r = shapes[shape]["runs"]
            spans = [f"{b} {min(v):.3f}-{max(v):.3f}" for b in SPREAD_BASELINES if (v := r.get("ratios", {}).get(b))]
            if spans:
                out.append(f"  - {shape}: " + ", ".join(spans))
    return out


def _measured_line(v: Verdict, shapes: dict[str, Any]) -> str:
    """When the kernel's rows were measured and how its candidate worker was confined: one
    call, or each bench call when its shapes were merged from several
    (:func:`~coda_agent.verifier.library.repeats.merge_shapes`)."""
    calls: dict[str, list[str]] = {}
    boxes: dict[str, str] = {}
    for shape, m in _ordered(shapes):
        t = m.get("measured_at") or v.started_at
        calls.setdefault(t, []).append(shape)
        boxes.setdefault(t, m.get("worker_sandbox") or v.environment.worker_sandbox or "confinement not recorded")
    if len(calls) <= 1:
        return (
            f"Measured {v.started_at or 'at an unrecorded time'}; candidate worker: "
            f"{v.environment.worker_sandbox or 'confinement not recorded'}."
        )
    same = len(set(boxes.values())) == 1
    parts = [
        f"{t} ({', '.join(names)})" + ("" if same else f", candidate worker: {boxes[t]}")
        for t, names in sorted(calls.items())
    ]
    return (
        f"Measured in {len(calls)} bench calls: "
        + "; ".join(parts)
        + (f"; candidate worker: {next(iter(boxes.values()))}." if same else ".")
    )


def bench_baselines(loaded: LoadedSpec) -> list[str]:
    """The baselines ``coda-agent bench`` times for a spec: its ``bench.baselines``, plus
    ``liger`` when the spec folder has a ``liger.py`` adapter, plus ``quack_gemm`` (quack's
    own GEMM on the bare GEMM's operands, :mod:`~coda_agent.verifier.gpu.gemm_floor`) wherever
    ``bare_gemm`` is timed."""
    names: list[str] = list(loaded.spec.bench.baselines)
    if loaded.has_liger and "liger" not in names:
        names.append("liger")
    if "bare_gemm" in names and gemm_floor.NAME not in names:
        names.append(gemm_floor.NAME)
    return names


def results_markdown(
    verdicts: dict[str, Verdict],
    date: str,
    spec_shapes: dict[str, list[str]] | None = None,
    patterns: dict[str, str] | None = None,
) -> str:
    """The results page: the targets table, then one table per kernel. ``spec_shapes`` (kernel ->
    its spec's benchmark shape names) lets the targets table say when a kernel was measured
    at only some of its shapes; ``patterns`` (kernel -> its spec's ``pattern``) see
    :func:`targets_table`."""
    lines = [f"# coda-agent benchmark, {date}", ""]
    stacks: dict[str, list[str]] = {}
    for name, v in verdicts.items():
        e = v.environment
        stacks.setdefault(
            f"GPU: {e.gpu} (sm {e.compute_capability}), driver {e.driver}, CUDA {e.cuda}; "
            f"torch {e.torch}, nvidia-cutlass-dsl {e.cutlass_dsl}, quack-kernels {e.quack}",
            [],
        ).append(name)
    if len(stacks) == 1:
        lines += [f"{next(iter(stacks))}.", ""]
    elif stacks:
        lines += ["The kernels were measured on different GPUs or software versions:", ""]
        lines += [f"- {stack}: {', '.join(names)}" for stack, names in stacks.items()] + [""]
    lines += [
        'Median ms (triton.testing.do_bench, L2 flushed, inputs rotated); "host ms": host time until one',
        "fused call returned (its launches enqueued, the verifier's per-call guard included). It can exceed",
        "the fused time: do_bench's L2 flush before each call keeps the GPU busy while the host starts the",
        "call, so only the host time past the flush shows in the timed window. Every baseline measured in the",
        'same run as the fused kernel. ratio = fused / baseline (< 1: fused is faster); "error": the',
        'baseline failed, "n/a": no such baseline here (e.g. no Liger equivalent, or liger-kernel not',
        "installed). Baselines are compared by time only: their outputs are not checked.",
        "",
    ]
    lines += targets_table(verdicts, spec_shapes, patterns)
    for name, v in verdicts.items():
        b = v.stage("bench")
        shapes = page_shapes(v)
        lines.append(
            f"## {name}: {'verified' if v.gpu_verified else 'NOT verified: ' + (v.failed_stage.summary if v.failed_stage else 'no GPU')}"
        )
        if not shapes:
            lines.append("")
            continue
        lines += ["", _measured_line(v, shapes)]
        bases = sorted({n for m in shapes.values() for n in m.get("baselines", {})})
        lines.append("")
        lines.append("| shape | fused ms | host ms | TFLOP/s | " + " | ".join(f"{n} ms | ratio" for n in bases) + " |")
        lines.append("|" + "---|" * (4 + 2 * len(bases)))
        hb = []
        for shape, m in _ordered(shapes):
            host = m.get("host_ms")
            cells = [shape, f"{m['fused_ms']:.4f}", f"{host:.4f}" if host else "-", f"{m.get('tflops', 0):.0f}"]
            if host_bound(m):
                hb.append(shape)
            for n in bases:
                r = m.get("baselines", {}).get(n, {})
                cells += [_cell(r), f"{r['ratio']:.3f}" if "ratio" in r else "-"]
            lines.append("| " + " | ".join(cells) + " |")
        notes = _baseline_notes(shapes, bases) + _host_notes(shapes, hb) + _repeat_notes(shapes) + _sol_notes(shapes)
        if notes:
            lines += [""] + notes
        bars = _bar_lines(b.metrics.get("bar") if b else None)
        if bars:
            lines += [""] + bars
        lines.append("")
    return "\n".join(lines) + "\n"


TARGETS = {"bare_gemm": 1.05, "quack_library": 1.03, "speed_of_light": 1.05}
"""The catalogue's speed targets: forward kernels within 5 % of the bare GEMM, no kernel
more than 3 % slower than quack's library equivalent, and every kernel within 5 % of its
speed-of-light bound (:func:`sol_bound_ms`) at every shape that is not host-bound. Checked
at every shape (worst shape shown).

# Rationale: a backward kernel cannot beat its own GEMM, and a kernel whose epilogue moves
# more bytes than the GEMM's time covers cannot beat its memory floor; max(bare GEMM, floor)
# is the time no implementation of the same math and traffic undercuts. Speedups over
# torch.compile stay on the page, as information."""

SOL = "sol_bound"
"""The page's name for the speed-of-light bound, shown as one more baseline column."""


def sol_bound_ms(m: dict[str, Any], peak_bw: float | None) -> tuple[float, float | None] | None:
    """The speed-of-light bound of one benchmark shape, in ms: max(the bare GEMM's measured
    time, the kernel's own memory floor = bytes it must move / the GPU's peak DRAM bandwidth
    (bytes/s)); with the floor (ms, or None when ``bytes`` or ``peak_bw`` is unknown). None
    when neither is known. ``m`` is one shape's bench metrics (``fused_ms``, ``bytes``,
    ``baselines``)."""
    bare = (m.get("baselines", {}).get("bare_gemm") or {}).get("ms")
    floor = m["bytes"] / peak_bw * 1e3 if m.get("bytes") and peak_bw else None
    known = [x for x in (bare, floor) if x]
    return (max(known), floor) if known else None


def page_shapes(v: Verdict) -> dict[str, Any]:
    """``v``'s per-shape bench metrics as the page shows them: each shape with a
    :data:`SOL` pseudo-baseline (ms = :func:`sol_bound_ms`, ratio = fused / bound). The
    verdict itself is not changed."""
    b = v.stage("bench")
    peak_bw = b.metrics.get("peak_bw") if b else None
    out = {}
    for shape, m in shapes_of(v).items():
        bound = sol_bound_ms(m, peak_bw) if m.get("fused_ms") else None
        if bound is None:
            out[shape] = m
            continue
        sol = {"ms": bound[0], "ratio": m["fused_ms"] / bound[0], "floor_ms": bound[1]}
        out[shape] = {**m, "baselines": {**m.get("baselines", {}), SOL: sol}}
    return out


def _worst(shapes: dict[str, Any], base: str) -> tuple[float, str] | None:
    got = [
        (m["baselines"][base]["ratio"], s)
        for s, m in shapes.items()
        if m.get("baselines", {}).get(base, {}).get("ratio")
    ]
    return max(got) if got else None


def _at(worst: tuple[float, str] | None, shapes: dict[str, Any], speedup: bool = False) -> str:
    """A Targets cell: the value and its shape, marked when that shape is host-bound. The
    value is rounded to 3 decimals away from meeting its target (a ratio up, a speedup
    down), so a cell never reads as on the target when it misses it (1.2998x is 1.299x)."""
    if worst is None:
        return "-"
    mark = ", host-bound" if host_bound(shapes.get(worst[1]) or {}) else ""
    scaled = worst[0] * 1000
    shown = (math.floor(scaled + 1e-9) if speedup else math.ceil(scaled - 1e-9)) / 1000
    return f"{shown:.3f}{'x' if speedup else ''} ({worst[1]}{mark})"


def _target_bars(bwd: bool) -> dict[str, tuple[str, float]]:
    """Per baseline that a target judges: (the :data:`TARGETS` key, the largest
    fused/baseline ratio that meets it), in the order the page names missed targets. The
    speed-of-light target is judged at shapes that are not host-bound only (:func:`_judged_at`)."""
    bars = {} if bwd else {"bare_gemm": ("bare_gemm", TARGETS["bare_gemm"])}
    bars["quack_library"] = ("quack_library", TARGETS["quack_library"])
    bars[SOL] = ("speed_of_light", TARGETS["speed_of_light"])
    return bars


def _judged_at(base: str, m: dict[str, Any]) -> bool:
    return base != SOL or not host_bound(m)


def _missed(shapes: dict[str, Any], bwd: bool) -> list[str] | None:
    """The targets (:data:`TARGETS` keys) ``shapes`` miss at their worst shape; None when no
    target applies (no baseline of one was timed)."""
    judged, missed = False, []
    for base, (target, bar) in _target_bars(bwd).items():
        worst = _worst({s: m for s, m in shapes.items() if _judged_at(base, m)}, base)
        if worst:
            judged = True
            if worst[0] > bar:
                missed.append(target)
    return missed if judged else None


def _lowest_8b_speedup(shapes: dict[str, Any]) -> tuple[float, str] | None:
    sp = [
        (1 / m["baselines"]["torch_compile"]["ratio"], s)
        for s, m in shapes.items()
        if "8b" in s and m.get("baselines", {}).get("torch_compile", {}).get("ratio")
    ]
    return min(sp) if sp else None


def _crossings(shapes: dict[str, Any], bwd: bool) -> list[str]:
    """For a ``bench --repeat`` verdict: the (shape, baseline) pairs whose per-run ratios
    fall on both sides of a target (the median's verdict could have gone either way)."""
    out = []
    for shape, m in _ordered(shapes):
        for base, (_, bar) in _target_bars(bwd).items():
            v = ((m.get("runs") or {}).get("ratios") or {}).get(base) or []
            if _judged_at(base, m) and v and min(v) <= bar < max(v):
                out.append(f"{base} at {shape} ({min(v):.3f}-{max(v):.3f})")
    return out


def _met_cell(missed: list[str] | None) -> str:
    return "-" if missed is None else "yes" if not missed else "no: " + ", ".join(missed)


def targets_table(
    verdicts: dict[str, Verdict],
    spec_shapes: dict[str, list[str]] | None = None,
    patterns: dict[str, str] | None = None,
) -> list[str]:
    """The summary at the top of the page: each kernel against :data:`TARGETS`, at every
    shape and again without its host-bound shapes; a ``--repeat`` verdict whose per-run
    ratios straddle a target is marked borderline, and (given ``spec_shapes``) a kernel
    measured at only some of its spec's benchmark shapes is judged "at N of M shapes".
    A kernel is judged as backward when its spec's ``pattern`` (``patterns``) says so; a
    kernel missing from ``patterns`` when its name ends in ``_bwd``."""
    rows = []
    for name, v in verdicts.items():
        shapes = page_shapes(v)
        if not shapes:
            continue
        bwd = (patterns or {}).get(name, "backward" if name.endswith("_bwd") else "forward") == "backward"
        cells = [name, "backward" if bwd else "forward"]
        bare, quack = _worst(shapes, "bare_gemm"), _worst(shapes, "quack_library")
        cells.append(_at(bare, shapes))
        cells.append(_at(quack, shapes))
        cells.append(_at(_worst({s: m for s, m in shapes.items() if not host_bound(m)}, SOL), shapes))
        cells.append(_at(_lowest_8b_speedup(shapes), shapes, speedup=True))
        floor = _worst(shapes, gemm_floor.NAME)
        cells.append(_at(floor, shapes))
        at = shapes[bare[1]].get("baselines", {}) if bare else {}
        q_ms, b_ms = at.get(gemm_floor.NAME, {}).get("ms"), at.get("bare_gemm", {}).get("ms")
        cells.append(f"{q_ms / b_ms:.3f}" if q_ms and b_ms else "-")
        met = _met_cell(_missed(shapes, bwd))
        cross = _crossings(shapes, bwd)
        want = (spec_shapes or {}).get(name)
        part = f" at the {len(shapes)} of {len(want)} shapes measured here" if want and set(want) - set(shapes) else ""
        bad = v.failed_stage
        if bad is not None:  # numbers of a failing run judge nothing
            met, part, cross = f"NOT verified ({bad.stage}): numbers not judged", "", []
        cells.append(met + part + (f" (borderline: runs straddle {'; '.join(cross)})" if cross else ""))
        device_bound = {s: m for s, m in shapes.items() if not host_bound(m)}
        cells.append(
            "no host-bound shape"
            if len(device_bound) == len(shapes)
            else _met_cell(_missed(device_bound, bwd))
            if device_bound
            else "all host-bound"
        )
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "## Targets",
        "",
        f"The catalogue's targets: forward kernels within {TARGETS['bare_gemm'] - 1:.0%} of the bare GEMM "
        f"(fused/bare_gemm <= {TARGETS['bare_gemm']:g}), no kernel more than "
        f"{TARGETS['quack_library'] - 1:.0%} slower than quack's library equivalent "
        f"(fused/quack_library <= {TARGETS['quack_library']:g}), and every kernel within "
        f"{TARGETS['speed_of_light'] - 1:.0%} of its speed-of-light bound at every shape that is not host-bound "
        f"(fused/{SOL} <= {TARGETS['speed_of_light']:g}; {SOL} = max(bare GEMM ms, the kernel's memory floor), "
        "the floor = the bytes the kernel must move / the GPU's peak DRAM bandwidth). Each cell is the "
        "worst shape (for backward kernels the bare-GEMM column is informative: the fused kernel "
        "also does the epilogue's memory traffic; the speedup over torch.compile is informative for "
        "every kernel). The per-spec bars under each kernel are the specs' "
        "own, reported and not enforced. A cell marked host-bound comes from a shape where one call's host "
        f"time is at least {HOST_BOUND:g}x its device time (see the kernel's notes): that number measures the "
        "host as much as the kernel.",
        "",
        "`quack_gemm` (informative, not a target) is quack's own GEMM with the identity epilogue "
        "(default config) on the bare GEMM's operands: fused/quack_gemm is what the epilogue costs on "
        "the quack mainloop every kernel is built on, and quack_gemm/bare_gemm is how that mainloop "
        "compares with cuBLAS at the shape. A fused/bare_gemm miss whose quack_gemm/bare_gemm is as "
        "large is the mainloop's, not the epilogue's.",
        "",
        f"| kernel | direction | worst fused/bare_gemm | worst fused/quack_library | worst fused/{SOL} "
        "(not host-bound) | lowest speedup vs torch.compile at 8B "
        "| worst fused/quack_gemm | quack_gemm/bare_gemm at the worst fused/bare_gemm shape | targets met "
        "| targets met without host-bound shapes |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        '"targets met" judges every shape and names the targets missed; the last column judges again '
        "without the host-bound shapes (informative: at those shapes a call's host time, mostly Python and "
        "launches, is as large as its GPU time, so the number depends on the host as much as on the kernel). "
        'For kernels measured with `bench --repeat`, "borderline" names each shape and baseline whose '
        "per-run ratios fall on both sides of a target. Values are rounded to 3 decimals away from "
        "the target (ratios up, speedups down).",
        "",
        "Plot (same folder, `.png`): speedup = baseline ms / fused ms per shape, > 1 means the fused "
        "kernel is faster (the inverse of the tables' ratio).",
        "",
    ]


def _bar_lines(bar: dict[str, Any] | None) -> list[str]:
    """The spec's speed bars (fused/baseline <= limit) as reported; bars are not gating."""
    out = []
    for name, r in sorted((bar or {}).items()):
        if r.get("met") is None:
            continue
        verdict = "met" if r["met"] else "MISSED"
        out.append(f"Bar fused/{name} <= {r['limit']:g}: {verdict} (met at {r['met_shapes']} of {r['shapes']} shapes).")
    if out:
        out.append("(Bars are reported, not enforced: a kernel that is correct is accepted even when it misses one.)")
    return out


def plot_speedups(verdicts: dict[str, Verdict], path: Path) -> bool:
    """Speedups (baseline_ms / fused_ms, > 1 = the fused kernel is faster) as a grid of bar
    charts, one panel per kernel (x: benchmark shape, one bar per baseline, same colour per
    baseline across panels). False when matplotlib is missing or nothing was measured."""
    try:
        import matplotlib  # pyright: ignore[reportMissingImports]  (optional extra `bench`)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pyright: ignore[reportMissingImports]  (optional extra `bench`)
    except ImportError:
        return False
    panels: list[tuple[str, list[tuple[str, dict[str, float]]]]] = []
    for name, v in verdicts.items():
        rows = [
            (shape, {n: r["ms"] / m["fused_ms"] for n, r in m.get("baselines", {}).items() if r.get("ms")})
            for shape, m in _ordered(shapes_of(v))
            if m.get("fused_ms")
        ]
        if rows:
            panels.append((name, rows))
    if not panels:
        return False
    bases = sorted({n for _, rows in panels for _, sp in rows for n in sp})
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(bases)}
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    width = 0.8 / max(1, len(bases))
    for ax, (name, rows) in zip(axes.flat, panels, strict=False):
        for i, n in enumerate(bases):
            xs = [j + i * width for j in range(len(rows))]
            ax.bar(xs, [sp.get(n, 0.0) for _, sp in rows], width, color=colors[n], label=n)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
        ax.set_xticklabels([s.replace("llama3-", "") for s, _ in rows], rotation=30, ha="right", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("baseline ms / fused ms", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in bases]
    fig.suptitle("fused kernel speedup over each baseline (> 1: fused is faster)", fontsize=10, y=0.995)
    fig.legend(
        handles,
        bases,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.985 - 0.01 * nrows),
        ncol=len(bases),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95 - 0.005 * nrows))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _write_results(
    rep: BenchReport,
    out_dir: Path,
    date: str,
    note: str = "",
    suffix: str = "",
    stem: str | None = None,
    spec_shapes: dict[str, list[str]] | None = None,
    mark: str = "",
    patterns: dict[str, str] | None = None,
) -> None:
    """Write ``<out_dir>/<stem>.md`` (+ ``.png``); ``stem`` defaults to ``<date>-<gpu><suffix>``;
    ``mark`` is appended as the page's last line."""
    env = next(iter(rep.verdicts.values())).environment
    stem = stem or f"{date}-{slug(env.gpu or 'cpu')}{suffix}"
    rep.markdown_path = out_dir / f"{stem}.md"
    text = results_markdown(rep.verdicts, date, spec_shapes, patterns)
    if note:
        title, rest = text.split("\n", 1)
        text = f"{title}\n\n{note}\n{rest}"
    if mark:
        text += f"\n{mark}\n"
    atomic_write_text(rep.markdown_path, text)
    png = out_dir / f"{stem}.png"
    if plot_speedups(rep.verdicts, png):
        rep.plot_path = png


def _ran_on_gpu(v: Verdict) -> bool:
    """The GPU stages ran (pass or fail): a number worth keeping, even a failing one."""
    st = v.stage("correctness")
    return not v.cpu_only and bool(v.environment.gpu) and st is not None and st.status != "skip"


def default_jobs() -> int:
    """Compile stages run at once by ``bench``: half the CPU cores, at most 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


MANIFESTS_PAGE_MARK = (
    "<!-- written by coda-agent bench --all --from-manifests from the accepted kernels' "
    "manifests; rewritten by it, so edits here are lost -->"
)
"""Last line of the page ``bench --from-manifests`` writes (see :func:`bench_kernels`)."""


def bench_kernels(
    root: Path,
    names: list[str] | None,
    *,
    out_dir: Path | None = None,
    verify_fn=None,
    bench_shapes: list[Any] | None = None,
    from_manifests: bool = False,
    jobs: int | None = None,
    repeat: int = 1,
    force: bool = False,
    scheduler: Any = None,
) -> BenchReport:
    """Benchmark the accepted kernels ``names`` (all when None). Raises ValueError for unknown names.

    Static and compile run first for every kernel (``jobs`` compiles at once, default
    :func:`default_jobs`), then the kernels' GPU stages through the scheduler
    (``verifier/schedule/``): one kernel per visible GPU at once, each alone on its GPU,
    so no timing shares a GPU or overlaps a compile (``BenchReport.schedule`` says where;
    ``scheduler``: a :class:`~coda_agent.verifier.schedule.Scheduler` to use instead of
    every visible GPU). Each kernel's verdict that ran on the GPU is kept as
    ``<out>/<date>-<gpu>/<kernel>.json`` (atomic; a re-run replaces that kernel's file),
    and the page ``<out>/<date>-<gpu>.md`` (+ ``.png``) is written from every verdict kept
    for that day and GPU: kernels benchmarked by several ``bench`` calls (e.g. split to
    fit a machine's time limit) land on one page; within a kernel, the fused kernel and
    its baselines always come from one run. A kept verdict whose kernel has since been
    replaced is left off the page (the page says so).

    ``repeat=N`` verifies every kernel N times, round-robin over the kernels, and keeps one
    verdict per kernel with per-shape medians over the runs and each run's numbers
    (:mod:`~coda_agent.verifier.library.repeats`). Raises ValueError when ``repeat`` < 1.

    ``from_manifests=True`` measures nothing: it writes ``<date>-<gpu>-manifests.md`` (its
    own name: it never replaces a measured page) from the numbers each kernel's acceptance
    run recorded (each kernel's baselines were measured in its own acceptance run; the
    page says so), e.g. to publish them without a GPU at hand. Like every page ``bench``
    writes, it ends with a marker line (:data:`MANIFESTS_PAGE_MARK`), and an existing page of
    that name without it (e.g. a hand-written record) is never replaced unless ``force``
    (ValueError).
    """
    if repeat < 1:
        raise ValueError(f"bench --repeat {repeat}: expected an integer >= 1")
    names = accepted_names(root, names)
    out_dir = out_dir or (root / "benchmarks" / "results")
    rep = BenchReport()
    if from_manifests:
        dates = set()
        patterns = {}
        for n in names:
            man = read_manifest(root / "generated_kernels" / n / "manifest.json")
            rep.verdicts[n] = verdict_from_manifest(man)
            dates.add(str(man.get("accepted_at", ""))[:10])
            if man.get("pattern"):  # else targets_table falls back to the name
                patterns[n] = str(man["pattern"])
        note = (
            "Numbers recorded by each kernel's acceptance run (manifest.json), not re-measured: "
            "within a kernel, the fused kernel and its baselines come from the same run."
        )
        date = max(dates) or _dt.date.today().isoformat()
        gpu = next(iter(rep.verdicts.values())).environment.gpu if rep.verdicts else None
        target = Path(out_dir) / f"{date}-{slug(gpu or 'cpu')}-manifests.md"
        if target.is_file() and not force and MANIFESTS_PAGE_MARK not in target.read_text(errors="replace"):
            raise ValueError(
                f"{target}: exists and was not written by `coda-agent bench --from-manifests` (no "
                "marker line at its end, e.g. a hand-written record); nothing was changed. Move it, or "
                "pass --force to replace it"
            )
        _write_results(rep, out_dir, date, note, suffix="-manifests", mark=MANIFESTS_PAGE_MARK, patterns=patterns)
        return rep
    items = [(load_spec(root / "kernel_specs" / n), root / "generated_kernels" / n / "kernel.py") for n in names]
    extra: dict[str, dict[str, Any]] = {}
    gpus = 1
    if verify_fn is None:
        from ..pipeline import cpu_stages_many
        from ..schedule import make_scheduler

        done = cpu_stages_many(items, jobs=jobs or default_jobs())
        extra = {ld.name: {"cpu_done": c} for (ld, _), c in zip(items, done, strict=False)}
        sched = scheduler or make_scheduler(screen=False)  # each kernel timed alone on its GPU, one per GPU
        verify_fn, gpus, rep.schedule = sched.verify_fn, sched.parallel, sched.describe()
    date = _dt.date.today().isoformat()
    vdir = None
    runs: dict[str, list[Verdict]] = {name: [] for name in (ld.name for ld, _ in items)}

    def one(r: int, i: int) -> Verdict:
        loaded, kernel = items[i]
        progress.item(r * len(items) + i + 1, repeat * len(items), loaded.name)
        return verify_fn(
            loaded, kernel, bench_shapes=bench_shapes, baselines=bench_baselines(loaded), **extra.get(loaded.name, {})
        )

    for r in range(repeat):  # round-robin: drift over the runs spreads over every kernel
        for (loaded, _), v in zip(items, in_parallel(lambda i, r=r: one(r, i), len(items), gpus), strict=True):
            runs[loaded.name].append(v)
    for loaded, _ in items:
        v = combine(loaded, runs[loaded.name])
        rep.verdicts[loaded.name] = v
        if _ran_on_gpu(v):
            assert v.environment.gpu is not None  # _ran_on_gpu: it names a GPU
            vdir = verdicts_dir(out_dir, date, v.environment.gpu)
            rep.notes.append(keep_verdict(vdir, loaded, v)[1])
    if vdir is not None:
        try:
            page_from_kept(root, vdir, rep)
        except ValueError as e:  # the verdicts are kept: a re-render with --force writes the page
            rep.notes.append(f"page not written: {e}")
    return rep


def page_from_kept(
    root: Path, vdir: Path, rep: BenchReport | None = None, out_dir: Path | None = None, force: bool = False
) -> BenchReport:
    """(Re)write the page ``<vdir name>.md`` (+ ``.png``) in ``out_dir`` (default: beside
    ``vdir``) from the verdicts kept in ``vdir``.

    Measures nothing. Used by every live ``bench`` call, and by ``bench --from-verdicts``
    after the library changed under a kept folder (e.g. a regenerated kernel put back:
    its verdict is then left off, with a note, until benchmarked again). The date is
    the folder's (``<date>-<gpu>``). Raises ValueError when ``vdir`` is not a folder, and
    when the page exists but ``bench`` did not write it (no :data:`PAGE_MARK`; ``force``
    replaces it). ``rep.notes`` gets a line per kept file left off the page."""
    rep = rep or BenchReport()
    vdir = Path(vdir)
    if not vdir.is_dir():
        raise ValueError(f"{vdir}: not a folder of kept verdicts (expected benchmarks/results/<date>-<gpu>/)")
    page, notes = day_verdicts(root, vdir)
    if any(b is not None and b.status == "pass" for b in (v.stage("bench") for v in page.values())):
        rep.page_verdicts = page
        repeated = sorted(n for n, v in page.items() if _run_count(v) > 1)
        merged = sorted(n for n, v in page.items() if len({m.get("measured_at") for m in shapes_of(v).values()}) > 1)
        note = (
            f"Collected from the verdicts kept in `{vdir.name}/` ({len(page)} kernel(s)). Within a shape, the "
            "fused kernel and its baselines always come from one run"
            + (
                f", or are per-shape medians over the runs of one `bench --repeat` ({', '.join(repeated)}: "
                "the count and each run's ratio range are in the kernel's notes)"
                if repeated
                else ""
            )
            + "."
            + (
                f' Kernels whose rows come from more than one bench call (each kernel\'s "Measured" line '
                f"says which): {', '.join(merged)}."
                if merged
                else ""
            )
        )
        if notes:
            note += "\n\n" + "\n".join(notes)
        out = BenchReport(verdicts=page)
        # named after the folder: a kept folder such as <date>-<gpu>-repeat/ gets its own page
        target = check_page(vdir, out_dir, force)
        specs = {n: load_spec(root / "kernel_specs" / n).spec for n in page}
        spec_shapes = {n: [bs.name for bs in sp.shapes.benchmark] for n, sp in specs.items()}
        date = vdir.name[:10] if re.fullmatch(r"\d{4}-\d{2}-\d{2}", vdir.name[:10]) else vdir.name
        _write_results(
            out,
            target.parent,
            date,
            note,
            stem=vdir.name,
            spec_shapes=spec_shapes,
            mark=PAGE_MARK.format(folder=vdir.name),
            patterns={n: sp.pattern for n, sp in specs.items()},
        )
        rep.markdown_path, rep.plot_path = out.markdown_path, out.plot_path
    rep.notes += [n.removeprefix("- ") for n in notes]
    return rep

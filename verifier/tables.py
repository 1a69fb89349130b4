"""Verdicts, benchmark rows, the catalogue and regression reports as rich tables, for a
person at a terminal (the CLI prints them; :mod:`~coda_agent.verifier.feedback` renders
verdicts for the model instead). Nothing here judges: every table shows what its object
already says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def status_style(status: str) -> str:
    """The colour of a stage or row status."""
    return {"pass": "green", "fail": "red", "error": "red", "skip": "yellow"}.get(status, "white")


def print_verdict(console: Console, verdict: Any, recorded: bool = False) -> None:
    """One row per stage: status, summary, time; then the findings of failed stages, and
    the notes of passing ones (e.g. ``tuned-default``: a mod called without
    ``tuned=False``, which would autotune on a GPU; a missed bar is in the summary).
    ``recorded``: the verdict was read back (a manifest), not produced now."""
    t = Table(title=f"verdict: {verdict.spec}  (candidate {verdict.candidate_hash[:12]})")
    t.add_column("stage")
    t.add_column("status")
    t.add_column("summary", overflow="fold")
    t.add_column("s", justify="right")
    for s in verdict.stages:
        t.add_row(s.stage, f"[{status_style(s.status)}]{s.status}[/]", escape(s.summary), f"{s.duration_s:.1f}")
    console.print(t)
    env = verdict.environment
    where = f"GPU: {env.gpu} (sm {env.compute_capability})" if env.gpu else "no GPU (CPU-only)"
    console.print(escape(f"{where}; torch {env.torch}, cutlass-dsl {env.cutlass_dsl}, quack {env.quack}"))
    for s in verdict.stages:
        if s.status not in ("fail", "error", "pass"):
            continue
        lines = []  # the same finding from two shape cases is printed once
        for f in s.findings:
            if s.status == "pass" and f.kind == "bar-missed":
                continue
            line = f"[{f.kind}]" + (f" line {f.line}" if f.line else "") + f": {f.message}"
            if line not in lines:
                lines.append(line)
        tag = f"[red]{s.stage}[/] " if s.status != "pass" else f"[yellow]{s.stage} note[/] "
        for line in lines[: 20 if s.status != "pass" else 10]:
            console.print("  " + tag + escape(line))
    if verdict.stage("bench") and verdict.stage("bench").metrics.get("rows"):
        print_bench_rows(console, verdict.stage("bench").metrics["rows"])
    if verdict.gpu_verified:
        console.print(
            f"[green]verified on the GPU[/] at acceptance ({escape(verdict.started_at or 'time not recorded')}); "
            "numbers from its manifest, nothing measured now"
            if recorded
            else "[green]verified on the GPU[/]"
        )
    elif verdict.gpu_correct:
        b = verdict.stage("bench")
        why = escape(b.summary) if b is not None else "no benchmark stage"
        console.print(f"[yellow]correct on the GPU, but not verified for speed ({why}), so it cannot be accepted[/]")
    elif verdict.passed:
        console.print("[yellow]passed the stages that ran, but NOT verified on a GPU[/]")


def verdicts_table(rows: list[tuple[str, Any]], where: str) -> Table:
    """``verify SPEC FILE FILE ...``: one row per ``(file, verdict)``: outcome, the stage that
    failed (or the fused time of a verified one), its summary, where the GPU stages ran;
    ``where``: the scheduler's one-line description (the title)."""
    t = Table(title=escape(f"verdicts ({where})"))
    for c in ("file", "outcome", "stage", "summary", "GPU stages ran on"):
        t.add_column(c, overflow="fold")
    style = {"gpu-verified": "green", "gpu-correct": "green", "cpu-checks-passed": "yellow"}
    for name, v in rows:
        failed = v.failed_stage
        stage = failed.stage if failed is not None else "-"
        summary = failed.summary if failed is not None else (v.stage("bench").summary if v.stage("bench") else "")
        t.add_row(
            escape(name),
            f"[{style.get(v.outcome, 'red')}]{v.outcome}[/]",
            stage,
            escape(summary or ""),
            escape(v.environment.placement or "-"),
        )
    return t


def print_bench_rows(console: Console, rows: list[dict]) -> None:
    """Benchmark rows as written by verifier.bench (median ms, ratios fused/baseline)."""
    if not rows:
        return
    baselines = sorted({b for r in rows for b in r.get("baselines_ms", {})})
    t = Table(title="benchmark (median ms; ratio = fused / baseline, < 1 is faster)")
    t.add_column("shape")
    t.add_column("fused ms", justify="right")
    t.add_column("TFLOP/s", justify="right")
    for b in baselines:
        t.add_column(f"{b} ms", justify="right")
        t.add_column("ratio", justify="right")
    for r in rows:
        cells = [r.get("shape", "?"), f"{r.get('fused_ms', float('nan')):.3f}", f"{r.get('tflops', 0):.0f}"]
        for b in baselines:
            ms = r.get("baselines_ms", {}).get(b)
            ratio = r.get("ratios", {}).get(b)
            cells += [f"{ms:.3f}" if ms else "-", f"{ratio:.3f}" if ratio else "-"]
        t.add_row(*cells)
    console.print(t)


def catalogue_table(root: Path, rows: list[Any]) -> Table:
    """``coda-agent list``: one row per spec or accepted kernel
    (:func:`~coda_agent.verifier.library.catalogue.catalogue`)."""
    t = Table(title=f"coda-agent workspace: {root}")
    for c in ("spec", "pattern", "entry", "accepted kernel", "GPU verified", "changed since acceptance"):
        t.add_column(c)
    for r in rows:
        if r.status == "no-spec-file":
            t.add_row(r.name, "-", "-", "[yellow]no spec.toml[/]", "-", escape(r.detail))
        elif r.status == "invalid":
            lines = [ln.strip() for ln in r.detail.splitlines() if ln.strip()]
            t.add_row(r.name, "[red]invalid[/]", escape(" ".join(lines[:3])), "", "", "")
        elif r.status == "unreadable-manifest":
            t.add_row(r.name, r.pattern, r.entry, "[red]unreadable manifest[/]", "-", escape(r.detail)[:120])
        elif r.status == "accepted":
            changed = f"[red]yes ({', '.join(r.changed)}): re-verify[/]" if r.changed else "no"
            t.add_row(r.name, r.pattern, r.entry, f"yes ({r.accepted_at})", r.gpu, changed)
        elif r.status == "not-accepted":
            t.add_row(r.name, r.pattern, r.entry, "[yellow]not yet[/]", "-", "-")
        else:  # spec-missing
            t.add_row(
                r.name,
                "-",
                "-",
                "[red]accepted; spec missing[/]",
                "-",
                f"[red]kernel_specs/{escape(r.name)}/spec.toml is gone[/]",
            )
    return t


def regress_table(rep: Any, *, cpu_only: bool, verdicts: Path | None, tolerance: float) -> Table:
    """``coda-agent regress``: one row per kernel of a
    :class:`~coda_agent.verifier.library.regress.RegressReport`."""
    mode = (
        "CPU-only"
        if cpu_only
        else (f"GPU verdicts from {verdicts}, measured on {', '.join(rep.measured_on) or '?'}" if verdicts else "GPU")
    )
    gate = (
        "no speed gate (static + compile only)"
        if cpu_only
        else f"gate: fused/bare_gemm geomean <= +{tolerance:.0%}, any shape <= +{2 * tolerance:.0%}"
    )
    t = Table(title=escape(f"regression over generated_kernels/ ({mode}); {gate}"))
    for c in ("kernel", "status", "stage", "worst shape: ratio now / accepted", "message"):
        t.add_column(c, overflow="fold")
    for r in rep.rows:
        t.add_row(
            r.kernel, f"[{status_style(r.status)}]{r.status}[/]", r.stage, escape(r.ratio_text), escape(r.message)
        )
    return t

"""Render a :class:`~coda_agent.verifier.verdict.Verdict` as feedback for the repair prompt.

The LLM that wrote the candidate gets this text back when a stage fails (or passes with
warnings). It has to be short, concrete and actionable: which stage failed, every
finding with the candidate's own line quoted (``line 12: <code>``), and for numerical
findings the output, shape case and the numbers the stage put in its message (max error
vs allowed, where it is). The stages already write messages meant for this reader; this
module only orders, quotes and trims them.

Design
------
* **Deterministic**: the same verdict and source always give the same text (findings in
  the stage's order, metrics sorted by name, floats with 4 significant digits, and no
  timestamps or verifier durations -- metrics named ``*_s`` are left out), so repair
  prompts are reproducible and diffable.
* **Bounded**: at most ``max_lines`` lines. Findings are rendered whole until the budget
  runs out, then a count of what was omitted is appended; long messages (tracebacks,
  DSL diagnostics) are clipped so one finding cannot crowd out the others.
* **Honest about what passed**: a verdict that passed on CPU only is said to be
  unverified on a GPU; a passing stage's findings (e.g. a missed performance bar, a
  forced untuned compile) are shown as warnings with the stage's numeric metrics.
"""

from __future__ import annotations

from typing import Any

from .verdict import Finding, StageResult, Verdict

MAX_MESSAGE_LINES = 12
"""Lines kept from one finding's message (DSL diagnostics and tracebacks run long)."""

MAX_METRICS = 12
"""Numeric metrics shown for a stage that passed with warnings."""


def _code_line(source_lines: list[str], line: int | None) -> str | None:
    if line is None or line < 1 or line > len(source_lines):
        return None
    code = source_lines[line - 1].strip()
    return code if len(code) <= 160 else code[:157] + "..."


def _fmt_value(v: Any) -> str | None:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        return f"{v:.4g}"
    if isinstance(v, str) and len(v) <= 60:
        return v
    return None


def _finding_lines(f: Finding, source_lines: list[str]) -> list[str]:
    where = []
    if f.output:
        where.append(f"output `{f.output}`")
    if f.case:
        where.append(f"case `{f.case}`")
    head = f"- [{f.kind}]"
    if where:
        head += " " + ", ".join(where)
    code = _code_line(source_lines, f.line)
    if f.line is not None:
        head += f" line {f.line}: {code}" if code is not None else f" line {f.line}"
    msg = [ln.rstrip() for ln in f.message.strip().splitlines()] or [""]
    if len(msg) > MAX_MESSAGE_LINES:
        extra = len(msg) - MAX_MESSAGE_LINES
        msg = msg[:MAX_MESSAGE_LINES] + [f"... ({extra} more line(s))"]
    return [head] + ["    " + ln for ln in msg]


def _metric_lines(stage: StageResult) -> list[str]:
    items = []
    for k in sorted(stage.metrics):
        if k.endswith("_s"):
            continue  # the verifier's own durations (wall_s, compile_s): noise for the repair prompt
        s = _fmt_value(stage.metrics[k])
        if s is not None:
            items.append(f"{k}={s}")
    if not items:
        return []
    items = items[:MAX_METRICS]
    return ["  numbers: " + ", ".join(items)]


def render_feedback(verdict: Verdict, candidate_source: str, max_lines: int = 60) -> str:
    """Render the verdict as repair-prompt feedback.

    Args:
        verdict: the verifier's verdict for the candidate.
        candidate_source: the candidate module's text (findings' lines are quoted from it).
        max_lines: upper bound on the number of lines returned (at least 3 are used).

    Returns:
        Plain text, no trailing newline. For a failure: a headline naming the failed stage
        and its summary, then each finding of that stage as ``- [kind] output/case
        line N: <code>`` followed by its indented message. For a pass with warnings: the
        warning findings of every passing stage plus its scalar metrics. For a clean pass:
        one line per stage summary. Always deterministic for equal inputs.

    Raises:
        Nothing.
    """
    max_lines = max(3, max_lines)
    src = candidate_source.splitlines()
    stages_run = ", ".join(f"{s.stage}={s.status}" for s in verdict.stages) or "none"
    failed = verdict.failed_stage
    out: list[str] = []
    blocks: list[list[str]] = []

    if failed is not None:
        who = " (a verifier/machine error, not necessarily your code)" if failed.status == "error" else ""
        out.append(
            f"Verification of `{verdict.spec}` FAILED at stage `{failed.stage}`{who}: {failed.summary or failed.status}"
        )
        out.append(f"Stages: {stages_run}")
        findings = failed.findings
        if not findings:
            blocks.append(["- (the stage reported no details)"])
        for f in findings:
            blocks.append(_finding_lines(f, src))
        metrics = _metric_lines(failed) if failed.stage in ("bench",) else []
        if metrics:
            blocks.append(metrics)
    else:
        warned = [s for s in verdict.stages if s.findings]
        if not verdict.stages:
            return f"Verification of `{verdict.spec}`: no stage ran."
        status = "PASSED with warnings" if warned else "PASSED"
        scope = " (CPU only: static + compile; not yet verified on a GPU)" if verdict.cpu_only else ""
        out.append(f"Verification of `{verdict.spec}` {status}{scope}.")
        out.append(f"Stages: {stages_run}")
        for s in verdict.stages:
            if not s.findings:
                continue
            block = [f"Warnings from `{s.stage}`: {s.summary}"] if s.summary else [f"Warnings from `{s.stage}`:"]
            block += _metric_lines(s)
            blocks.append(block)
            for f in s.findings:
                blocks.append(_finding_lines(f, src))
        if not warned:
            for s in verdict.stages:
                if s.summary:
                    blocks.append([f"- {s.stage}: {s.summary}"])

    for i, block in enumerate(blocks):
        last = i == len(blocks) - 1
        free = max_lines - len(out)
        if len(block) <= (free if last else free - 1):
            out.extend(block)
            continue
        room = free - 1  # keep one line for the omission note
        rest = blocks[i:]
        if room >= 2:
            out.extend(block[: room - 1] + ["    ..."])
            rest = blocks[i + 1 :]
        omitted = sum(1 for b in rest if b and b[0].startswith("- ["))
        out.append(f"... ({omitted} more finding(s) omitted)" if omitted else "...")
        break
    return "\n".join(out[:max_lines])

"""Best-of-N: several answers per attempt, verified side by side, the fastest pass taken.

Design (``coda-agent generate SPEC --candidates N``):

* **The same prompt, N samples.** Every candidate of an attempt gets the attempt's prompt
  byte for byte, and diversity comes from sampling (the API's default temperature, 1.0;
  ``--llm command`` tools sample as they do). Identical prompts keep the prompt cache's
  prefix: candidates 2..N of an attempt read it from the cache. The N calls run at once
  for backends that allow it (``parallel_calls``: the API and ``--llm command``, each call
  its own process); ``--llm manual`` writes N prompt files and waits for N answers.
* **Verified side by side** through the scheduler (``verifier/schedule/``): the CPU stages
  in parallel, the correctness runs side by side within memory budgets, every timing alone
  on its GPU.
* **The fastest that passes is taken**: the lowest geometric mean of the fused kernel's
  median times over the benchmark shapes (:func:`fused_ms`); without timings (CPU-only)
  the first passing candidate.
* **When none passes**, the next attempt's repair prompt replays the candidate that got
  furthest (:func:`replay_choice`: latest stage reached, then fewest findings) with its
  full feedback, followed by one line per other candidate: where it failed and its first
  finding (:func:`combined_feedback`).

Layout: ``attempt-<k>/prompt.md|json`` (the attempt's), ``attempt-<k>/candidate-<j>/``
(``response.md|json``, ``candidate.py``, ``verify/``, ``verdict.json``, ``feedback.md``: one
answer's files, as an attempt folder holds them with one answer per attempt) and
``attempt-<k>/feedback.md`` (what the next repair prompt says). A resume asks only for the
candidates without an answer and verifies only those without a verdict.
"""

from __future__ import annotations

import copy
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from ..verifier.verdict import Verdict
from .llm.base import AwaitingAnswer

STAGE_ORDER = ("extract", "static", "compile", "correctness", "gradients", "bench", "accept")


def candidate_dir(attempt_dir: Path, j: int) -> Path:
    """The folder of candidate ``j`` (1-based) of an attempt."""
    return attempt_dir / f"candidate-{j}"


def fused_ms(verdict: Verdict) -> float | None:
    """Geometric mean (ms) of the fused kernel's median time over the benchmark stage's
    shapes, or None when the bench stage did not run or recorded no time."""
    b = verdict.stage("bench")
    rows = (b.metrics.get("rows") if b is not None else None) or []
    times = [float(r["fused_ms"]) for r in rows if isinstance(r.get("fused_ms"), (int, float)) and r["fused_ms"] > 0]
    if not times:
        return None
    return math.exp(sum(math.log(t) for t in times) / len(times))


def fastest(passing: list[tuple[int, Verdict]]) -> int:
    """Of ``(index, verdict)`` pairs of passing candidates, the index of the fastest
    (:func:`fused_ms`; untimed ones after timed ones; ties: the lower index)."""
    return min(passing, key=lambda iv: (fused_ms(iv[1]) is None, fused_ms(iv[1]) or 0.0, iv[0]))[0]


def replay_choice(failed: list[tuple[int, str | None, int]]) -> int:
    """Of ``(index, stage reached, findings in the failed stage)`` of failed candidates, the
    index of the one that got furthest (latest stage; then fewest findings; then lowest
    index): the answer the next repair prompt quotes."""

    def rank(item: tuple[int, str | None, int]) -> tuple[int, int, int]:
        i, stage, n = item
        reached = STAGE_ORDER.index(stage) if stage in STAGE_ORDER else -1
        return (-reached, n, i)

    return min(failed, key=rank)[0]


def combined_feedback(replay_j: int, replay_text: str, others: list[tuple[int, str]]) -> str:
    """The repair prompt's feedback after an attempt of several candidates failed: the
    replayed candidate's feedback, then one line per other candidate (``(j, "failed at
    <stage>: <first finding>")``)."""
    if not others:
        return replay_text
    lines = [replay_text.rstrip(), "", f"The {len(others)} other answers to the same prompt failed too:"]
    lines += [f"- answer {j}: {what}" for j, what in others]
    return "\n".join(lines) + "\n"


def one_line(verdict: Verdict | None, extract_error: str | None) -> str:
    """Where one candidate failed and its first finding, in one line (at most 300 characters)."""
    if verdict is None:
        return f"no usable module ({(extract_error or '').splitlines()[0] if extract_error else 'extraction failed'})"[
            :300
        ]
    st = verdict.failed_stage
    if st is None:
        return "passed"
    first = st.findings[0] if st.findings else None
    what = f"[{first.kind}] {first.message.splitlines()[0] if first.message else ''}" if first else st.summary
    return f"failed the {st.stage} stage: {what}"[:300]


def ask_all(
    backend: Any, slots: list[Path], call: Callable[[Any, Path], None], done: Callable[[Path], bool]
) -> list[int]:
    """Ask ``backend`` for an answer in every slot (folder) that has none (``done(slot)``
    False): ``call(backend, slot)`` persists one answer. Backends with ``parallel_calls``
    answer all at once (each call on its own shallow copy, bound to its slot); others one
    after the other. Returns the indices asked. Raises :class:`AwaitingAnswer` for the first
    slot still waiting (``answer_paths``: every answer file awaited) after every slot was
    asked, and the first other exception after every call has finished (answers received
    are kept: a resume never pays for them again)."""
    todo = [i for i, s in enumerate(slots) if not done(s)]
    errors: list[BaseException] = []
    waiting: list[tuple[int, AwaitingAnswer]] = []

    def one(i: int) -> None:
        b = copy.copy(backend) if getattr(backend, "parallel_calls", False) else backend
        try:
            call(b, slots[i])
        except AwaitingAnswer as w:
            waiting.append((i, w))
        except Exception as e:  # noqa: BLE001 -- re-raised below, once every call is over
            errors.append(e)

    if getattr(backend, "parallel_calls", False) and len(todo) > 1:
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            list(pool.map(one, todo))
    else:
        for i in todo:
            one(i)
    if errors:
        raise errors[0]
    if waiting:
        waiting.sort(key=lambda iw: iw[0])
        first = waiting[0][1]
        first.answer_paths = [w.answer_path for _, w in waiting]
        raise first
    return todo

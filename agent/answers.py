"""One attempt's answers: their records, extraction, stored verdicts, verification (side by
side when several) and the choice among them.

:class:`AnswerSteps` is the part of the generate loop's run (``agent/loop.py``'s ``_Run``)
that works on an attempt's answer folders: the attempt's own folder with one answer per
attempt, or its ``candidate-<j>/`` folders with ``--candidates N``
(:mod:`~coda_agent.agent.candidates`). The loop owns the prompts, the calls, acceptance and
the lesson; what the run folder is trusted for is :mod:`~coda_agent.agent.run_folder`'s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..verifier.verdict import Verdict
from ..verifier.workspace import atomic_write_text, remove_tree, sha256_bytes
from .candidates import candidate_dir, combined_feedback, fastest, fused_ms, one_line, replay_choice
from .extract import ExtractError, extract_module
from .llm.base import Usage
from .run_folder import (
    CandidateRecord,
    RunError,
    RunState,
    library_verdict,
    read_parsed,
    read_text,
    record_path,
)

CUT_STOP_REASONS = frozenset({"max_tokens", "model_context_window_exceeded"})
"""API stop reasons that mean the answer was cut off at a token limit."""


class VerifierError(RuntimeError):
    """The verifier itself failed (a stage with status "error"): not the candidate's fault,
    so the attempt is not spent and no feedback goes to the model."""


def answered(answer: Path) -> bool:
    """Whether an answer file holds an answer (an empty or blank file is none yet)."""
    return answer.is_file() and bool(read_text(answer).strip())


def minimal_feedback(verdict: Verdict, source: str) -> str:
    """Fallback rendering when ``verifier/feedback.py`` is unavailable."""
    st = verdict.failed_stage
    if st is None:
        return "All stages passed."
    lines = [f"Stage `{st.stage}` {st.status}: {st.summary}".rstrip(": ")]
    src = source.splitlines()
    for f in st.findings:
        where = []
        if f.line:
            where.append(f"line {f.line}")
        if f.output:
            where.append(f"output {f.output}")
        if f.case:
            where.append(f"case {f.case}")
        loc = f" ({', '.join(where)})" if where else ""
        lines.append(f"- [{f.kind}]{loc} {f.message}")
        if f.line and 0 < f.line <= len(src):
            lines.append(f"    {f.line} | {src[f.line - 1]}")
    return "\n".join(lines)


def feedback_text(verdict: Verdict, source: str) -> str:
    """The verifier's feedback for the repair prompt (verifier/feedback.py when present)."""
    try:
        from ..verifier.feedback import render_feedback
    except ImportError:
        return minimal_feedback(verdict, source)
    try:
        return render_feedback(verdict, source)
    except Exception as e:  # a rendering bug must not lose the attempt
        return minimal_feedback(verdict, source) + f"\n\n(feedback renderer failed: {type(e).__name__}: {e})"


class AnswerSteps:
    """The answer-level steps of a run (mixed into the loop's ``_Run``, which provides
    ``state``, ``loaded``, ``root``, ``run_dir``, ``verifier``, :meth:`adir` and :meth:`save`)."""

    state: RunState
    loaded: Any
    root: Path
    run_dir: Path
    verifier: Any

    def adir(self, k: int) -> Path:  # pragma: no cover - provided by the loop's run
        raise NotImplementedError

    def save(self) -> None:  # pragma: no cover - provided by the loop's run
        raise NotImplementedError

    @staticmethod
    def read_response(d: Path) -> tuple[str, dict[str, Any]]:
        """The answer's text and ``response.json``'s metadata (``{}`` when that file is
        missing or not a JSON object: it is bookkeeping, not the answer)."""
        text = read_text(d / "response.md")
        meta: dict[str, Any] = {}
        if (d / "response.json").is_file():
            try:
                meta = json.loads(read_text(d / "response.json"))
            except ValueError:
                meta = {}
        return text, meta if isinstance(meta, dict) else {}

    # -- one attempt ----------------------------------------------------------------
    def slots(self, k: int) -> list[Path]:
        """The folders of attempt ``k``'s answers: the attempt's own (one answer per attempt)
        or its ``candidate-<j>/`` folders (agent/candidates.py)."""
        n = self.state.attempt(k).candidates
        d = self.adir(k)
        return [d] if n <= 1 else [candidate_dir(d, j) for j in range(1, n + 1)]

    def crec(self, k: int, i: int) -> CandidateRecord:
        """The record of attempt ``k``'s answer ``i`` (0-based): the attempt's own record
        with one answer per attempt."""
        rec = self.state.attempt(k)
        if rec.candidates <= 1:
            return rec
        while len(rec.candidate_records) < rec.candidates:
            rec.candidate_records.append(CandidateRecord(j=len(rec.candidate_records) + 1))
        return rec.candidate_records[i]

    def module_dir(self, k: int) -> Path:
        """Where attempt ``k``'s module that counts lives: the chosen candidate's (a pass), the
        replayed one's (a failure), or the attempt's own folder."""
        rec = self.state.attempt(k)
        if rec.candidates <= 1:
            return self.adir(k)
        j = rec.chosen or rec.replay or 1
        d = candidate_dir(self.adir(k), j if 1 <= j <= rec.candidates else 1)
        return d

    def read_answer(self, k: int, i: int, slot: Path) -> str | None:
        """Record answer ``i``'s metadata and extract its module into ``candidate.py``;
        None (and its feedback written) when it holds no usable module."""
        c = self.crec(k, i)
        text, meta = self.read_response(slot)
        try:
            c.backend = str(meta.get("backend", c.backend or "manual"))
            c.model = meta.get("model", c.model)
            c.model = None if c.model is None else str(c.model)
            c.stop_reason = None if meta.get("stop_reason") is None else str(meta["stop_reason"])
            c.usage = Usage(**meta.get("usage", {}))
            c.llm_wall_s = float(meta.get("wall_s", 0.0))
        except (TypeError, ValueError) as e:
            raise RunError(
                f"{slot / 'response.json'}: not what the loop wrote there ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); fix or delete it, then resume"
            ) from None
        cand = slot / "candidate.py"
        try:
            source = extract_module(text, stopped_at_limit=c.stop_reason in CUT_STOP_REASONS)
        except ExtractError as e:
            msg = str(e)
            if c.stop_reason in CUT_STOP_REASONS and "output token limit" not in msg:
                msg += " (Your response stopped at the output token limit.)"
            cand.unlink(missing_ok=True)
            atomic_write_text(slot / "feedback.md", "Your response could not be used.\n\n" + msg + "\n")
            c.extract_error, c.stage_reached, c.passed, c.failed_stage = msg, "extract", False, "extract"
            return None
        c.extract_error = None
        if not cand.is_file() or cand.read_bytes() != source.encode("utf-8"):  # the loop's file: rewritten
            atomic_write_text(cand, source)
        return source

    def verdicts(self, k: int, slots: list[Path], sources: list[str | None]) -> list[Verdict | None]:
        """The verdict of each of attempt ``k``'s answers (``sources``: their modules, None
        where an answer had none): a stored one where it may be reused (:meth:`stored_verdict`),
        else verified now (:meth:`verify_pending`). Each answer's record takes its outcome and a
        failure's ``feedback.md`` is written. Raises VerifierError (:meth:`verify_pending`)."""
        verdicts: list[Verdict | None] = [None] * len(slots)
        pending: list[int] = []
        for i, (slot, source) in enumerate(zip(slots, sources, strict=True)):
            if source is not None:
                verdicts[i] = self.stored_verdict(k, slot, source, i)
                if verdicts[i] is None:
                    pending.append(i)
        if pending:
            self.verify_pending(k, slots, pending, verdicts)
        for i, (slot, source) in enumerate(zip(slots, sources, strict=True)):
            v = verdicts[i]
            c = self.crec(k, i)
            if v is None:
                continue
            c.stage_reached = v.furthest_stage
            c.passed = v.passed
            c.failed_stage = v.failed_stage.stage if v.failed_stage else None
            c.fused_ms = fused_ms(v)
            if not v.passed and not (slot / "feedback.md").is_file():
                atomic_write_text(slot / "feedback.md", feedback_text(v, source or "").rstrip() + "\n")
        return verdicts

    def stored_verdict(self, k: int, slot: Path, source: str, i: int) -> Verdict | None:
        """The verdict kept in ``slot`` for exactly this module when it may be reused, else
        None (verify it); a verdict that may not be reused is kept aside for the record."""
        d = slot
        vpath = d / "verdict.json"
        verdict = read_parsed(vpath, Verdict.model_validate_json) if vpath.is_file() else None
        stale = verdict is not None and verdict.candidate_hash != sha256_bytes(source.encode("utf-8"))
        if (verdict is None or stale) and (self.adir(k + 1) / "prompt.json").is_file():
            # the answer was edited (or now extracts) after attempt k+1 was prompted from its old
            # verdict: verifying it again would leave that prompt quoting code that is gone
            raise RunError(
                f"attempt {k}'s answer changed after it was verified, and attempt {k + 1} was "
                f"prompted from the old verdict: restore {d / 'response.md'}, or remove "
                f"{self.adir(k + 1)} (and any later attempt) to be prompted from a new verdict; then resume"
            )
        if stale:
            # a verdict is about the bytes it judged (an answer edited after its verification
            # must not keep the old verdict and pass with a broken candidate.py); kept for the
            # record, and this candidate is verified
            vpath.rename(record_path(d, "stale"))
            verdict = None
        if verdict is not None and verdict.passed and not verdict.gpu_verified and not self.state.cpu_only:
            # A pass of the CPU stages only (--cpu-only, or a machine without a GPU) is not a
            # verification: keep it for the record and verify again, GPU stages included.
            vpath.rename(record_path(d, "cpu"))
            verdict = None
        elif verdict is not None and verdict.gpu_verified:
            # A stored GPU pass is never taken on its word: in --llm manual mode the answerer
            # writes into this folder, and a forged verdict.json (right spec hash, the
            # candidate's own sha256, "gpu_verified") would be accepted unverified, or with
            # --no-accept make the run "passed" and draw a lesson (tests/agent/test_loop.py).
            # Only the library's manifest vouches for a pass (the kernel it accepted from
            # this very attempt); any other is kept for the record and verified again here.
            # (A CPU-only pass is reused: it is never accepted and proposes no lesson.)
            j = None if self.state.attempt(k).candidates <= 1 else i + 1
            anchored = library_verdict(self.root, self.loaded.name, self.run_dir, k, j)
            if anchored is not None and anchored.spec_hash == self.loaded.spec_hash:
                verdict = anchored
            else:
                vpath.rename(record_path(d, "stored"))
                verdict = None
        return verdict

    def verify_pending(self, k: int, slots: list[Path], pending: list[int], verdicts: list[Verdict | None]) -> None:
        """Verify the answers ``pending`` of attempt ``k`` (side by side when several), fill
        ``verdicts`` and write each ``verdict.json``. Raises VerifierError after keeping every
        good verdict when some verification failed as the verifier's (its attempt is not spent;
        a resume verifies only those again)."""
        rec = self.state.attempt(k)
        for i in pending:
            # verify/ is the verifier's: emptied first, so nothing planted there (a symlink
            # where a worker log goes would make the verifier truncate its target) is ever
            # written through.
            remove_tree(slots[i] / "verify")
            (slots[i] / "feedback.md").unlink(missing_ok=True)  # it follows the verdict made now
        t0 = time.monotonic()
        pairs = [(slots[i] / "candidate.py", slots[i] / "verify") for i in pending]
        many = getattr(self.verifier, "many", None)
        got = many(self.loaded, pairs) if many is not None else [self.verifier(self.loaded, c, w) for c, w in pairs]
        wall = time.monotonic() - t0
        if rec.candidates > 1:
            rec.verify_wall_s += wall  # summed over resumes (a verifier error runs it again)
        broken = []
        for i, v in zip(pending, got, strict=True):
            self.crec(k, i).verify_wall_s += wall
            if v.verifier_error is not None:
                # The verifier (or the machine) failed, not the candidate: the model gets no
                # feedback about it and the attempt is not spent. The verdict is kept for the
                # record; --resume verifies this answer again.
                record = record_path(slots[i], "error")
                atomic_write_text(record, v.to_json())
                broken.append((v.verifier_error, record))
                continue
            atomic_write_text(slots[i] / "verdict.json", v.to_json())
            verdicts[i] = v
        if broken:
            self.save()
            (stage, record) = broken[0]
            raise VerifierError(
                f"attempt {k}: the verifier failed at stage {stage.stage!r} ({stage.summary}); "
                f"the attempt is not counted. Fix the cause, then --resume {self.run_dir} "
                f"(record: {record})"
            )

    def choose(self, k: int, slots: list[Path], verdicts: list[Verdict | None]) -> Verdict | None:
        """Attempt ``k`` of several candidates: the fastest passing one is chosen; when none
        passes, the one that got furthest is replayed and ``attempt-<k>/feedback.md`` gets
        every candidate's findings (agent/candidates.py). The attempt's record takes the
        chosen (or replayed) one's outcome and the candidates' totals."""
        rec = self.state.attempt(k)
        recs = [self.crec(k, i) for i in range(len(slots))]
        rec.usage = sum((c.usage for c in recs), Usage())
        rec.backend = next((c.backend for c in recs if c.backend), rec.backend)
        rec.model = next((c.model for c in recs if c.model), rec.model)
        passing = [(i, v) for i, v in enumerate(verdicts) if v is not None and v.passed]
        if passing:
            i = fastest(passing)
            rec.chosen, rec.replay = i + 1, None
        else:
            failed = []
            for i, v in enumerate(verdicts):
                st = v.failed_stage if v is not None else None
                failed.append((i, recs[i].stage_reached, len(st.findings) if st is not None else 0))
            i = replay_choice(failed)
            rec.chosen, rec.replay = None, i + 1
            others = [(j + 1, one_line(verdicts[j], recs[j].extract_error)) for j in range(len(slots)) if j != i]
            text = combined_feedback(i + 1, read_text(slots[i] / "feedback.md"), others)
            atomic_write_text(self.adir(k) / "feedback.md", text)
        c = recs[i]
        rec.stage_reached, rec.passed, rec.failed_stage = c.stage_reached, c.passed, c.failed_stage
        rec.extract_error, rec.stop_reason, rec.fused_ms = c.extract_error, c.stop_reason, c.fused_ms
        return verdicts[i]

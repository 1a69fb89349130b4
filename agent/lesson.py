"""The lesson step of a run: after a repair passes, the model is asked for one sentence,
the trick that fixed the failure; it is written to ``proposed_trick.md`` in the run folder
for a person to review (``agent/tricks.py`` adds reviewed tricks to the prompt).

:class:`LessonStep` is mixed into the generate loop's run (``agent/loop.py``'s ``_Run``).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from ..verifier.workspace import atomic_write_text
from .llm.base import AwaitingAnswer, LLMError, LLMResponse, Usage
from .render import Prompt, build_lesson_prompt
from .run_folder import PROPOSED_TRICK, LessonRecord, RunState, read_parsed, read_text


def lesson_sentence(text: str) -> str:
    """First meaningful line of a lesson reply, cleaned to one sentence-ish line."""
    for line in text.replace("\r", "").splitlines():
        s = line.strip().strip("`").strip()
        s = re.sub(r"^([-*]|\d+[.)])\s+", "", s)
        s = re.sub(r"^\**\s*(lesson|trick)\s*(:\s*\**|\**\s*:)\s*", "", s, flags=re.I)
        s = s.strip().strip('"').strip()
        if s and not s.startswith("```"):
            return " ".join(s.split())[:500]
    return ""


class LessonStep:
    """The lesson step (mixed into the loop's ``_Run``, which provides ``state``,
    ``run_dir``, :meth:`module_dir`, :meth:`adir`, :meth:`base_prompt`, :meth:`call`,
    :meth:`read_response` and :meth:`save`)."""

    state: RunState
    run_dir: Path

    def adir(self, k: int) -> Path:  # pragma: no cover - provided by the loop's run
        raise NotImplementedError

    def module_dir(self, k: int) -> Path:  # pragma: no cover - provided by the loop's run
        raise NotImplementedError

    def base_prompt(self) -> Prompt:  # pragma: no cover - provided by the loop's run
        raise NotImplementedError

    def call(self, prompt: Prompt, d: Path, backend: Any = None) -> tuple[LLMResponse, float]:  # pragma: no cover
        raise NotImplementedError

    def read_response(self, d: Path) -> tuple[str, dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def save(self) -> None:  # pragma: no cover - provided by the loop's run
        raise NotImplementedError

    def lesson(self, k: int) -> None:
        """Propose a one-sentence trick when attempt k-1 failed (with a module) and k passed."""
        s = self.state
        if k < 2 or (self.run_dir / PROPOSED_TRICK).is_file():
            return
        prev, cur = self.module_dir(k - 1), self.module_dir(k)
        feedback = self.adir(k - 1) / "feedback.md"
        if not (prev / "candidate.py").is_file() or not feedback.is_file():
            s.lesson = LessonRecord(
                status="skipped", failed_attempt=k - 1, error="the failed attempt had no module (extraction error)"
            )
            self.save()
            return
        ldir = self.run_dir / "lesson"
        prompt_path = ldir / "prompt.json"
        if prompt_path.is_file():
            prompt = read_parsed(prompt_path, Prompt.from_json)
        else:
            diff = "".join(
                difflib.unified_diff(
                    read_text(prev / "candidate.py").splitlines(keepends=True),
                    read_text(cur / "candidate.py").splitlines(keepends=True),
                    fromfile=str((prev / "candidate.py").relative_to(self.run_dir)),
                    tofile=str((cur / "candidate.py").relative_to(self.run_dir)),
                )
            )
            prompt = build_lesson_prompt(
                self.base_prompt(),
                kernel=s.spec,
                failed_attempt=k - 1,
                feedback=read_text(feedback),
                diff=diff,
            )
            ldir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(ldir / "prompt.md", prompt.as_text())
            atomic_write_text(prompt_path, prompt.to_json())
        try:
            if not (ldir / "response.md").is_file():
                self.call(prompt, ldir)
        except AwaitingAnswer as w:
            s.lesson = LessonRecord(status="waiting-for-answer", failed_attempt=k - 1, answer_path=str(w.answer_path))
            self.save()
            return
        except LLMError as e:
            s.lesson = LessonRecord(status="error", failed_attempt=k - 1, error=str(e))
            self.save()
            return
        text, meta = self.read_response(ldir)
        sentence = lesson_sentence(text)
        if not sentence:
            s.lesson = LessonRecord(status="error", failed_attempt=k - 1, error="empty lesson reply")
            self.save()
            return
        atomic_write_text(self.run_dir / PROPOSED_TRICK, sentence + "\n")
        s.lesson = LessonRecord(
            status="proposed",
            failed_attempt=k - 1,
            path=str(self.run_dir / PROPOSED_TRICK),
            text=sentence,
            usage=Usage(**meta.get("usage", {})),
        )
        self.save()

"""The ``manual`` backend: a human (or another tool) answers in a file.

Design
------
No API key, no network: the prompt is written as ``prompt.md`` into the directory the
loop binds (the attempt's directory, or ``lesson/`` for the lesson), and the backend
raises :class:`AwaitingAnswer`. The loop records the run as ``waiting-for-answer`` with
the path where the answer goes (``response.md`` next to the prompt) and stops.
``coda-agent generate SPEC --resume RUN_DIR`` then finds ``response.md`` and carries on
(the loop reads a present ``response.md`` without calling any backend). Pasting a whole
chat reply into ``response.md`` is fine: extraction takes the one ```python block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...verifier.workspace import atomic_write_text
from .base import AwaitingAnswer, LLMError, LLMResponse

PROMPT_FILE = "prompt.md"
ANSWER_FILE = "response.md"


class ManualBackend:
    """Writes the prompt to ``<dir>/prompt.md``; the answer is read from ``<dir>/response.md``."""

    name = "manual"

    def __init__(self, directory: str | Path | None = None, *, model: str = "manual"):
        self.directory = Path(directory) if directory is not None else None
        self.model = model

    def bind(self, directory: str | Path) -> None:
        """Set the directory of the next call (the loop binds each attempt's folder)."""
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"ManualBackend(directory={str(self.directory)!r})"

    def complete(self, prompt: Any) -> LLMResponse:
        """Return the answer if ``response.md`` exists, else write the prompt and raise
        :class:`AwaitingAnswer`."""
        if self.directory is None:
            raise LLMError("manual backend: no directory bound for the prompt/answer files")
        answer = self.directory / ANSWER_FILE
        if answer.is_file() and answer.read_text().strip():
            return LLMResponse(text=answer.read_text(), model=self.model)
        ppath = self.directory / PROMPT_FILE
        text = prompt.as_text()
        if not ppath.is_file() or ppath.read_text() != text:
            atomic_write_text(ppath, text)
        raise AwaitingAnswer(ppath, answer)

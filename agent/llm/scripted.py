"""The ``scripted`` backend: replays canned responses, in order. For tests only.

Design
------
Loop tests need deterministic model behaviour ("first a broken kernel, then the fixed
one"). Each item is a response text, a ``Path`` to a file holding one, an
:class:`LLMResponse` (to script usage numbers), or an exception instance to raise (to
script API failures). Every prompt received is kept in :attr:`prompts` so tests can
assert what the model would have seen. Never a default backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .base import LLMError, LLMResponse, Usage


class ScriptedBackend:
    """Replays ``responses``; raises :class:`LLMError` when they run out."""

    name = "scripted"

    def __init__(self, responses: Iterable[Any], *, model: str = "scripted"):
        self.responses = list(responses)
        self.model = model
        self.prompts: list[Any] = []

    @property
    def calls(self) -> int:
        return len(self.prompts)

    def complete(self, prompt: Any) -> LLMResponse:
        """The next canned response (or raise the next canned exception)."""
        i = len(self.prompts)
        self.prompts.append(prompt)
        if i >= len(self.responses):
            raise LLMError(f"scripted backend: no response #{i + 1} (only {len(self.responses)} scripted)")
        item = self.responses[i]
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, LLMResponse):
            return item
        if isinstance(item, Path):
            item = item.read_text()
        text = str(item)
        return LLMResponse(
            text=text,
            model=self.model,
            usage=Usage(input_tokens=prompt.estimate_tokens(), output_tokens=len(text) // 4),
        )

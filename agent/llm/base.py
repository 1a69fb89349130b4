"""What every LLM backend provides: ``complete(prompt) -> LLMResponse``.

Design
------
The loop (agent/loop.py) only needs text back plus the token accounting for the run
summary, so the protocol is one method. Backends differ in how the prompt travels:

* ``anthropic`` -- the official SDK, structured system blocks with prompt caching;
* ``command``   -- any shell command reading the prompt text on stdin (another CLI,
  a local model server wrapper, ``cat canned.md`` ...);
* ``manual``    -- a human (or another agent) answers in a file; the run pauses;
* ``scripted``  -- canned answers for tests.

Errors a user can act on are :class:`LLMError` (message says what to do);
:class:`AwaitingAnswer` is not an error but the manual backend's "stop here, the answer
goes to <path>" signal, which the loop turns into the ``waiting-for-answer`` state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:  # pragma: no cover
    from ..render import Prompt


class Usage(BaseModel):
    """Token accounting of one call (zeros when a backend cannot know)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens + other.cache_creation_input_tokens,
        )


class LLMResponse(BaseModel):
    """One completion: the raw text, the model that produced it and its usage."""

    text: str
    model: str
    usage: Usage = Usage()
    stop_reason: str | None = None


class LLMError(RuntimeError):
    """A backend failed in a way the user must act on (the message says how)."""


class LLMAuthError(LLMError):
    """The credentials were rejected; retrying cannot help."""


class AwaitingAnswer(Exception):
    """Raised by the manual backend: the prompt is at ``prompt_path``, the answer
    is expected at ``answer_path`` (then resume the run)."""

    def __init__(self, prompt_path: Path, answer_path: Path):
        self.prompt_path = Path(prompt_path)
        self.answer_path = Path(answer_path)
        self.answer_paths: list[Path] = [self.answer_path]
        """Every answer file awaited (several with ``--candidates``: agent/candidates.py)."""
        super().__init__(f"waiting for an answer: read {self.prompt_path}, write the answer to {self.answer_path}")


@runtime_checkable
class LLMBackend(Protocol):
    """The backend protocol. ``name`` is the backend kind (``anthropic``, ...),
    ``model`` the model id (or a label such as the command's name)."""

    name: str
    model: str

    def complete(self, prompt: "Prompt") -> LLMResponse:  # pragma: no cover - protocol
        ...

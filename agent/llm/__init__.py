"""LLM backends (anthropic, command, manual, scripted) and the factory the CLI uses.

``make_backend(name, **opts)`` builds one; ``default_backend_name()`` is ``"anthropic"``
when ``ANTHROPIC_API_KEY`` is set, else ``None`` (the CLI then explains the choices:
set the key, ``--llm manual`` or ``--llm command --cmd "..."``). Backends import their
dependencies lazily, so ``--llm manual`` works without the anthropic SDK configured.
"""

from __future__ import annotations

import os
from typing import Any

from .base import (
    AwaitingAnswer,
    LLMAuthError,
    LLMBackend,
    LLMError,
    LLMResponse,
    Usage,
)

BACKENDS = ("anthropic", "command", "manual", "scripted")

NO_BACKEND_HELP = (
    "no LLM backend configured. Choose one:\n"
    "  export ANTHROPIC_API_KEY=...        (the anthropic backend, the default when set)\n"
    "  --llm manual                        (the prompt is written to a file; you paste the answer "
    "into response.md and --resume)\n"
    '  --llm command --cmd "CMD"           (the prompt is piped into CMD\'s stdin; its stdout is the answer)'
)


def default_backend_name() -> str | None:
    """``"anthropic"`` when ``ANTHROPIC_API_KEY`` is set, else ``None``."""
    return "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else None


def make_backend(name: str | None, **opts: Any) -> LLMBackend:
    """Build a backend by name.

    * ``anthropic``: ``model=``, ``max_tokens=``, ``timeout_s=``, ``thinking=``, ... (see
      :class:`~coda_agent.agent.llm.anthropic.AnthropicBackend`);
    * ``command``: ``command="CMD"`` (required), ``timeout_s=``, ``model=`` (a label);
    * ``manual``: ``directory=`` (the loop binds each attempt's folder itself);
    * ``scripted``: ``responses=[...]`` (tests only).

    ``None`` options are dropped, so the CLI can pass its flags through unchanged.
    Raises :class:`LLMError` for an unknown name or a missing required option.
    """
    opts = {k: v for k, v in opts.items() if v is not None}
    if name is None:
        raise LLMError(NO_BACKEND_HELP)
    if name == "anthropic":
        from .anthropic import AnthropicBackend

        return AnthropicBackend(**opts)
    if name == "command":
        from .command import CommandBackend

        cmd = opts.pop("command", None) or opts.pop("cmd", None)
        if not cmd:
            raise LLMError('--llm command needs the command line: --llm command --cmd "CMD"')
        return CommandBackend(cmd, **{k: v for k, v in opts.items() if k in ("timeout_s", "model")})
    if name == "manual":
        from .manual import ManualBackend

        return ManualBackend(**{k: v for k, v in opts.items() if k in ("directory", "model")})
    if name == "scripted":
        from .scripted import ScriptedBackend

        if "responses" not in opts:
            raise LLMError("the scripted backend needs responses=[...] (it exists for tests)")
        return ScriptedBackend(**opts)
    raise LLMError(f"unknown LLM backend {name!r}; choose one of {', '.join(BACKENDS[:3])}")


__all__ = [
    "AwaitingAnswer",
    "BACKENDS",
    "LLMAuthError",
    "LLMBackend",
    "LLMError",
    "LLMResponse",
    "NO_BACKEND_HELP",
    "Usage",
    "default_backend_name",
    "make_backend",
]

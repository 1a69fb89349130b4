"""The ``command`` backend: pipe the prompt into a shell command, read the answer.

Design
------
Any tool that reads a prompt on stdin and prints a completion works here (another LLM
CLI, a wrapper around a local model server, ``cat answer.md`` in a pinch), so
coda-agent never needs an SDK for each provider. The command gets the prompt text
(:meth:`Prompt.as_text`, exactly what ``coda-agent prompt`` prints) on stdin; for tools
that prefer files, ``$CODA_PROMPT_FILE`` names a temporary file with the same text and
``$CODA_PROMPT_JSON`` one with the structured prompt (system blocks + messages).

Failures are explicit: a non-zero exit status, a timeout or empty stdout is an
:class:`LLMError` naming the command and the tail of its stderr. Token usage is
unknown to this backend and reported as zeros.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from coda_agent.agent.llm.base import LLMError, LLMResponse

DEFAULT_TIMEOUT_S = 1800.0


class CommandBackend:
    """Runs ``command`` (a shell command line) once per prompt."""

    name = "command"

    def __init__(self, command: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, model: str | None = None):
        if not command or not command.strip():
            raise LLMError('--llm command needs a command line, e.g. --llm command --cmd "my-llm-cli --stdin"')
        self.command = command
        self.timeout_s = timeout_s
        try:
            first = shlex.split(command)[0]
        except (ValueError, IndexError):
            first = command.split()[0]
        self.model = model or f"command:{Path(first).name}"

    def __repr__(self) -> str:
        return f"CommandBackend(command={self.command!r}, timeout_s={self.timeout_s})"

    def complete(self, prompt: Any) -> LLMResponse:
        """Pipe ``prompt.as_text()`` into the command; its stdout is the response."""
        text = prompt.as_text()
        with tempfile.TemporaryDirectory(prefix="coda-prompt-") as tmp:
            txt = Path(tmp) / "prompt.md"
            js = Path(tmp) / "prompt.json"
            txt.write_text(text)
            js.write_text(prompt.to_json())
            env = dict(os.environ, CODA_PROMPT_FILE=str(txt), CODA_PROMPT_JSON=str(js))
            try:
                proc = subprocess.run(
                    self.command,
                    shell=True,
                    input=text,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    env=env,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                raise LLMError(
                    f"--llm command {self.command!r} did not finish within {self.timeout_s:g} s"
                ) from None
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip()[-800:]
            raise LLMError(
                f"--llm command {self.command!r} exited with status {proc.returncode}"
                + (f"; stderr:\n{tail}" if tail else " (no stderr)")
            )
        if not proc.stdout.strip():
            raise LLMError(f"--llm command {self.command!r} printed nothing on stdout")
        return LLMResponse(text=proc.stdout, model=self.model)

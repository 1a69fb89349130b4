"""The ``command`` backend: pipe the prompt into a shell command, read the answer.

Design
------
Any tool that reads a prompt on stdin and prints a completion works here (another LLM
CLI, a wrapper around a local model server, ``cat answer.md`` in a pinch), so
coda-agent never needs an SDK for each provider. The command gets the prompt text
(:meth:`Prompt.as_text`, exactly what ``coda-agent prompt`` prints) on stdin; for tools
that prefer files, ``$CODA_PROMPT_FILE`` names a temporary file with the same text and
``$CODA_PROMPT_JSON`` one with the structured prompt (system blocks + messages).

Failures are explicit: a non-zero exit status, a timeout, empty stdout or more than
:data:`MAX_OUTPUT` bytes of it is an :class:`LLMError` naming the command and the tail
of its stderr. The command runs in its own process group, which is killed on a timeout
and once the command has exited (a background child it left holding stdout no longer
makes a finished command look hung). Output is decoded as UTF-8 with replacement
characters (the extraction then reports what it cannot parse). Token usage is unknown
to this backend and reported as zeros. When the command succeeds but wrote on stderr, the
tail is kept beside the answer as ``command.stderr`` in the attempt's folder (the loop
binds it): a wrapper that printed its error and some non-code text is then diagnosable.
The command runs in the caller's working directory with a :data:`DEFAULT_TIMEOUT_S` limit.
"""

from __future__ import annotations

import collections
import os
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ...verifier.confine.sandbox import feed, kill_group, track_group  # the verifier's workers' own helpers
from ...verifier.workspace import atomic_write_text
from .base import LLMError, LLMResponse

DEFAULT_TIMEOUT_S = 1800.0
MAX_OUTPUT = 8 << 20
"""Most stdout bytes kept (an answer is one Python module; a flood is cut here)."""
EXIT_GRACE_S = 2.0
"""How long output may still arrive after the command exited, before its group is killed."""


def _drain(stream, cap: int, out: list[bytes], over: list[bool]) -> None:
    """Read ``stream`` to its end, keeping its first ``cap`` bytes in ``out``."""
    kept = 0
    while chunk := stream.read(65536):
        if kept < cap:
            out.append(chunk[: cap - kept])
        kept += len(chunk)
    over.append(kept > cap)


def _drain_tail(stream, cap: int, out: list[bytes]) -> None:
    """Read ``stream`` to its end, keeping its last ``cap`` bytes in ``out`` (stderr: the
    reason a command failed comes last, after any warnings)."""
    tail = collections.deque()
    size = 0
    while chunk := stream.read(65536):
        tail.append(chunk)
        size += len(chunk)
        while size - len(tail[0]) >= cap:
            size -= len(tail.popleft())
    out[:] = [b"".join(tail)[-cap:]]


class CommandBackend:
    """Runs ``command`` (a shell command line) once per prompt."""

    name = "command"
    parallel_calls = True
    """Several calls at once are safe (``--candidates``: each its own process, on a shallow copy bound to its folder)."""

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
        self.directory: Path | None = None

    def bind(self, directory: str | Path) -> None:
        """Set the attempt folder of the next call (where ``command.stderr`` goes)."""
        self.directory = Path(directory)

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
            rc, stdout, stderr, over = self._run(text.encode("utf-8"), env)
        if rc is None:
            raise LLMError(f"--llm command {self.command!r} did not finish within {self.timeout_s:g} s")
        tail = stderr.strip()[-800:]  # what a failing command said last
        if rc != 0:
            raise LLMError(
                f"--llm command {self.command!r} exited with status {rc}"
                + (f"; stderr:\n{tail}" if tail else " (no stderr)")
            )
        if over:
            raise LLMError(f"--llm command {self.command!r} printed more than {MAX_OUTPUT >> 20} MiB on stdout")
        if not stdout.strip():
            # a script whose last line failed exits 0 with the error on stderr
            raise LLMError(
                f"--llm command {self.command!r} printed nothing on stdout (exit status 0)"
                + (f"; stderr:\n{tail}" if tail else " and nothing on stderr")
            )
        if stderr.strip() and self.directory is not None and self.directory.is_dir():
            atomic_write_text(self.directory / "command.stderr", stderr)  # replaces, never writes through a link
        return LLMResponse(text=stdout, model=self.model)

    def _run(self, data: bytes, env: dict[str, str]) -> tuple[int | None, str, str, bool]:
        """(exit status or None on timeout, stdout, stderr tail, stdout over the cap)."""
        proc = subprocess.Popen(
            self.command,
            shell=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        track_group(proc.pid, True)  # killed with the verifier's workers when coda-agent is interrupted
        try:
            return self._collect(proc, data)
        finally:
            track_group(proc.pid, False)

    def _collect(self, proc: subprocess.Popen, data: bytes) -> tuple[int | None, str, str, bool]:
        out: list[bytes] = []
        err: list[bytes] = []
        over: list[bool] = []
        drains = [
            threading.Thread(target=_drain, args=(proc.stdout, MAX_OUTPUT + 1, out, over), daemon=True),
            threading.Thread(target=_drain_tail, args=(proc.stderr, 1 << 20, err), daemon=True),
        ]
        for t in drains:
            t.start()

        threading.Thread(target=feed, args=(proc.stdin, data), daemon=True).start()
        rc: int | None
        try:
            rc = proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:
            # Ctrl-C or SIGTERM of coda-agent: the command runs in its own session and would
            # go on (and go on spending, for a paid LLM tool) with nobody reading its answer
            kill_group(proc.pid)
            proc.wait()
            raise
        deadline = time.monotonic() + EXIT_GRACE_S
        for t in drains:
            t.join(timeout=max(0.0, deadline - time.monotonic()) if rc is not None else 0)
        kill_group(proc.pid)  # whatever it left running, on a timeout or after it exited
        proc.wait()
        for t in drains:
            t.join(timeout=EXIT_GRACE_S)
        decode = lambda parts: b"".join(parts).decode("utf-8", errors="replace")  # noqa: E731
        return rc, decode(out), decode(err), bool(over and over[0])

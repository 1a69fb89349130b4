"""Progress of long commands, for a person watching a terminal.

The verifier's stages, the library commands (``regress``, ``bench``) and the agent loop
announce what they start and finish through the functions here; whatever :func:`reporting`
installed renders it. Nothing is installed by default, so library callers and tests see no
output and pay nothing. The CLI installs :class:`RichReporter` when stderr is a terminal and
``--quiet`` is not given.

Rules:

* Reports go to stderr: stdout keeps the command's result (tables, JSON, prompts).
* A report never changes a result, and a reporter that raises is switched off rather than
  failing the run (:func:`_safe`).
* One reporter per process (a module global, not a context variable): the compile stages run
  in worker threads and their steps must reach the same display.

Events: :func:`step` (a named phase with its outcome and elapsed seconds), :func:`item`
(the n-th of N things, e.g. kernels of a regression) and :func:`note` (one line).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # rich is imported when a display starts
    from rich.console import Console
    from rich.progress import TaskID


class Reporter(Protocol):
    """What a progress display implements (all times in seconds)."""

    def started(self, what: str) -> None: ...
    def ended(self, what: str, outcome: str, seconds: float) -> None: ...
    def item(self, index: int, total: int, name: str) -> None: ...
    def note(self, text: str) -> None: ...


_reporter: Reporter | None = None
_lock = threading.Lock()


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Install ``reporter`` for the duration of the block (None: report nothing)."""
    global _reporter
    with _lock:
        before, _reporter = _reporter, reporter
    try:
        yield
    finally:
        with _lock:
            _reporter = before


def _safe(method: str, *args: object) -> None:
    global _reporter
    r = _reporter
    if r is None:
        return
    try:
        getattr(r, method)(*args)
    except Exception:  # noqa: BLE001 -- a display must never fail a verification
        _reporter = None


class Step:
    """The handle :func:`step` yields: set ``outcome`` (e.g. a stage's status) before the
    block ends; it defaults to ``"done"`` and becomes ``"error"`` if the block raises."""

    def __init__(self) -> None:
        self.outcome = "done"


@contextlib.contextmanager
def step(what: str) -> Iterator[Step]:
    """Report ``what`` as started, then as ended with its outcome and elapsed time."""
    handle = Step()
    t0 = time.monotonic()
    _safe("started", what)
    try:
        yield handle
    except BaseException:
        handle.outcome = "interrupted" if handle.outcome == "done" else handle.outcome
        raise
    finally:
        _safe("ended", what, handle.outcome, time.monotonic() - t0)


def item(index: int, total: int, name: str) -> None:
    """Report that the ``index``-th (1-based) of ``total`` things, ``name``, begins."""
    _safe("item", index, total, name)


def note(text: str) -> None:
    """Report one line of text."""
    _safe("note", text)


_STYLE = {
    "pass": "green",
    "done": "green",
    "ok": "green",
    "fail": "red",
    "error": "red",
    "interrupted": "red",
    "skip": "dim",
}


class RichReporter:
    """A live display on stderr: one spinner line per running step with its elapsed time;
    a finished step leaves one line (outcome, seconds); an item leaves a ``[n/N] name``
    header."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console if console is not None else Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console, transient=True
        )
        self.tasks: dict[str, list[TaskID]] = {}
        self.prefix = ""
        self.lock = threading.Lock()

    # Rationale: the live region runs only while a step runs. Results printed between steps
    # (on stdout, which the live display on stderr cannot coordinate with) then never share
    # a line with a spinner.
    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.progress.stop()

    def started(self, what: str) -> None:
        from rich.markup import escape

        with self.lock:
            if not any(self.tasks.values()):
                self.progress.start()
            self.tasks.setdefault(what, []).append(self.progress.add_task(escape(self.prefix + what), total=None))

    def ended(self, what: str, outcome: str, seconds: float) -> None:
        from rich.markup import escape

        with self.lock:
            ids = self.tasks.get(what) or []
            if ids:
                self.progress.remove_task(ids.pop())
            style = _STYLE.get(outcome, "yellow")
            self.progress.console.print(
                f"  {escape(what)}: [{style}]{escape(outcome)}[/] [dim]{seconds:.1f} s[/]", highlight=False
            )
            if not any(self.tasks.values()):
                self.progress.stop()

    def item(self, index: int, total: int, name: str) -> None:
        from rich.markup import escape

        with self.lock:
            self.prefix = f"[{index}/{total}] {name} "
            self.progress.console.print(f"[bold]{escape(f'[{index}/{total}]')}[/] {escape(name)}", highlight=False)

    def note(self, text: str) -> None:
        from rich.markup import escape

        self.progress.console.print(f"  {escape(text)}", highlight=False)

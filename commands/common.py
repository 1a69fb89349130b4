"""What every command shares: the consoles, the exit codes, :class:`UsageError` and the
checks of the arguments most commands take.

Rules:

* Only ``cli.py`` and the command modules print, and only through :data:`console`
  (stdout: results) and :data:`err` (stderr: errors, warnings, progress).
* Every check here turns the library's own error into a :class:`UsageError` (one line,
  exit code 2).
* Commands call :func:`has_gpu` as ``common.has_gpu()``, looked up at call time: the tests
  replace it to play a machine with or without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, TypeVar

from rich.console import Console

from ..verifier import workspace

T = TypeVar("T")

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default, and
# printed lines are never wrapped there, so a command in a hint can be copied from a log.
console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=not sys.stdout.isatty())
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160, soft_wrap=not sys.stderr.isatty())

OK, FAILED, USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit code 2."""


def workspace_root(args) -> Path:
    """The workspace of a command (``--root``, else ``$CODA_ROOT`` or the nearest folder
    with ``kernel_specs/``)."""
    try:
        return workspace.find_root(getattr(args, "root", None))
    except workspace.WorkspaceError as e:
        raise UsageError(str(e)) from None


def spec_arg(root: Path, name_or_path: str):
    """Resolve SPEC (a name under kernel_specs/ or a path) to a LoadedSpec."""
    from ..verifier.spec import SpecError, resolve_spec

    try:
        return resolve_spec(root, name_or_path)
    except SpecError as e:
        raise UsageError(str(e)) from None


def output_flag(check: Callable[..., T], *args, **kwargs) -> T:
    """``check(*args, **kwargs)``, one of the workspace's output-flag checks
    (:mod:`~coda_agent.verifier.workspace`); a path it refuses is a usage error."""
    try:
        return check(*args, **kwargs)
    except workspace.OutputPathError as e:
        raise UsageError(str(e)) from None


def has_gpu() -> bool:
    """Whether torch sees a CUDA device (commands that verify or measure need one)."""
    from ..verifier.gpu import environment

    return environment.cuda_available()

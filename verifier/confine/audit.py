"""A run-time tripwire under the static stage: the candidate's own frames may not run code,
walk frames or touch the OS (PEP 578 audit hook, installed in each worker before the import).

The static stage (:mod:`coda_agent.verifier.static`) is the wall: it decides what
candidate code may name before any of it runs. Python cannot be contained by an AST
check alone: a quack method that is ``getattr(obj, name)`` reaches
``torch.Tensor.__reduce_ex__.__func__.__globals__`` and from there the real ``exec``, which
can run eager torch math and patch the worker's timer (threat 20 of docs/threat-model.md;
``tests/verifier/corpus/getattr_gadget_exec.py``). The static stage refuses each such path
it knows; this module makes the next one of that kind fail at the step where arbitrary
code begins.

Design
------
* **Judged by the calling frame.** CPython raises an audit event before ``exec``,
  ``compile``, ``sys._getframe``, reads of frame/code attributes (``object.__getattr__``),
  ``open``, ``os.*``/``subprocess.*``/``ctypes.*``/``socket.*`` and more. The hook looks at
  the innermost Python frame, the code that called the audited function: if that code
  comes from the candidate's file, or was compiled from a string (``<string>``: what an
  ``exec`` of candidate text would run), the event is refused with
  :class:`CandidateAuditError`. The libraries' own frames are not judged: CuTeDSL compiles
  and ``exec``\\ s the candidate's epilogue after rewriting it, quack reads source files,
  torch opens its caches.
* **What it cannot see.** A library function that calls a callable it is handed (the
  candidate passes it ``exec`` itself) runs that call from a library frame; the static
  stage's ``library-callback`` rule and the value-attribute allow-list are the defence
  there. Nor does it see plain dict or list writes. It is a tripwire, not a sandbox: the
  OS-level confinement (Landlock, seccomp) and the parent's independent checks stay.
* **Imports after the import.** The candidate module's own top-level imports are the static
  stage's to judge; once it has run (:func:`seal`), an ``import`` event from candidate code
  or from code compiled from a string is refused as well (a module already loaded raises
  none: this only stops fresh loads).
* **Installed once, never removed.** Audit hooks cannot be removed; re-entry (the hook's
  own ``sys._getframe`` raises an event) is cut short by a thread-local flag.

Stdlib only: the compile worker imports this before torch.
"""

from __future__ import annotations

import sys
import threading

GUARDED_EVENTS = frozenset(
    {
        "exec",
        "compile",
        "open",
        "code.__new__",
        "function.__new__",
        "object.__getattr__",
        "object.__setattr__",
        "object.__delattr__",
        "builtins.id",
        "builtins.input",
        "marshal.loads",
        "marshal.load",
        "pickle.find_class",
        "sys._getframe",
        "sys._getframemodulename",
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.settrace",
        "sys.setprofile",
        "sys.addaudithook",
        "sys.excepthook",
        "sys.unraisablehook",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "cpython.run_command",
        "cpython.run_file",
    }
)
"""Audit events refused when candidate code raises them directly."""

GUARDED_PREFIXES = (
    "os.",
    "subprocess.",
    "ctypes.",
    "socket.",
    "shutil.",
    "_posixsubprocess.",
    "mmap.",
    "resource.",
    "signal.",
    "fcntl.",
    "importlib.",
    "urllib.",
    "http.",
)
"""Families of audit events refused the same way (process, file system, network, memory)."""


class CandidateAuditError(RuntimeError):
    """Raised inside the candidate's call when its own code raises a guarded audit event."""


_state = threading.local()
_sealed = threading.Event()  # set once the candidate module has been imported


def seal() -> None:
    """From now on ``import`` events are judged too (a fresh module load from candidate code,
    or from code compiled from a string: ``__import__`` in an evaluated string). Called right
    after the candidate's module ran: its own top-level imports are the static stage's."""
    _sealed.set()


def _untrusted(filename: str, candidate: str) -> bool:
    return filename == candidate or (filename.startswith("<") and not filename.startswith("<frozen"))


def install(candidate_file: str) -> None:
    """Refuse :data:`GUARDED_EVENTS` (and :data:`GUARDED_PREFIXES`) raised by code of
    ``candidate_file`` (the path the candidate is compiled under, as given to
    ``compile``) or by code compiled from a string. Call once per process, before the
    candidate is imported; raises :class:`CandidateAuditError` in the offending call."""

    def hook(event: str, args: tuple) -> None:
        if (
            event not in GUARDED_EVENTS
            and not event.startswith(GUARDED_PREFIXES)
            and not (event == "import" and _sealed.is_set())
        ):
            return
        if getattr(_state, "busy", False):
            return
        _state.busy = True
        try:
            frame = sys._getframe(1)
            filename = frame.f_code.co_filename if frame is not None else ""
        finally:
            _state.busy = False
        if _untrusted(filename, candidate_file):
            raise CandidateAuditError(
                f"candidate code raised the audit event {event!r} (at {filename}:"
                f"{frame.f_lineno}): candidates may not run code, walk frames or "
                "touch the OS"
            )

    sys.addaudithook(hook)

"""The candidate the verifier judges is one snapshot of its bytes, taken once.

The verifier reads a candidate in three places: the static stage parses its text, the
compile worker imports it, the candidate worker imports it again on the GPU. A read that
goes back to the file the caller named, through Python's import machinery, can run other
code than was judged: a ``__pycache__/candidate.cpython-3XX.pyc`` planted next to
``candidate.py`` (an *unchecked-hash* pyc is never compared with the source) is what the
import system runs, while static, the verdict's ``candidate_hash`` and ``accept`` all
speak of ``candidate.py``. In ``--llm manual`` mode the answerer writes into the run
folder, so a zeros-returning ``candidate.py`` with a correct pyc beside it would pass
correctness and be accepted, unverified (threat 26 of docs/threat-model.md;
``tests/verifier/test_pipeline_cpu.py``).

So, as one rule:

* :func:`take` reads the file's bytes once and writes them, read-only, into a fresh
  private folder the caller owns (outside any run folder); the verdict's
  ``candidate_hash`` is the sha256 of those bytes;
* every stage reads the snapshot, never the original: static its text, the workers its
  path plus the hash;
* the workers load it with :func:`load_module`: the bytes are read once, their sha256 must
  be the one the parent recorded, they are compiled from memory (no bytecode cache is
  read or written: no loader ever sees a ``__pycache__``), and ``linecache`` holds exactly
  those lines, read as ``linecache`` reads files, so ``inspect.getsource`` (quack's
  epilogue frontend keys its compile cache on an epilogue's source) and tracebacks see
  the text that ran.

The spec's own ``reference.py`` and ``liger.py`` load through :func:`load_module` too
(a pyc planted in ``kernel_specs/<k>/__pycache__/`` would replace the reference that
``spec_hash`` covers).

``accept`` copies the caller's file into the library only when its bytes still hash to
the verdict's ``candidate_hash``, so what is accepted is what was verified.

Stdlib only: the compile worker imports this before torch.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import io
import linecache
import os
import sys
import tokenize
import types
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Snapshot:
    """A candidate's bytes as the verifier judges them.

    ``path``: the private read-only copy (same file name as the original, so messages
    that shorten the path to its name read the same); ``sha256``: hex digest of the bytes;
    ``text``: the bytes decoded as Python source (PEP 263)."""

    path: Path
    sha256: str
    text: str


def take(candidate: str | Path, folder: str | Path) -> Snapshot:
    """Copy ``candidate``'s bytes (read once) into ``folder`` (which must exist and be the
    caller's own) as a read-only file of the same name. Raises ``FileNotFoundError`` /
    ``OSError`` when the file cannot be read, ``FileExistsError`` when ``folder`` already
    holds that name. Source that does not decode is kept byte for byte; its ``text`` is
    decoded with replacement characters (the static stage then reports it)."""
    candidate = Path(candidate)
    data = candidate.read_bytes()
    dest = Path(folder) / candidate.name
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return Snapshot(path=dest, sha256=hashlib.sha256(data).hexdigest(), text=_decode(data))


def _decode(data: bytes) -> str:
    try:
        return importlib.util.decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return data.decode("utf-8", errors="replace")


def _lines(data: bytes) -> list[str]:
    """The source lines exactly as ``linecache`` would read them from disk (``tokenize.open``:
    PEP 263 encoding, universal newlines). Not ``str.splitlines``: it also breaks at form
    feeds, U+2028 and the like, which the compiler does not, and ``inspect.getsource`` would
    then return another function's text."""
    try:
        enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return io.TextIOWrapper(io.BytesIO(data), enc, line_buffering=True).readlines()
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return []  # compile() raises for this source next


class CandidateChanged(ImportError):
    """The file a worker was asked to import no longer hashes to what the parent judged."""


def load_module(path: str | Path, name: str, sha256: str | None, *, follow_symlinks: bool = False) -> types.ModuleType:
    """Import the candidate at ``path`` as module ``name`` from its bytes, read once.

    ``sha256`` (hex) is what the parent recorded for the snapshot; a mismatch raises
    :class:`CandidateChanged` before any of it runs (``None`` skips the check: manual
    worker runs). The module is registered in ``sys.modules[name]`` before it executes
    (quack resolves epilogue mods by module name) and its source lines are put in
    ``linecache`` with no modification time, so they are never re-read from disk.
    A symlink at ``path`` is refused (``OSError``) unless ``follow_symlinks`` (the spec's
    own trusted files). Exceptions raised by the module's top-level code propagate unchanged."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW))
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise CandidateChanged(f"{path.name}: sha256 {digest[:12]} is not the judged candidate's {sha256[:12]}")
    filename = str(path)
    linecache.cache[filename] = (len(data), None, _lines(data), filename)
    code = compile(data, filename, "exec", dont_inherit=True)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=filename)
    sys.modules[name] = mod
    exec(code, mod.__dict__)  # noqa: S102 -- the untrusted candidate, in its confined worker
    return mod

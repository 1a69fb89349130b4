"""Where the living files are, and how they are written.

coda-agent works on a *workspace*: a checkout holding ``kernel_specs/``,
``generated_kernels/``, ``primitives_docs/`` and ``tricks_log.md`` (humans edit these;
the package never writes into site-packages). The workspace is ``$CODA_ROOT`` when set,
else the nearest folder at or above the current directory holding ``kernel_specs/``.

Every file the tool writes goes through :func:`atomic_write_text`/:func:`atomic_write_bytes`
(write a temporary file in the same folder, fsync, ``os.replace``), so an interrupted
run never leaves a half-written manifest or kernel behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class WorkspaceError(RuntimeError):
    """No workspace could be found (message says where it looked)."""


def find_root(start: str | Path | None = None) -> Path:
    """The workspace root: the first folder at or above ``start`` (the CLI's ``--root``)
    that holds ``kernel_specs/``; without ``start``, ``$CODA_ROOT``, else the first such
    folder at or above the current one (an explicit ``--root`` wins over the environment).
    Raises :class:`WorkspaceError` when none is found or ``start`` is not a folder."""
    env = os.environ.get("CODA_ROOT")
    if env and start is None:
        p = Path(env).resolve()
        if not (p / "kernel_specs").is_dir():
            raise WorkspaceError(f"CODA_ROOT={env}: no kernel_specs/ folder there")
        return p
    here = Path(start or Path.cwd()).resolve()
    if start is not None and not here.is_dir():
        raise WorkspaceError(f"--root {start}: " + ("not a folder" if here.exists() else "no such folder"))
    for d in (here, *here.parents):
        if (d / "kernel_specs").is_dir():
            return d
    raise WorkspaceError(
        f"no coda-agent workspace at or above {here} (a folder holding kernel_specs/); "
        "run from a checkout or set CODA_ROOT"
    )


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    return sha256_bytes(Path(path).read_bytes())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode())


def remove_tree(path: str | Path) -> None:
    """Delete ``path`` and everything beneath it, however deep; a symlink is removed, never
    followed; a missing path is fine. Raises ``OSError`` when something is left.

    Why not :func:`shutil.rmtree`: it recurses once per folder level, and a candidate's
    scratch folder 5000 levels deep (red team 2026-11-30) raised RecursionError in it, in
    ``os.walk`` and in ``TemporaryDirectory.cleanup`` (and past 4096 bytes of path no
    path-based walk works). coreutils' ``rm -rf`` handles any depth."""
    p = Path(path)
    if not os.path.lexists(p):
        return
    if p.is_symlink() or not p.is_dir():  # a file or a link: no process to start
        p.unlink()
        return
    rm = shutil.which("rm")
    if rm is not None:
        subprocess.run([rm, "-rf", "--", str(p)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, timeout=3600)
    else:
        try:
            shutil.rmtree(p, ignore_errors=True)
        except RecursionError:
            pass
    if os.path.lexists(p):
        raise OSError(f"could not remove {p}")

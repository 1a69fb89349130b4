"""Where the living files are, and how they are written.

coda-agent works on a *workspace*: a checkout holding ``kernel_specs/``,
``generated_kernels/``, ``primitives_docs/`` and ``tricks_log.md`` (humans edit these;
the package never writes into site-packages). The workspace is ``$CODA_ROOT`` when set,
else the nearest folder at or above the current directory holding ``kernel_specs/``.

Every file the tool writes goes through :func:`atomic_write_text`/:func:`atomic_write_bytes`
(write a temporary file in the same folder, fsync, ``os.replace``), so an interrupted
run never leaves a half-written manifest or kernel behind.

Output flags (``--json``, ``--out``) are checked before any work starts
(:func:`out_file`, :func:`out_dir`): their folder must exist, they never write into the
library or the specs (:data:`PROTECTED_DIRS`, of the workspace and of the installed
package), never onto the candidate being verified, and replace only an earlier output of
the same flag (:data:`OUTPUT_KINDS`).
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


class OutputPathError(WorkspaceError):
    """An output flag's path that is refused (message names the flag and what to do)."""


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
    scratch folder 5000 levels deep raises RecursionError in it, in ``os.walk`` and in
    ``TemporaryDirectory.cleanup`` (and past 4096 bytes of path no
    path-based walk works). coreutils' ``rm -rf`` handles any depth."""
    p = Path(path)
    if not os.path.lexists(p):
        return
    if p.is_symlink() or not p.is_dir():  # a file or a link: no process to start
        p.unlink()
        return
    rm = shutil.which("rm")
    if rm is not None:
        subprocess.run(
            [rm, "-rf", "--", str(p)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=3600,
        )
    else:
        try:
            shutil.rmtree(p, ignore_errors=True)
        except RecursionError:
            pass
    if os.path.lexists(p):
        raise OSError(f"could not remove {p}")


# --------------------------------------------------------------------------- output flags

PROTECTED_DIRS = ("generated_kernels", "kernel_specs")
"""Workspace folders no output flag may write into: the library (written only by
acceptance, old versions kept in history/) and the specs (written by hand)."""


def check_out_target(root: Path, p: Path, flag: str, value: str, keep: tuple[Path, ...] = ()) -> None:
    """:class:`OutputPathError` when output ``p`` lies in one of :data:`PROTECTED_DIRS` of ``root`` or is
    one of the ``keep`` files (the candidate being verified): a new user's ``--out
    generated_kernels/swiglu_bwd/kernel.py`` replaced an accepted kernel with a prompt."""
    try:
        target = p.resolve()
        kept = [k.resolve() for k in keep]
    except (OSError, RuntimeError) as e:  # a symlink loop (RuntimeError before Python 3.13)
        raise OutputPathError(f"{flag} {value}: cannot resolve the path ({e})") from None
    for name, d in protected_dirs(root):
        if target == d or d in target.parents:
            raise OutputPathError(
                f"{flag} {value}: inside {name}/ ({d}), which output flags never write "
                + (
                    "(accepted kernels change only through --accept)"
                    if name == "generated_kernels"
                    else "(specs are edited by hand)"
                )
                + "; choose a path outside it"
            )
    if target in kept:
        raise OutputPathError(f"{flag} {value}: is the candidate itself; choose another file")


def protected_dirs(root: Path) -> list[tuple[str, Path]]:
    """:data:`PROTECTED_DIRS` of the workspace ``root`` and of the installed package: the
    library ``import coda_agent.kernels`` loads is the package's, whatever --root or
    CODA_ROOT name (`CODA_ROOT=elsewhere prompt --out generated_kernels/swiglu_fwd/kernel.py`
    must not replace the installed kernel)."""
    import importlib.util

    here = Path(__file__).resolve().parents[1]  # the package root: the repository root in a source checkout
    out = [(name, (root / name).resolve()) for name in PROTECTED_DIRS]
    out += [(name, (here / name).resolve()) for name in PROTECTED_DIRS if (here / name).is_dir()]
    spec = importlib.util.find_spec("coda_agent.kernels")  # found without importing it (no torch)
    out += (
        [("generated_kernels", Path(loc).resolve()) for loc in (spec.submodule_search_locations or [])] if spec else []
    )
    return out


OUTPUT_KINDS = {
    # what an earlier output of each flag looks like: only such a file is replaced
    "prompt": ("a prompt written by `coda-agent prompt --out`", lambda text: text.startswith("=== SYSTEM ===")),
    "verdict": (
        "a verdict (or a list of them) written by `verify --json`",
        lambda text: _json_keys(text) >= {"stages", "passed", "gpu_verified"},
    ),
    "regress": (
        "a report written by `regress --json`",
        lambda text: _json_keys(text) >= {"rows", "tolerance", "cpu_only"},
    ),
}
"""Output kind -> (what it is, a test that an existing file's text is one)."""


def _json_keys(text: str) -> set[str]:
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return set()
    if isinstance(data, list) and data and all(isinstance(d, dict) for d in data):
        # a list of outputs (``verify SPEC FILE FILE ... --json``): the keys every item has
        return set.intersection(*(set(d) for d in data))
    return set(data) if isinstance(data, dict) else set()


def out_file(
    value: str | None,
    flag: str = "--json",
    root: Path | None = None,
    keep: tuple[Path, ...] = (),
    kind: str | None = None,
) -> Path | None:
    """Check an output file path before any work starts (a missing folder must not raise a
    traceback after a whole verification, with the exit status of a rejection); with
    ``root``, also that it writes nothing of the library or specs (:func:`check_out_target`);
    with ``kind`` (:data:`OUTPUT_KINDS`), that an existing file there is an earlier output of
    the same flag (`--json tricks_log.md` must not replace the lessons every prompt carries,
    nor `regress --json` a kept GPU verdict)."""
    if not value:
        return None
    p = Path(value)
    if p.is_dir():
        raise OutputPathError(f"{flag} {value}: is a folder; give a file name")
    if not p.parent.is_dir():
        raise OutputPathError(f"{flag} {value}: folder {p.parent} does not exist")
    if root is not None:
        check_out_target(root, p, flag, value, keep)
    if kind is not None and (p.exists() or p.is_symlink()):
        what, looks_like = OUTPUT_KINDS[kind]
        try:
            ok = p.is_file() and looks_like(p.read_text(errors="replace"))
        except OSError:
            ok = False
        if not ok:
            raise OutputPathError(
                f"{flag} {value}: exists and is not {what}; nothing was run. Remove it or "
                "choose another file (an output flag replaces only its own earlier output)"
            )
    return p


def out_dir(root: Path, value: str | None, flag: str = "--out") -> Path | None:
    """Check an output folder (``bench --out``): its parent must exist (as for every output
    flag: a typo is not created) and it writes nothing of the library or specs."""
    if not value:
        return None
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{flag} {value}: is a file; give a folder")
    if not p.is_dir() and not p.parent.is_dir():
        raise OutputPathError(f"{flag} {value}: folder {p.parent} does not exist")
    check_out_target(root, p, flag, value)
    return p


def write_out(path: Path, text: str, flag: str = "--json") -> None:
    """Write an output flag's file atomically; :class:`OutputPathError` names the flag when it fails."""
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise OutputPathError(f"{flag} {path}: {e.strerror or e}") from None

"""Where compiled kernels live between processes: quack's ``.o`` cache, in one folder per
(GPU architecture, versions).

quack exports every compiled kernel variant as an object file (``export_to_c``) and loads
it in about a millisecond on the next process's first use instead of tracing and
compiling again (about 0.5-3 s per variant): ``quack/cache/jit.py``. Its own key covers
the Python, cutlass-dsl, tvm-ffi and quack sources; this module adds the GPU architecture
and the torch version to the folder, so one cache directory may serve several
environments side by side, and fills it ahead of time (``coda-agent build``,
:mod:`coda_agent.verifier.library.build`).

The folder: ``$CODA_KERNEL_CACHE`` if set, else ``~/.cache/coda-agent/kernels``, then
``<arch>-cutlass<ver>-quack<ver>-torch<ver>-py<ver>`` (:func:`cache_dir`). A user's own
``QUACK_CACHE_DIR`` wins over both (quack reads it at import; :func:`configure` leaves it).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from pathlib import Path

ENV = "CODA_KERNEL_CACHE"


def _ver(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "none"


def env_key(arch: str) -> str:
    """``sm_90a-cutlass4.7.0-quack0.6.5-torch2.11.0-py3.12`` for ``arch``."""
    torch_ver = _ver("torch").split("+")[0]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"{arch}-cutlass{_ver('nvidia-cutlass-dsl')}-quack{_ver('quack-kernels')}-torch{torch_ver}-py{py}"


def current_arch() -> str:
    """``sm_90a`` on a Hopper GPU; ``$QUACK_ARCH`` (a, b appended as the DSL does) when set,
    for compiling without a GPU; ``cpu`` otherwise."""
    forced = os.environ.get("QUACK_ARCH")
    if forced:
        a = forced if forced.startswith("sm_") else f"sm_{forced}"
        return a + "a" if a in ("sm_90", "sm_100") else a
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major in (9, 10) else "")


def cache_dir(arch: str | None = None) -> Path:
    """The cache folder for ``arch`` (default :func:`current_arch`); not created."""
    root = Path(os.environ.get(ENV) or Path.home() / ".cache" / "coda-agent" / "kernels")
    return root / env_key(arch or current_arch())


def configure(arch: str | None = None) -> Path:
    """Point quack's ``.o`` cache at :func:`cache_dir` (created), unless ``QUACK_CACHE_DIR``
    is set; returns the folder in use. Safe to call repeatedly; call before the first compile."""
    import quack.cache as qc

    if os.environ.get("QUACK_CACHE_DIR"):
        return Path(os.environ["QUACK_CACHE_DIR"])
    d = cache_dir(arch)
    d.mkdir(parents=True, exist_ok=True)
    qc.CACHE_DIR = str(d)
    return d

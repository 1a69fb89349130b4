"""Shared glue helpers of ``coda_agent.kernels``: finding, importing and calling kernels.

Everything that a test may monkeypatch (``load``, ``_check_device``, ``KERNELS_DIR``) is
re-exported by the package and always looked up *through the package* at call time
(``_pkg.load(...)``), never bound at import: ``monkeypatch.setattr(coda_agent.kernels,
"load", ...)`` then reaches every op, whichever module defines it.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import torch

# The package itself (partially initialized while its __init__ imports this module; that
# is fine: its attributes are only read when an op is called).
_pkg = importlib.import_module(__package__)

KERNELS_DIR = Path(__file__).resolve().parent


def accepted() -> list[str]:
    """Names of the accepted kernels present in this package (folders with kernel.py)."""
    return sorted(p.parent.name for p in Path(_pkg.KERNELS_DIR).glob("*/kernel.py"))


def load(name: str):
    """Import ``generated_kernels/<name>/kernel.py``; raises ModuleNotFoundError naming it."""
    kdir = Path(_pkg.KERNELS_DIR)
    if not (kdir / name / "kernel.py").is_file():
        raise ModuleNotFoundError(
            f"no accepted kernel {name!r} in {kdir} (accepted: {_pkg.accepted()}); "
            f"run `coda-agent generate {name}`"
        )
    return importlib.import_module(f"{_pkg.__name__}.{name}.kernel")


def _check_device(op: str, *tensors: torch.Tensor) -> None:
    """The accepted kernels are sm_90 CUDA kernels: fail clearly on CPU or mixed devices."""
    devices = {t.device for t in tensors}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise ValueError(f"{op}: the fused kernels need all tensors on one CUDA (Hopper) device, got "
                         f"{', '.join(str(t.device) for t in tensors)}")


def _expect(cond: bool, op: str, msg: str) -> None:
    """Argument check of a public op: ValueError naming the op."""
    if not cond:
        raise ValueError(f"{op}: {msg}")


def run_kernel(name: str, *args, **constants):
    """Call the entry ``<name>`` of the accepted kernel ``<name>`` (through ``_pkg.load``),
    after ``_pkg._check_device`` on its tensor arguments (ValueError off CUDA).

    ``constants`` are the spec's keyword-only ints; only those the entry declares are
    passed (an entry with ``**kwargs`` gets them all), so the glue may offer a superset
    (e.g. HQ, HKV and HD where a spec lists only HQ and HKV). Returns the entry's result as
    a tuple (a single output returned bare becomes a 1-tuple)."""
    _pkg._check_device(name, *(a for a in args if isinstance(a, torch.Tensor)))
    fn = getattr(_pkg.load(name), name)
    if constants:
        params = inspect.signature(fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            constants = {k: v for k, v in constants.items() if k in params}
    out = fn(*args, **constants)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)

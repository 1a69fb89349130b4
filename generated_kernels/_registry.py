"""Shared glue helpers of ``coda_agent.kernels``: finding, importing and calling kernels.

Everything that a test may monkeypatch (``load``, ``_check_device``, ``_check_layout``,
``KERNELS_DIR``) is
re-exported by the package and always looked up *through the package* at call time
(``_pkg.load(...)``), never bound at import: ``monkeypatch.setattr(coda_agent.kernels,
"load", ...)`` then reaches every op, whichever module defines it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from pathlib import Path
from typing import Any

import torch

# The package itself (partially initialized while its __init__ imports this module; that
# is fine: its attributes are only read when an op is called).
assert __package__  # a submodule of coda_agent.kernels
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
            f"no accepted kernel {name!r} in {kdir} (accepted: {_pkg.accepted()}); run `coda-agent generate {name}`"
        )
    return importlib.import_module(f"{_pkg.__name__}.{name}.kernel")


def _check_device(op: str, *tensors: torch.Tensor, **named: torch.Tensor) -> None:
    """The accepted kernels are sm_90 CUDA kernels: ValueError naming ``op`` on CPU or mixed
    devices; the message names each keyword argument's device (``x=cpu, w1=cuda:0``)."""
    devices = {t.device for t in (*tensors, *named.values())}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        got = [str(t.device) for t in tensors] + [f"{k}={t.device}" for k, t in named.items()]
        raise ValueError(f"{op}: the fused kernels need all tensors on one CUDA (Hopper) device, got {', '.join(got)}")


@functools.lru_cache(maxsize=None)
def _device_info(index: int) -> tuple[str, tuple[int, int]]:
    """(name, compute capability) of CUDA device ``index``, asked once per device."""
    return torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index)


def _check_arch(op: str, device: torch.device) -> None:
    """ValueError unless ``device`` is a CUDA device of compute capability 9.0 (H100/H200):
    the kernels are compiled for sm_90a only. CPU devices (the tests' stand-ins) pass.
    Called inside the kernel custom ops (never traced by torch.compile)."""
    if device.type != "cuda":
        return
    name, cap = _device_info(device.index if device.index is not None else torch.cuda.current_device())
    if tuple(cap) != (9, 0):
        raise ValueError(
            f"{op}: the fused kernels are built for Hopper (sm_90a, compute capability 9.0); "
            f"{device} is {name} with capability {cap[0]}.{cap[1]}"
        )


def _expect(cond: bool, op: str, msg) -> None:
    """Argument check of a public op: ValueError naming the op.

    ``msg`` is a str or a zero-argument callable returning one, called only when the check
    fails: under ``torch.compile`` formatting a tensor size into a message would make
    dynamo specialize the graph on that size (one recompile per new M)."""
    if not cond:
        raise ValueError(f"{op}: {msg() if callable(msg) else msg}")


def _stat_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32, or wider for wider inputs (the tests' float64 stand-ins): norm statistics, loss
    and lse never run in 16 bits."""
    return torch.promote_types(t.dtype, torch.float32)


ROW_ALIGN_BYTES = 16
"""TMA needs every contiguous row a kernel reads or writes to start 16-byte aligned."""


def _check_layout(op: str, widths: dict | None = None, **args: tuple[torch.Tensor, torch.dtype]) -> None:
    """``name=(tensor, dtype)`` pairs: each tensor non-empty, of that dtype, contiguous, and
    (2-D) with rows a multiple of 16 bytes (8 bf16 elements); ``widths``: ``{what: n}``,
    bf16 output row widths that must be multiples of 8 too. That is the domain the verifier
    checked the kernels on. ValueError naming the op, the argument and what was expected.
    Looked up through the package (the CPU tests' float64 stand-ins switch it off)."""
    for name, (t, dtype) in args.items():
        _expect(t.dtype == dtype, op, lambda: f"{name} must be {dtype}, got {t.dtype}")
        _expect(t.numel() > 0, op, lambda: f"{name} is empty, shape {tuple(t.shape)}")
        _expect(
            t.is_contiguous(),
            op,
            lambda: (
                f"{name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); pass {name}.contiguous()"
            ),
        )
        if t.dim() == 2:
            _expect(
                t.shape[1] * t.element_size() % ROW_ALIGN_BYTES == 0,
                op,
                lambda: (
                    f"{name}'s rows must be a multiple of {ROW_ALIGN_BYTES} bytes "
                    f"({ROW_ALIGN_BYTES // t.element_size()} {dtype} elements) for TMA, got "
                    f"{t.shape[1]} columns"
                ),
            )
    for what, n in (widths or {}).items():
        _expect(
            n % (ROW_ALIGN_BYTES // 2) == 0,
            op,
            lambda: f"{what} = {n} must be a multiple of {ROW_ALIGN_BYTES // 2} (16-byte bf16 output rows for TMA)",
        )


def _arg_name(name: str, i: int, more: str = "") -> str:
    """``<param> (argument i[, more])`` for positional argument ``i`` of kernel ``name``'s
    entry, by the entry's signature (the spec's input names); ``argument i[ (more)]`` when it
    cannot be read. Only called to word an error (it imports the kernel module)."""
    extra = f", {more}" if more else ""
    params = _param_names(name)
    if params is not None and i < len(params):
        return f"{params[i]} (argument {i}{extra})"
    return f"argument {i}" + (f" ({more})" if more else "")


def _param_names(name: str) -> list[str] | None:
    """The parameter names of kernel ``name``'s entry, or None when they cannot be read
    (only called to word an error: it imports the kernel module)."""
    try:
        return list(inspect.signature(getattr(_pkg.load(name), name)).parameters)
    except Exception:  # a message helper: never mask the error being reported
        return None


def run_kernel(name: str, *args, **constants) -> tuple[Any, ...]:
    """Call the entry ``<name>`` of the accepted kernel ``<name>`` (through ``_pkg.load``),
    after ``_pkg._check_device`` on its tensor arguments (ValueError off CUDA), the
    architecture check (ValueError on a GPU other than sm_90) and a check that every tensor
    argument is contiguous and every floating one starts 16-byte aligned (ValueError), with
    the tensors' CUDA device made current.

    ``constants`` are the spec's keyword-only ints; only those the entry declares are
    passed (an entry with ``**kwargs`` gets them all), so the glue may offer a superset
    (e.g. HQ, HKV and HD where a spec lists only HQ and HKV). Returns the entry's result as
    a tuple (a single output returned bare becomes a 1-tuple)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        _pkg._check_device(f"{name} kernel", *tensors)
    except ValueError:
        # said again with the entry's argument names ("x=cpu, w1=cpu", not "cpu, cpu"); the
        # names are looked up only here, off the hot path
        params = _param_names(name) or []
        _pkg._check_device(
            f"{name} kernel",
            **{
                (params[i] if i < len(params) else f"argument {i}"): t
                for i, t in enumerate(args)
                if isinstance(t, torch.Tensor)
            },
        )
        raise
    device = tensors[0].device if tensors else torch.device("cpu")
    _check_arch(f"{name} kernel", device)
    for i, t in enumerate(args):
        if not isinstance(t, torch.Tensor):
            continue
        if not t.is_contiguous():
            raise ValueError(
                f"{name} kernel: {_arg_name(name, i)} must be contiguous, got shape "
                f"{tuple(t.shape)}, strides {t.stride()}"
            )
        # floating operands go to TMA as they are; index tensors (positions, target) are
        # converted by the kernels' host code, so a shifted slice of them is fine
        if t.is_floating_point() and t.data_ptr() % ROW_ALIGN_BYTES:
            raise ValueError(
                f"{name} kernel: {_arg_name(name, i, f'shape {tuple(t.shape)}')} starts "
                f"{t.data_ptr() % ROW_ALIGN_BYTES} bytes past a {ROW_ALIGN_BYTES}-byte boundary "
                f"(storage offset {t.storage_offset()}): TMA needs aligned operands; pass a .clone()"
            )
    fn = getattr(_pkg.load(name), name)
    if constants:
        params = inspect.signature(fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            constants = {k: v for k, v in constants.items() if k in params}
    # quack launches on the current device: make it the tensors' (they may be on cuda:1)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        out = fn(*args, **constants)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)

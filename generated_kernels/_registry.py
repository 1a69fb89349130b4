"""Shared glue helpers of ``coda_agent.kernels``: finding, importing and calling kernels.

Everything that a test may monkeypatch (``load``, ``_check_device``, ``_check_layout``,
``KERNELS_DIR``) is
re-exported by the package and always looked up *through the package* at call time
(``_pkg.load(...)``), never bound at import: ``monkeypatch.setattr(coda_agent.kernels,
"load", ...)`` then reaches every op, whichever module defines it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import torch

from . import _dispatch, _standard

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
    fn, accepts = entry(name)
    if constants and accepts is not None:
        constants = {k: v for k, v in constants.items() if k in accepts}
    if device.type == "cuda" and _dispatch.choose(name, _BOUND[name][4], args, device) == "standard":
        fn = _standard.compiled(name)
    # quack launches on the current device: make it the tensors' (they may be on cuda:1)
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            out = fn(*args, **constants)
    else:
        out = fn(*args, **constants)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


_BOUND: dict[str, tuple[Any, Any, frozenset[str] | None, dict, Any]] = {}
"""kernel name -> (module, bound entry, keyword names it accepts or None for **kwargs,
launchers by epilogue name, tuning Lookup or None): filled on first use, rebuilt when ``load`` returns another module."""


def entry(name: str) -> tuple[Any, frozenset[str] | None]:
    """Kernel ``name``'s entry as training runs it: every epilogue mod behind a launcher
    (:func:`coda_agent.runtime.launch.bind_entry`) that takes this GPU's tuned config from
    ``tuning.json`` (entries for this kernel's sha256 only) and launches through a cached
    ``EpiPlan``. Returns ``(fn, accepted keyword names or None)``.

    ``CODA_LAUNCH=mod`` (benchmarks only) returns the module's own entry instead: each mod
    called through ``EpiMod.__call__`` with the kernel's own configs and no routing (the
    launch path before launchers, for same-run baselines). Read once per kernel per process."""
    hit = _BOUND.get(name)
    # Rationale: the hot path skips load()'s stat + import lookup (~50 us a call); tests that
    # swap load() or KERNELS_DIR take the full path.
    if (
        hit is not None
        and _pkg.load is load
        and _pkg.KERNELS_DIR == KERNELS_DIR
        and sys.modules.get(f"{_pkg.__name__}.{name}.kernel") is hit[0]
    ):
        return hit[1], hit[2]
    module = _pkg.load(name)
    if hit is not None and hit[0] is module:
        return hit[1], hit[2]
    if os.environ.get("CODA_LAUNCH", "plan") not in ("plan", "mod"):
        raise ValueError(f"CODA_LAUNCH must be 'plan' or 'mod', got {os.environ['CODA_LAUNCH']!r}")
    from ..runtime import cache, tuning
    from ..runtime.launch import bind_entry

    config_for = lookup = None
    path = getattr(module, "__file__", None)
    if path is not None and Path(path).is_file() and Path(path).parent.parent == Path(_pkg.KERNELS_DIR):
        import hashlib

        sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        lookup = tuning.Lookup(tuning.load(Path(_pkg.KERNELS_DIR) / tuning.TABLE_NAME), name, sha)
        config_for = lookup.config_for if lookup else None
        lookup = lookup or None
        cache.configure()
    if os.environ.get("CODA_LAUNCH") == "mod":  # benchmarks' same-run baseline: EpiMod.__call__, own configs
        fn, launchers, lookup = getattr(module, name), {}, None
    else:
        fn, launchers = bind_entry(module, name, config_for)
    params = inspect.signature(fn).parameters
    accepts = None if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) else frozenset(params)
    _BOUND[name] = (module, fn, accepts, launchers, lookup)
    return fn, accepts


def tile_widths(name: str) -> set[int]:
    """Every N-tile width kernel ``name`` may run with: its module's ``CFG.tile_n`` and each
    tuned config's in ``tuning.json``. Empty when the module declares no ``CFG``."""
    entry(name)
    module, lookup = _BOUND[name][0], _BOUND[name][4]
    tile = getattr(getattr(module, "CFG", None), "tile_n", None)
    if not (isinstance(tile, int) and tile > 0):
        return set()
    return {tile} | (lookup.tile_widths() if lookup else set())


def launchers(name: str) -> dict:
    """The launchers of kernel ``name``'s bound entry, by epilogue name (for benchmarks)."""
    entry(name)
    return _BOUND[name][3]

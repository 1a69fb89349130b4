"""Per call: the fused kernel or the standard path, as the tuning table routes its shape.

``run_kernel(name, ...)`` asks :func:`choose` before launching. The answer comes from the
tuning table (``tuning.json``, :mod:`coda_agent.runtime.tuning`): an entry of this kernel's
accepted hash, this GPU and the call's bucket (:func:`~coda_agent.runtime.tuning.call_bucket`)
with ``route = "standard"`` sends the call to :mod:`._standard` (cuBLAS + the compiled
elementwise pass), because at that shape the tuner measured the fused kernel slower than it
in the same run. No entry: the fused kernel.

``CODA_ROUTE`` overrides the table for benchmarks: ``fused`` (every call fused),
``standard`` (every routable call standard), ``table`` (the default). Any other value is a
ValueError naming the variable.

# Rationale: the decision is per entry call (a dict hit after the first call of a shape),
# made inside the op body; a training op keeps one custom op per kernel, so a graph
# compiled before a table change still takes the table's route at run time.
"""

from __future__ import annotations

import os

import torch

from . import _standard

_ROUTES: dict[tuple, str] = {}


def mode() -> str:
    """``CODA_ROUTE`` (module docstring), validated."""
    m = os.environ.get("CODA_ROUTE", "table")
    if m not in ("fused", "standard", "table"):
        raise ValueError(f"CODA_ROUTE must be 'fused', 'standard' or 'table', got {m!r}")
    return m


def choose(name: str, lookup, args: tuple, device: torch.device) -> str:
    """``"fused"`` or ``"standard"`` for this call of kernel ``name`` (``lookup``: its
    :class:`~coda_agent.runtime.tuning.Lookup`, or None when it has no entries)."""
    m = mode()
    if m == "fused" or name not in _standard.routable():
        return "fused"
    if m == "standard":
        return "standard"
    if not lookup:
        return "fused"
    from ..runtime.tuning import call_bucket

    key = (name, tuple((a.shape, a.stride()) if isinstance(a, torch.Tensor) else a for a in args), device)
    r = _ROUTES.get(key)
    if r is None:
        r = _ROUTES[key] = lookup.route(call_bucket(args), device)
    return r


def clear() -> None:
    """Forget cached routes (after the table or ``CODA_ROUTE`` changes in-process)."""
    _ROUTES.clear()

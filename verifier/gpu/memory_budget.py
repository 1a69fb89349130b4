"""A GPU worker's memory budget: the most device memory its caching allocator may hold.

Why: verifications that share a GPU must not take each other's memory. The scheduler
(``verifier/schedule/``) cuts a GPU into budgets whose sum fits it and writes each
verification's budget into its plan (``Plan.memory_budget``); both workers apply it with
``torch.cuda.set_per_process_memory_fraction`` before any candidate code runs, and the
allocator poison (:func:`~coda_agent.verifier.gpu.poison.fill_free_memory`) sizes its slack
from the budget, never from the device's free memory (which another process may take
between the read and the allocation). An allocation past the budget raises
``torch.OutOfMemoryError`` in the process that made it, never in a neighbour.

Memory outside torch's allocator (the CUDA context, cuBLAS and CUTLASS module memory) is
not counted: the scheduler keeps :data:`PROCESS_OVERHEAD` per worker outside the budgets.
"""

from __future__ import annotations

import torch

ALONE_SHARE = 0.9
"""Share of the device's memory a worker takes when its plan names no budget (a
verification alone on its GPU); the rest is for the context and library module memory."""

PROCESS_OVERHEAD = 2 << 30
"""Device memory a worker process holds outside torch's allocator (context, cuBLAS
workspace, compiled modules), kept free beside every budget (bytes). Measured: a worker's
CUDA context with cuBLAS and quack's GEMM modules loaded is 0.6-1.0 GiB on an H100/H200."""

# bound when the worker imports this module, before any candidate code runs
_set_fraction = torch.cuda.set_per_process_memory_fraction
_properties = torch.cuda.get_device_properties
_current_device = torch.cuda.current_device


def apply(device: torch.device, budget: int | None) -> int:
    """Cap this process's caching allocator on ``device`` at ``budget`` bytes (None:
    :data:`ALONE_SHARE` of the device; a budget over the device's memory is cut to it).
    Returns the budget applied, in bytes. CUDA devices only (``cuda`` without an index is
    the current device: the worker's plan names its device that way); raises ``ValueError``
    for a budget <= 0."""
    # Rationale: set_per_process_memory_fraction refuses a torch.device without an index.
    index = _current_device() if device.index is None else device.index
    total = int(_properties(index).total_memory)
    if budget is not None and budget <= 0:
        raise ValueError(f"memory budget must be > 0 bytes, got {budget}")
    applied = int(total * ALONE_SHARE) if budget is None else min(int(budget), total)
    _set_fraction(applied / total, index)
    return applied

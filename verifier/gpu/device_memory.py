"""How much device memory one call holds beyond its inputs and outputs: its *workspace*.

Why it is measured: a fused GEMM-epilogue op exists so that the GEMM's (M, N) output never
reaches global memory as an intermediate (the RMSNorm scale, the online LSE, the SwiGLU
gate are applied while the tile is in registers). The launch budget alone does not see
an op that materializes that intermediate and finishes in a few torch launches the spec
allows for a finalize: gemm_cross_entropy's full fp32 logits stored with an identity
epilogue and reduced with the spec's ``torch.logsumexp`` fit its 13 launches
(tests/verifier/corpus/materialized_logits.py). The spec says "logits are never materialized"; this makes it checked.

How: the caching allocator's ``requested_bytes`` statistics (exact request sizes, not
rounded block sizes). :func:`mark` resets the peak right before the call and returns the
bytes then in use (the inputs, the harness' own tensors); after the call and a
synchronize, :func:`workspace_since` is ``peak - mark - bytes of the returned tensors``:
the largest amount of temporary memory alive at any moment of the call (transients the
call freed again included). Allocations outside torch's allocator (the driver's module
memory, CUTLASS's own device allocations) are not seen; candidate code reaches device
memory through ``torch.empty`` only (the static stage allows nothing else). The budget is
the spec's (:meth:`coda_agent.verifier.spec.KernelSpec.workspace_budget`); the
correctness stage judges it on every correctness trial and recheck, the bench stage on the
profiled call and the unprofiled call after timing at every benchmark shape (measuring
only profiled calls would let code that can tell the profiler is on behave only there).
"""

from __future__ import annotations

from typing import Any

import torch

_STAT = "requested_bytes.all"
# bound when the worker imports this module, before any candidate code runs
_reset_peak = torch.cuda.reset_peak_memory_stats
_memory_stats = torch.cuda.memory_stats


def mark(device: torch.device) -> int:
    """Reset the allocator's peak statistics on ``device``; return the bytes in use now."""
    _reset_peak(device)
    return int(_memory_stats(device).get(f"{_STAT}.current", 0))


def returned_bytes(result: Any) -> int:
    """Bytes of the tensors a call returned (a tensor, or a tuple/list of them)."""
    outs = result if type(result) in (tuple, list) else [result]
    return sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))


def workspace_since(device: torch.device, start: int, result: Any) -> int:
    """Peak bytes requested since :func:`mark` returned ``start``, less ``start`` and the
    returned tensors' bytes (never negative). Call after the call's work is synchronized."""
    peak = int(_memory_stats(device).get(f"{_STAT}.peak", 0))
    return max(0, peak - start - returned_bytes(result))

"""The candidate worker's measuring instruments, captured before any other import.

Imported first by :mod:`~coda_agent.verifier.gpu.worker_candidate`, before anything else
(and long before the candidate) can touch them: the timer, the exact ``torch.Tensor`` type
and the tensor and storage methods the worker checks and copies outputs with, CUDA events
and synchronize, the sync-debug switch, the profiler and ``triton.testing.do_bench``.
:data:`WATCHED` re-reads each at the end of the run; the worker names every one that is no
longer what :data:`SNAPSHOT` holds (``harness-tampered``).
"""

from __future__ import annotations

import time as _time

_perf_counter = _time.perf_counter
_T0 = _perf_counter()  # records carry seconds since the worker started ("t")

from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
import torch.profiler  # noqa: E402

_Tensor = torch.Tensor
# Tensor methods the worker checks and copies outputs and inputs with, unbound, captured
# before candidate code runs: an output can carry an instance attribute named like a method
# (``o.detach = lambda: ...``: methods are non-data descriptors, so the instance wins) and
# a class-level patch may be undone before the end-of-run integrity check. Attributes such
# as shape/dtype/device are data descriptors: safe.
_T = {
    m: getattr(torch.Tensor, m)
    for m in (
        "detach",
        "reshape",
        "index_select",
        "to",
        "numel",
        "is_contiguous",
        "stride",
        "untyped_storage",
        "view",
        "element_size",
        "sum",
        "storage_offset",
    )
}
_S_data_ptr, _S_nbytes = torch.UntypedStorage.data_ptr, torch.UntypedStorage.nbytes
_set_sync_debug_mode = torch._C._cuda_set_sync_debug_mode if hasattr(torch._C, "_cuda_set_sync_debug_mode") else None
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_profile = torch.profiler.profile
_Activity = torch.profiler.ProfilerActivity
_DeviceTypeCUDA = torch.autograd.DeviceType.CUDA  # pyright: ignore[reportPrivateImportUsage]  (public, not in torch.autograd's __all__)
try:  # triton is absent from CPU torch installs; the CPU path (tests) does not need it
    import triton.testing as _triton_testing

    _do_bench = _triton_testing.do_bench
except Exception:  # noqa: BLE001
    _triton_testing = None
    _do_bench = None

WATCHED: dict[str, Callable[[], Any]] = {
    "time.perf_counter": lambda: _time.perf_counter,
    "torch.Tensor": lambda: torch.Tensor,
    "torch.cuda.Event": lambda: torch.cuda.Event,
    "torch.cuda.Event.record": lambda: torch.cuda.Event.record,
    "torch.cuda.Event.elapsed_time": lambda: torch.cuda.Event.elapsed_time,
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize,
    "torch.profiler.profile": lambda: torch.profiler.profile,
    "torch.cuda.set_sync_debug_mode": lambda: torch.cuda.set_sync_debug_mode,
    "triton.testing.do_bench": lambda: None if _triton_testing is None else _triton_testing.do_bench,
    **{f"torch.Tensor.{m}": (lambda m=m: getattr(torch.Tensor, m)) for m in _T},
}
SNAPSHOT = {k: f() for k, f in WATCHED.items()}

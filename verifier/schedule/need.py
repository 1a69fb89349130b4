"""How much GPU memory one verification's workers need: the scheduler's estimate.

A verification's workers run one after the other (candidate, then reference), each holding
at its peak, per shape it runs:

* correctness and coverage trials (one at a time): the inputs and outputs, the call's
  workspace (at most the spec's budget), and on the reference side fp32 copies of
  everything plus autograd's saved tensors: :data:`TRIAL_FACTOR` x the entry's tensor bytes;
* a benchmark shape: the rotated input sets (``rotation_count``) plus the same trial
  footprint for the call, its outputs and the baselines' (torch.compile, quack, Liger).

The estimate is the largest of these, plus :data:`POISON_FLOOR` so that the allocator
poison has slack to lay, rounded up to 1 GiB. Coverage shapes are drawn from the secret at
verification time; the estimate draws them once with a fixed secret (the same rules bound
their sizes).

# Rationale: an estimate that is too low costs no false reject: an allocation over the
# budget raises OutOfMemoryError in a shared run, which the scheduler runs again alone on
# the GPU with all its memory (verifier/schedule/retry.py). Too high only runs fewer
# verifications side by side.
"""

from __future__ import annotations

from typing import Any

from ..gpu.inputs import rotation_count, tensor_bytes
from ..gpu.runs import make_bench_shapes, make_runs
from ..spec import LoadedSpec

TRIAL_FACTOR = 4
"""Device bytes of one trial per byte of the entry's tensors (inputs, outputs, workspace,
the reference side's fp32 copies and saved tensors)."""
POISON_FLOOR = 1 << 30
"""Bytes added so that the poison's slack (half the room left in the budget) is never empty."""
GIB = 1 << 30


def memory_need(loaded: LoadedSpec, *, bench: bool, bench_shapes: list[Any] | None = None) -> int:
    """Estimated peak bytes of device memory one worker of a verification of ``loaded``
    holds in torch's allocator (see the module docstring); ``bench``: the benchmark shapes
    are run too (``bench_shapes`` overrides the spec's, as in ``verify``). Raises
    ``ValueError`` for an unknown bench shape name."""
    spec = loaded.spec
    peak = 0
    for run in make_runs(spec, secret=1, device="cuda"):
        peak = max(peak, TRIAL_FACTOR * tensor_bytes(spec, run.dims))
    if bench:
        for bs in make_bench_shapes(spec, bench_shapes):
            sets = rotation_count(tensor_bytes(spec, bs.dims, "inputs"))
            footprint = sets * tensor_bytes(spec, bs.dims, "inputs") + TRIAL_FACTOR * tensor_bytes(spec, bs.dims)
            peak = max(peak, footprint)
    need = peak + POISON_FLOOR
    return -(-need // GIB) * GIB

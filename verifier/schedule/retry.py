"""Which GPU runs the scheduler runs again, and what a re-run decides.

The verifier's own trouble must never be charged to a candidate, and a candidate must never
be able to turn its rejection into "the verifier's trouble" (an attempt not spent, a loop
that stops, ``verify`` exiting 2 instead of 1). The rules:

1. **A verifier error** (a GPU stage with status ``error``: a worker that did not start,
   a setup or self-test that failed, input generation before the import, the reference
   worker failing, records lost) is run again, at most :attr:`RetryPolicy.errors` times,
   the last time alone on the GPU. Still an error then: the verdict says ``error``, as
   without a scheduler. Only the worker's records written *before* the candidate is
   imported, and the trusted reference worker, can make an error
   (``stages/correctness.py``'s prologue refuses a later claim: ``harness-tampered``).
2. **A failure that sharing a GPU can cause**, in a run that shared its GPU: the
   candidate worker hung (timeout), was killed by a signal, or died with an out-of-memory
   error (:data:`OOM_MARKERS` in its message: the allocator's ``OutOfMemoryError``, the
   poison's ``PoisonError``, cuBLAS's allocation failure), wherever it happened, in the
   harness or in the candidate's call. The verification is run again **alone** on a GPU
   with :data:`~coda_agent.verifier.gpu.memory_budget.ALONE_SHARE` of its memory, once.
3. **The alone re-run's verdict is final**, judged like any verification alone: an
   out-of-memory error inside the candidate's own call, or a hang, is the candidate's
   ``crash``/``hang``.

Why this cannot be gamed: rule 2 reads text the candidate can write (its stderr, its
exception), so it only ever buys a re-run, never a verdict; the re-run gets the whole GPU
and nothing else runs there, so what fails in it fails as it always did. A candidate that
fakes an out-of-memory error costs one more run of itself, no more
(tests/verifier/test_schedule_cpu.py shows both directions).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..verdict import Verdict

GPU_STAGES = ("correctness", "gradients", "bench")
OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "cuda_error_out_of_memory",
    "cudaerrormemoryallocation",
    "cublas_status_alloc_failed",
    "poisonerror",
    "killed by sigkill",
)
"""Lower-case texts that mark a worker failure as possibly caused by memory contention
(``killed by SIGKILL``: the kernel's out-of-memory killer)."""
CONTENTION_KINDS = ("crash", "hang", "cuda-error")
"""Finding kinds of a worker that did not finish (``gpu/results.py``'s ``OUTCOME_KINDS``)."""


@dataclass(frozen=True)
class RetryPolicy:
    """``errors``: re-runs of a verifier error (the last one alone); ``alone``: re-runs
    alone after a failure a shared GPU can cause (rule 2)."""

    errors: int = 2
    alone: int = 1


def retry_reason(verdict: Verdict) -> tuple[str, str] | None:
    """Why ``verdict``'s GPU run may have failed for the verifier's or the machine's sake:
    ``("error", summary)`` for a verifier error in a GPU stage (rule 1), ``("contention",
    what)`` for a worker that hung, was killed or ran out of memory (rule 2), else None."""
    failed = verdict.failed_stage
    if failed is None or failed.stage not in GPU_STAGES:
        return None
    if failed.status == "error":
        return "error", failed.summary or "verifier error"
    for f in failed.findings:
        if f.kind == "hang":
            return "contention", "the candidate worker timed out"
        if f.kind in CONTENTION_KINDS:
            text = f.message.lower()
            hit = next((m for m in OOM_MARKERS if m in text), None)
            if hit is not None:
                return "contention", f"the candidate worker died ({hit})"
    return None

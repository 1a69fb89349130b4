"""Where one verification's GPU workers run: which GPU, within which memory budget.

The scheduler (``verifier/schedule/``) decides it; :func:`~coda_agent.verifier.pipeline.verify`
applies it: both workers are started with ``CUDA_VISIBLE_DEVICES`` naming the GPU (each
sees it as ``cuda:0``) and the plan carries the budget (:mod:`memory_budget`). A
verification without a placement runs on whatever GPU the process sees first, alone, with
:data:`~coda_agent.verifier.gpu.memory_budget.ALONE_SHARE` of its memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """``visible_device``: the ``CUDA_VISIBLE_DEVICES`` entry of the GPU (None: the
    process's own); ``memory_budget``: bytes each worker may hold in torch's caching
    allocator (None: the worker's default share); ``exclusive``: no other verification runs
    on that GPU meanwhile (timings are taken only so); ``gpu``: a label for the verdict
    (index and name); ``shared_with``: the most verifications on the GPU at once when the
    lease was granted (1 when exclusive)."""

    visible_device: str | None = None
    memory_budget: int | None = None
    exclusive: bool = True
    gpu: str = ""
    shared_with: int = 1

    def describe(self) -> str:
        """One line for the verdict's ``environment.placement``."""
        where = self.gpu or "the first visible GPU"
        budget = "" if self.memory_budget is None else f", budget {self.memory_budget / 2**30:.1f} GiB"
        how = "alone" if self.exclusive else f"shared (up to {self.shared_with} verifications)"
        return f"{where}, {how}{budget}"

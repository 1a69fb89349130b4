"""Many verifications at once over every visible GPU: the scheduler.

=====================  =================================================================
module                 job
=====================  =================================================================
``devices``            the visible GPUs (probed in a subprocess), stand-ins for tests
``need``               one verification's estimated GPU memory
``pool``               leases: shared slots (correctness runs side by side) and exclusive
                       GPUs (every timing), host-wide ``flock`` per GPU
``retry``              which runs are run again, and why the candidate cannot game it
``scheduler``          :class:`Scheduler`: CPU stages, screening, the full run, re-runs
``ray_executor``       the GPU runs as Ray tasks with GPU resources (``--ray``)
=====================  =================================================================

Each GPU worker runs within the memory budget its lease gives
(:mod:`~coda_agent.verifier.gpu.memory_budget`); the workers are the pipeline's own confined
subprocesses, started by :func:`~coda_agent.verifier.pipeline.verify` (locally, or inside a
Ray task), so the process that judges never imports candidate code.
"""

from .devices import Gpu, fake_gpus, visible_gpus
from .pool import GpuPool, Lease
from .retry import RetryPolicy, retry_reason
from .scheduler import Job, LocalExecutor, Scheduler, make_scheduler

__all__ = [
    "Gpu",
    "GpuPool",
    "Job",
    "Lease",
    "LocalExecutor",
    "RetryPolicy",
    "Scheduler",
    "fake_gpus",
    "make_scheduler",
    "retry_reason",
    "visible_gpus",
]

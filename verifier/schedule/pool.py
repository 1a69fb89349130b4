"""Leases on GPUs: which verification runs where, within which memory budget, alone or not.

Two kinds of lease:

* **shared**: one of ``per_gpu`` equal memory slots of a GPU (:meth:`GpuPool.slot_bytes`);
  for the correctness-only GPU runs (screening, ``--no-bench``). Up to ``per_gpu`` of them
  run on one GPU at once, each worker capped at its slot by the allocator
  (:mod:`~coda_agent.verifier.gpu.memory_budget`).
* **exclusive**: the whole GPU (:data:`~coda_agent.verifier.gpu.memory_budget.ALONE_SHARE`
  of its memory); for every run that times (the benchmark stage), a verification too large
  for a slot, and the re-runs of verifications that met trouble in a shared run. Nothing
  else of coda-agent runs on that GPU meanwhile, so timings stay what they are alone.

An exclusive request is served first: once one waits for a GPU, no new shared lease is
granted there (a stream of shared leases would starve it).

Host-wide: every lease of a real GPU also holds a ``flock`` on
``<lock dir>/<GPU uuid>.lock`` (:data:`LOCK_DIR_ENV`, default ``/tmp/coda-agent-gpu-locks``):
shared leases ``LOCK_SH``, exclusive ones ``LOCK_EX``. So two ``coda-agent`` processes on one
machine (two ``verify`` commands side by side) never time on a GPU the other is using, and a
lone ``verify`` waits for the GPU instead of running out of memory beside another. Fake GPUs
(the CPU test device) take no lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .. import progress
from ..gpu.memory_budget import ALONE_SHARE, PROCESS_OVERHEAD
from ..gpu.placement import Placement
from .devices import Gpu

LOCK_DIR_ENV = "CODA_GPU_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/coda-agent-gpu-locks"
DEFAULT_PER_GPU = 4
"""Verifications sharing one GPU at most (correctness-only runs)."""
LOCK_POLL_S = 0.2


@dataclass
class Lease:
    """A granted lease: the GPU, the budget (bytes), whether it is the GPU's alone, and how
    many leases the GPU held when it was granted (this one included)."""

    gpu: Gpu
    budget: int
    exclusive: bool
    shared_with: int
    fd: int | None = None
    granted_at: float = field(default_factory=time.monotonic)

    def placement(self) -> Placement:
        """What :func:`~coda_agent.verifier.pipeline.verify` needs to run on this lease."""
        return Placement(
            visible_device=self.gpu.visible_id,
            memory_budget=self.budget,
            exclusive=self.exclusive,
            gpu=self.gpu.label,
            shared_with=self.shared_with,
        )


@dataclass
class _State:
    shared: int = 0
    exclusive: bool = False
    draining: int = 0  # exclusive requests waiting for this GPU


@dataclass
class PoolStats:
    """What the pool did: leases granted per GPU, the most leases one GPU held at once, and
    how many of the leases were exclusive."""

    leases: dict[int, int] = field(default_factory=dict)
    most_at_once: dict[int, int] = field(default_factory=dict)
    exclusive: int = 0


class GpuPool:
    """Thread-safe leases on ``gpus`` (see the module docstring). ``per_gpu``: shared leases
    per GPU at most; ``lock_dir``: where the host-wide locks live (default
    ``$CODA_GPU_LOCK_DIR`` or :data:`DEFAULT_LOCK_DIR`). Raises ``ValueError`` for no GPUs
    or ``per_gpu`` < 1."""

    def __init__(self, gpus: list[Gpu], per_gpu: int = DEFAULT_PER_GPU, lock_dir: str | Path | None = None):
        if not gpus:
            raise ValueError("a GPU pool needs at least one GPU")
        if per_gpu < 1:
            raise ValueError(f"per_gpu must be >= 1, got {per_gpu}")
        self.gpus = list(gpus)
        self.per_gpu = per_gpu
        self.lock_dir = Path(lock_dir or os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
        self._state = {g.index: _State() for g in self.gpus}
        self._cond = threading.Condition()
        self.stats = PoolStats()

    # -- sizes ------------------------------------------------------------------------
    def slot_bytes(self, gpu: Gpu) -> int:
        """The budget of a shared lease on ``gpu``: an equal share of its memory after every
        worker's :data:`PROCESS_OVERHEAD` (CUDA context, library modules)."""
        return max(0, (gpu.total_bytes - self.per_gpu * PROCESS_OVERHEAD) // self.per_gpu)

    @staticmethod
    def alone_bytes(gpu: Gpu) -> int:
        """The budget of an exclusive lease on ``gpu``."""
        return int(gpu.total_bytes * ALONE_SHARE)

    def fits_shared(self, need: int) -> bool:
        """Whether a verification needing ``need`` bytes fits a shared slot of some GPU."""
        return any(need <= self.slot_bytes(g) for g in self.gpus)

    # -- leases -------------------------------------------------------------------------
    def acquire(self, need: int, exclusive: bool) -> Lease:
        """Block until a lease is granted: exclusive when asked or when ``need`` (bytes) fits
        no shared slot, else shared. Returns the :class:`Lease` (release it with
        :meth:`release`, or use :meth:`lease`)."""
        exclusive = exclusive or not self.fits_shared(need)
        with self._cond:
            if exclusive:
                gpu = min(self.gpus, key=lambda g: (self._busy(g), self._state[g.index].draining, g.index))
                st = self._state[gpu.index]
                st.draining += 1
                try:
                    self._cond.wait_for(lambda: st.shared == 0 and not st.exclusive)
                finally:
                    st.draining -= 1
                st.exclusive = True
                lease = Lease(gpu, self.alone_bytes(gpu), True, 1)
            else:
                gpu = self._cond_wait_shared(need)
                st = self._state[gpu.index]
                st.shared += 1
                lease = Lease(gpu, self.slot_bytes(gpu), False, st.shared)
            self._count(lease)
        try:
            lease.fd = self._host_lock(lease)
        except BaseException:
            self._unregister(lease)
            raise
        return lease

    def _cond_wait_shared(self, need: int) -> Gpu:
        def pick() -> Gpu | None:
            open_ = [
                g
                for g in self.gpus
                if need <= self.slot_bytes(g)
                and not self._state[g.index].exclusive
                and self._state[g.index].draining == 0
                and self._state[g.index].shared < self.per_gpu
            ]
            return min(open_, key=lambda g: (self._state[g.index].shared, g.index)) if open_ else None

        while (gpu := pick()) is None:
            self._cond.wait()
        return gpu

    def _busy(self, g: Gpu) -> int:
        st = self._state[g.index]
        return st.shared + (self.per_gpu if st.exclusive else 0)

    def _count(self, lease: Lease) -> None:
        i = lease.gpu.index
        self.stats.leases[i] = self.stats.leases.get(i, 0) + 1
        held = 1 if lease.exclusive else self._state[i].shared
        self.stats.most_at_once[i] = max(self.stats.most_at_once.get(i, 0), held)
        self.stats.exclusive += int(lease.exclusive)

    def release(self, lease: Lease) -> None:
        """Give ``lease`` back (its host lock first)."""
        if lease.fd is not None:
            os.close(lease.fd)  # closing the descriptor drops its flock
            lease.fd = None
        self._unregister(lease)

    def _unregister(self, lease: Lease) -> None:
        with self._cond:
            st = self._state[lease.gpu.index]
            if lease.exclusive:
                st.exclusive = False
            else:
                st.shared -= 1
            self._cond.notify_all()

    @contextmanager
    def lease(self, need: int, exclusive: bool) -> Iterator[Lease]:
        """:meth:`acquire` ... :meth:`release` as a context manager."""
        lease = self.acquire(need, exclusive)
        try:
            yield lease
        finally:
            self.release(lease)

    # -- host-wide lock ------------------------------------------------------------------
    def _host_lock(self, lease: Lease) -> int | None:
        """Take the GPU's host-wide ``flock`` (shared or exclusive), waiting for other
        processes; None for a fake GPU. The file is opened without following a symlink."""
        if lease.gpu.fake:
            return None
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        path = self.lock_dir / f"{lease.gpu.uuid}.lock"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        mode = fcntl.LOCK_EX if lease.exclusive else fcntl.LOCK_SH
        waited = False
        try:
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    if not waited:
                        progress.note(f"waiting for {lease.gpu.label}: another coda-agent process is using it")
                        waited = True
                    time.sleep(LOCK_POLL_S)
        except BaseException:
            os.close(fd)
            raise

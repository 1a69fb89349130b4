"""The GPUs a scheduler may use: what this process sees, named so a worker can be pinned.

:func:`visible_gpus` asks a short-lived subprocess (``python -m
coda_agent.verifier.schedule.devices``) for every GPU this process sees: its index, its
``CUDA_VISIBLE_DEVICES`` entry (the parent's own entry when that variable is set, else the
index: a worker started with it sees exactly that GPU, as ``cuda:0``), its UUID (the same
in every process whatever its ``CUDA_VISIBLE_DEVICES``: the name of the host-wide lock,
:mod:`~coda_agent.verifier.schedule.pool`), its name and memory.

# Rationale: the probe runs in a subprocess so that the scheduling process never creates a
# CUDA context (half a GiB on every GPU, held for the whole run) just to read memory sizes.

:func:`fake_gpus` makes stand-ins for tests on the CPU test device (``device="cpu"``
verifications): the scheduler treats them as GPUs (leases, budgets, pinning), the workers
run on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Gpu:
    """One GPU: ``index`` among the visible ones, ``visible_id`` (the ``CUDA_VISIBLE_DEVICES``
    entry that pins a worker to it), ``uuid`` (host-wide name), ``name``, ``total_bytes``
    (device memory); ``fake``: a stand-in of the CPU test device."""

    index: int
    visible_id: str
    uuid: str
    name: str
    total_bytes: int
    fake: bool = False

    @property
    def label(self) -> str:
        """``"GPU <index> (<name>)"``, as verdicts and command output name it."""
        return f"GPU {self.index} ({self.name})"


def visible_entries(env: dict[str, str] | None = None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-<uuid>`` or ``MIG-...``), or
    None when it is unset (every GPU visible). An empty value hides every GPU: ``[]``."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [e.strip() for e in value.split(",") if e.strip()]


def pin_ids(count: int, env: dict[str, str] | None = None) -> list[str]:
    """For each of the ``count`` GPUs torch enumerates, the ``CUDA_VISIBLE_DEVICES`` value
    that shows a child process that GPU alone: the parent's own entry (CUDA enumerates the
    visible list in its order) or, without the variable, the index."""
    entries = visible_entries(env)
    if entries is None:
        return [str(i) for i in range(count)]
    return entries[:count]


def _probe() -> list[dict[str, object]]:
    """Every visible CUDA device as a dict (run in the probe subprocess: creates a context)."""
    import torch

    out = []
    if torch.cuda.is_available():
        ids = pin_ids(torch.cuda.device_count())
        for i, vid in enumerate(ids):
            p = torch.cuda.get_device_properties(i)
            uuid = str(getattr(p, "uuid", "") or f"index-{vid}")
            out.append(
                {
                    "index": i,
                    "visible_id": vid,
                    "uuid": uuid if uuid.startswith(("GPU-", "MIG-", "index-")) else f"GPU-{uuid}",
                    "name": p.name,
                    "total_bytes": int(p.total_memory),
                }
            )
    return out


def visible_gpus() -> list[Gpu]:
    """The GPUs this process sees (empty without CUDA or when the probe fails: the
    verifications then record their GPU stages as not run). Never raises."""
    from ..gpu.environment import cuda_available

    if not cuda_available():
        return []
    try:
        r = subprocess.run(
            [sys.executable, "-m", "coda_agent.verifier.schedule.devices"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        rows = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else []
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []
    return [Gpu(**{k: row[k] for k in ("index", "visible_id", "uuid", "name", "total_bytes")}) for row in rows]


def fake_gpus(n: int, total_bytes: int = 80 << 30, name: str = "fake GPU") -> list[Gpu]:
    """``n`` stand-in GPUs for the CPU test device (``visible_id`` ``fake<i>``; no host lock)."""
    if n < 1:
        raise ValueError(f"fake_gpus: need n >= 1, got {n}")
    return [Gpu(i, f"fake{i}", f"fake-{i}", name, total_bytes, fake=True) for i in range(n)]


if __name__ == "__main__":
    print(json.dumps(_probe()))

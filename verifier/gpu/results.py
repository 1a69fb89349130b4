"""What the two GPU workers left behind, read back by the trusted parent.

Why a separate module: the correctness, gradients and bench stages all read the same
worker folders (records + ``.pt`` files) and all need to turn a dead worker into a
finding. :class:`GpuRun` bundles the plan (kept in the parent's memory, never re-read
from a worker folder), the two :class:`~coda_agent.verifier.confine.sandbox.WorkerOutcome` s and
the workdir; stages are pure functions of it, so they can be tested on synthetic
folders without a GPU.

Tensor files are loaded with ``torch.load(weights_only=True)``: the candidate process
wrote them, and a pickle from it must not be able to run code in the parent.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..confine.records import records_of
from ..confine.sandbox import WorkerOutcome, read_worker_file
from ..verdict import Finding
from .protocol import CAND_DIR, REF_DIR, SCRATCH_DIR, Plan

OUTCOME_KINDS = {"exception": "crash", "signal": "crash", "timeout": "hang", "cuda-error": "cuda-error"}
"""Finding kind for each non-ok worker outcome status."""


@dataclass
class GpuRun:
    """Everything the GPU stages read: plan, worker outcomes, and where their files are."""

    workdir: Path
    plan: Plan
    cand: WorkerOutcome
    ref: WorkerOutcome | None = None
    scratch_bytes: int = 0
    """Disk bytes of saved trials the candidate worker left (protocol.SCRATCH_BUDGET)."""
    cand_plan_sha256: str | None = None
    """The hash of the plan the candidate worker was given (``plan`` gains the timed-call
    checks afterwards, for the reference worker); None: ``plan.sha256()``."""

    @property
    def cand_dir(self) -> Path:
        return self.workdir / CAND_DIR

    @property
    def ref_dir(self) -> Path:
        return self.workdir / REF_DIR

    def cand_part(self, part: str) -> list[dict[str, Any]]:
        return records_of(self.cand.records, part)

    def ref_part(self, part: str) -> list[dict[str, Any]]:
        return records_of(self.ref.records, part) if self.ref else []

    def trial_seconds(self, keys: set[str]) -> dict[str, float]:
        """Seconds each worker spent on the trials ``keys`` (from each trial's ``begin`` record
        to its ``trial``/``recheck`` record, the workers' ``t`` stamps): the cost of a set
        of cases, e.g. the secret coverage cases. A worker without stamps counts 0."""

        def spent(records: list[dict[str, Any]], prefix: tuple[str, ...]) -> float:
            start: dict[str, float] = {}
            total = 0.0
            for r in records:
                t = r.get("t")
                if not isinstance(t, (int, float)):
                    continue
                if r.get("part") == "begin":
                    what = str(r.get("what", ""))
                    for p in prefix:
                        if what.startswith(p):
                            start[what[len(p) :]] = float(t)
                elif r.get("part") in ("trial", "recheck") and r.get("key") in keys and r.get("key") in start:
                    total += float(t) - start[str(r.get("key"))]
            return total

        return {
            "candidate": spent(self.cand.records, ("trial ", "recheck ")),
            "reference": spent(self.ref.records if self.ref else [], ("reference ",)),
        }

    def cand_trial(self, key: str) -> dict[str, Any] | None:
        """The candidate's ``trial``/``recheck`` record for ``key``."""
        for r in self.cand_part("trial") + self.cand_part("recheck"):
            if r.get("key") == key:
                return r
        return None

    def ref_trial(self, key: str) -> dict[str, Any] | None:
        return next((r for r in self.ref_part("trial") if r.get("key") == key), None)

    def cand_file(self, key: str) -> Path:
        """Where the candidate worker saves trial ``key`` (fixed by the protocol, never taken
        from a record)."""
        return self.cand_dir / SCRATCH_DIR / "trials" / f"{key}.pt"

    def _read_cand_file(self, key: str) -> bytes | None:
        """The bytes of trial ``key``'s saved file when it is exactly what the worker wrote,
        else None. The folder is writable by candidate code, so the file is opened without
        following symlinks and without blocking (a FIFO), must be a regular file of the
        recorded size (read no more than that: a sparse 8 GiB file is not read) and match
        the recorded sha256."""
        rec = self.cand_trial(key) or {}
        path, digest, size = self.cand_file(key), rec.get("sha256"), rec.get("bytes")
        if digest is None or size is None:
            return None
        data = read_worker_file(path, limit=int(size))
        if data is None or len(data) != int(size):
            return None
        return data if hashlib.sha256(data).hexdigest() == digest else None

    def tampered_trial_files(self) -> list[str]:
        """Trial keys whose saved file is not the one the worker wrote (sha256 or size differs,
        not a regular file, or gone): only code running in the candidate's process after the
        save can do that."""
        keys = [r.key for r in self.plan.runs if self.cand_trial(r.key) is not None]
        return [k for k in keys if self._read_cand_file(k) is None]

    def load_cand(self, key: str) -> dict[str, Any]:
        """``{"outputs", "inputs_before", "inputs_after"}`` of the candidate trial ``key``.
        Raises ``FileNotFoundError`` when the file is not the one the worker wrote."""
        data = self._read_cand_file(key)
        if data is None:
            raise FileNotFoundError(f"trial {key}: the saved file is missing or not the one the worker wrote")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def load_ref(self, key: str) -> dict[str, Any]:
        """``{"inputs", "ref32", "ref_lowp"}`` of the reference trial ``key``."""
        return load_pt(self.ref_dir / f"{key}.pt")

    @property
    def setup(self) -> dict[str, Any] | None:
        """The candidate worker's setup record: the *first* one, written before any candidate
        code ran (anything later could have been appended by the candidate itself)."""
        s = self.cand_part("setup")
        return s[0] if s else None

    @property
    def sandbox(self) -> str | None:
        """How the candidate worker was confined (``landlock.confine_worker``'s description)."""
        s = self.setup
        return None if s is None else s.get("sandbox")

    @property
    def gpu_env(self) -> dict[str, Any]:
        """The environment the workers saw: the candidate worker's setup record, with every
        field the trusted reference worker also recorded taken from it (the candidate worker
        probes confined, where e.g. ``nvidia-smi`` may be refused). Empty when the
        candidate worker did not finish its setup."""
        s = self.setup
        if not (s and s.get("ok")):
            return {}
        env = dict(s.get("env") or {})
        ref = self.ref_part("setup")
        env.update({k: v for k, v in ((ref[0].get("env") or {}) if ref else {}).items() if v is not None})
        return env


def load_pt(path: Path) -> dict[str, Any]:
    """Load a worker tensor file safely (``weights_only=True``). Raises ``FileNotFoundError``."""
    return torch.load(path, map_location="cpu", weights_only=True)


def failure_finding(outcome: WorkerOutcome, who: str = "candidate", case: str | None = None) -> Finding:
    """A finding for a worker that did not finish: kind ``crash`` / ``hang`` / ``cuda-error``."""
    kind = OUTCOME_KINDS.get(outcome.status, "crash")
    return Finding(kind=kind, message=f"{who} worker: {outcome.message()}", case=case)


def jsonable(x: Any) -> Any:
    """Metrics-safe value: non-finite floats become the strings "inf"/"-inf"/"nan"."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x

"""The scheduler's GPU runs as Ray tasks with GPU resources (``--ray ADDRESS|auto``).

Each GPU run of a verification (screening or the full run) is one Ray task: ``num_gpus=1``
for a run that must be alone on its GPU (every timing), ``num_gpus=1/per_gpu`` for a
shared one, so Ray's own resource accounting gives the same guarantees as the local
:class:`~coda_agent.verifier.schedule.pool.GpuPool`: at most ``per_gpu`` shared runs on a
GPU, and a timing run only on a GPU no other task holds. Ray pins the task to its GPU
(``CUDA_VISIBLE_DEVICES``); the task computes its memory budget from that GPU's memory and
its share, and runs :func:`~coda_agent.verifier.pipeline.verify`'s GPU stages there: the
same confined worker subprocesses, started by the task. The task process (a Ray worker)
judges their records and never imports candidate code, like the local parent.

What travels: the spec folder's files (the task loads them and refuses a spec whose hash
differs from the driver's), the candidate's bytes under its file name, the CPU stages
already run (static and compile run on the driver) and the job's options; the verdict
comes back as JSON. The workers' files stay on the node, in a temporary folder removed
after the task. Every node needs the same coda-agent installation (``pip install -e
'.[ray]'``); the verdict records the node's environment.

Ray is an optional extra: importing this module without it raises ``ValueError`` with the
install command; without ``--ray`` the local scheduler is used.
"""

from __future__ import annotations

import importlib
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..confine.sandbox import on_kill
from ..pipeline import CpuStages
from ..verdict import Verdict
from .pool import DEFAULT_PER_GPU

MISSING = "--ray needs Ray: pip install -e '.[ray]' (or pip install ray)"


def _ray() -> Any:
    try:
        return importlib.import_module("ray")  # an optional extra: typed Any, imported on use
    except ImportError:
        raise ValueError(MISSING) from None


def spec_files(directory: Path) -> dict[str, bytes]:
    """The regular files of a spec folder (spec.toml, reference.py, liger.py, ...), by name."""
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file() and not p.is_symlink()}


def run_remote(payload: dict[str, Any]) -> str:
    """The Ray task: rebuild the spec and the candidate in a temporary folder, run the GPU
    stages on the GPU Ray assigned, return the verdict's JSON. Runs in a Ray worker process
    (trusted: it never imports the candidate; the workers it starts are the pipeline's own)."""
    from ..gpu.memory_budget import ALONE_SHARE, PROCESS_OVERHEAD
    from ..gpu.placement import Placement
    from ..pipeline import verify
    from ..spec import load_spec
    from ..workspace import remove_tree
    from .devices import visible_gpus

    tmp = tempfile.mkdtemp(prefix="coda-ray-")
    try:
        spec_dir = Path(tmp) / payload["spec_name"]
        spec_dir.mkdir()
        for name, data in payload["spec_files"].items():
            (spec_dir / name).write_bytes(data)
        loaded = load_spec(spec_dir)
        if loaded.spec_hash != payload["spec_hash"]:
            raise RuntimeError(
                f"spec {loaded.name}: hash {loaded.spec_hash[:12]} on this node, {payload['spec_hash'][:12]} sent"
            )
        cand = Path(tmp) / "candidate" / payload["candidate_name"]
        cand.parent.mkdir()
        cand.write_bytes(payload["candidate"])
        share = payload["share"]
        budget = None
        gpu = f"Ray node {socket.gethostname()}"
        if payload["device"] == "cuda":
            gpus = visible_gpus()  # Ray's CUDA_VISIBLE_DEVICES: the task's GPU only
            if gpus:
                total = gpus[0].total_bytes
                budget = int(total * ALONE_SHARE) if share >= 1 else int(total * share) - PROCESS_OVERHEAD
                gpu += f" {gpus[0].label}"
        placement = Placement(
            visible_device=None,  # Ray has pinned the task; the workers inherit it
            memory_budget=budget,
            exclusive=share >= 1,
            gpu=gpu,
            shared_with=max(1, round(1 / share)),
        )
        v = verify(
            loaded,
            cand,
            bench=payload["bench"],
            timeout_s=payload["timeout_s"],
            bench_shapes=payload["bench_shapes"],
            device=payload["device"],
            baselines=payload["baselines"],
            cpu_done=payload["cpu_done"],
            placement=placement,
        )
        return v.model_dump_json()
    finally:
        remove_tree(tmp)


class RayExecutor:
    """GPU runs as Ray tasks on the cluster at ``address`` (``auto``: the one this machine
    runs; ``ray://host:10001``: a remote one; None: the Ray session this process already
    started, e.g. a test's ``ray.init(num_gpus=...)``). ``per_gpu``: shared runs per GPU;
    ``device="cpu"``: the CPU test device (the cluster's GPUs may be Ray's fakes). Raises
    ``ValueError`` without Ray or when the cluster cannot be reached."""

    def __init__(self, address: str | None, *, per_gpu: int = DEFAULT_PER_GPU, device: str = "cuda"):
        ray = _ray()
        if per_gpu < 1:
            raise ValueError(f"per_gpu must be >= 1, got {per_gpu}")
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except Exception as e:  # noqa: BLE001 -- ConnectionError, RuntimeError: said in words
                raise ValueError(
                    f"--ray {address}: cannot connect to a Ray cluster ({type(e).__name__}: {e})"
                ) from None
        gpus = float(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise ValueError(f"--ray {address}: the Ray cluster has no GPU resource (start it with --num-gpus)")
        self.address, self.per_gpu, self.device, self.gpus = address, per_gpu, device, gpus
        self._remote = ray.remote(run_remote)
        self._inflight: set[Any] = set()
        self._lock = threading.Lock()
        on_kill(self.cancel_all)

    def run(self, job: Any, cpu_done: CpuStages, *, bench: bool, exclusive: bool, need: int) -> Verdict:
        ray = _ray()
        loaded = job.loaded
        share = 1.0 if exclusive else 1.0 / self.per_gpu
        payload = {
            "spec_name": loaded.name,
            "spec_hash": loaded.spec_hash,
            "spec_files": spec_files(Path(loaded.directory)),
            "candidate_name": Path(job.candidate).name,
            "candidate": Path(job.candidate).read_bytes(),
            "cpu_done": cpu_done,
            "bench": bench,
            "bench_shapes": job.bench_shapes,
            "baselines": job.baselines,
            "timeout_s": job.timeout_s,
            "device": self.device,
            "share": share,
        }
        ref = self._remote.options(num_gpus=share, num_cpus=1).remote(payload)
        with self._lock:
            self._inflight.add(ref)
        try:
            return Verdict.model_validate_json(ray.get(ref))
        finally:
            with self._lock:
                self._inflight.discard(ref)

    def cancel_all(self) -> None:
        """Cancel every task in flight (the CLI's interrupt, through ``sandbox.on_kill``)."""
        ray = _ray()
        with self._lock:
            refs = list(self._inflight)
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001
                pass

    @property
    def gpu_count(self) -> int:
        return int(self.gpus)

    def describe(self) -> str:
        return (
            f"Ray cluster {self.address or '(this session)'} with {self.gpus:g} GPU(s); up to {self.per_gpu} correctness "
            "runs side by side per GPU (Ray GPU shares), every timing alone on its GPU (a whole GPU)"
        )

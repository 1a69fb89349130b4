"""The scheduler's GPU runs as Ray tasks, on a local Ray cluster with fake GPU resources and
the CPU test device (skipped without Ray, the optional ``ray`` extra; CI installs it).

The tasks run the pipeline's confined workers; the driver only sees verdicts: it never
imports a candidate (no ``coda_candidate`` module here), and neither does the task process
(the workers are its subprocesses): the good candidate leaves a file behind when imported
in a process that has Ray loaded (a Ray worker; the confined workers never import Ray), and
none appears."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from coda_agent.verifier.schedule import Job, Scheduler  # noqa: E402
from coda_agent.verifier.schedule.ray_executor import RayExecutor, spec_files  # noqa: E402
from coda_agent.verifier.spec import load_spec  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
SMALL_BENCH = [{"name": "small", "dims": {"M": 256, "K": 128, "I": 128}}]

GOOD = """
import torch

def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""
WRONG = """
import torch

def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    return pre.to(torch.bfloat16), (pre[:, 0::2] * pre[:, 1::2]).to(torch.bfloat16)
"""


@pytest.fixture(scope="module")
def cluster():
    # Rationale: the task processes are Ray's; the static/compile stub of the other CPU tests
    # cannot reach them, so the CPU stages are handed over as already run (cpu_done).
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cpu_ok(path: Path):
    import tempfile

    from coda_agent.verifier.confine.snapshot import take
    from coda_agent.verifier.pipeline import CpuStages
    from coda_agent.verifier.verdict import StageResult

    with tempfile.TemporaryDirectory() as d:
        sha = take(path, d).sha256
    return CpuStages(sha, (StageResult(stage="static", status="pass"), StageResult(stage="compile", status="pass")))


def test_spec_files_travel_whole():
    files = spec_files(Path(FWD.directory))
    assert {"spec.toml", "reference.py"} <= set(files)


IMPORTED_IN_RAY = """
import pathlib, sys
if "ray" in sys.modules:  # imported by a Ray process, not by a confined worker
    pathlib.Path({marker!r}).write_text("imported in a Ray process")
"""


def test_ray_tasks_verify_side_by_side_and_time_alone(cluster, tmp_path):
    marker = tmp_path / "imported-in-ray"
    paths = []
    for name, body in (("good", GOOD + IMPORTED_IN_RAY.format(marker=str(marker))), ("wrong", WRONG)):
        p = tmp_path / f"{name}.py"
        p.write_text(textwrap.dedent(body))
        paths.append(p)
    ex = RayExecutor(None, per_gpu=2, device="cpu")
    assert "2 GPU(s)" in ex.describe()
    jobs = [
        Job(FWD, p, bench=True, bench_shapes=SMALL_BENCH, baselines=["torch_eager"], timeout_s=240, label=p.stem)
        for p in paths
    ]
    good, wrong = Scheduler(executor=ex).verify_many(jobs, [_cpu_ok(p) for p in paths])
    assert good.stage("correctness").status == "pass" and good.stage("bench").status == "pass", good.failed_stage
    assert "Ray node" in good.environment.placement and ", alone" in good.environment.placement
    assert wrong.failed_stage.stage == "correctness" and wrong.failed_stage.status == "fail"
    assert "shared (up to 2 verifications)" in wrong.environment.placement
    assert "coda_candidate" not in sys.modules
    assert not marker.exists()


def test_ray_without_a_gpu_resource_is_refused(cluster, monkeypatch):
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ValueError, match="no GPU resource"):
        RayExecutor(None)

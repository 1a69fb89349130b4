"""`coda-agent bench` and `regress` through the scheduler: one kernel per GPU at once, each
alone on its GPU, and they say so. A recording executor with two GPUs stands in for the
GPU runs (their verdicts are scripted GPU passes); static/compile are stubbed."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from test_benchrun import ROOT, _accepted, _gpu_verify
from verifier_helpers import stub_static_compile

from coda_agent.verifier.library.bench import bench_kernels
from coda_agent.verifier.library.regress import regress
from coda_agent.verifier.schedule import Scheduler


class TwoGpus:
    """An executor with two GPUs: records (bench, exclusive) per run and how many ran at once."""

    gpu_count = 2

    def __init__(self) -> None:
        self.runs: list[tuple[bool, bool]] = []
        self.now = self.most = 0
        self.lock = threading.Lock()
        self.verdict = _gpu_verify(0.5)

    def run(self, job, cpu_done, *, bench, exclusive, need):
        with self.lock:
            self.runs.append((bench, exclusive))
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.3)
        with self.lock:
            self.now -= 1
        v = self.verdict(job.loaded, job.candidate)
        v.environment.placement = "GPU ? (fake), alone"
        return v

    def describe(self):
        return "2 GPUs (two fakes); every timing alone on its GPU"


def _workspace(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    _accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py")
    _accepted(tmp_path, "swiglu_bwd", "good_swiglu_bwd.py")
    return tmp_path


def test_bench_times_one_kernel_per_gpu_at_once_each_alone(tmp_path, monkeypatch):
    stub_static_compile(monkeypatch)
    root = _workspace(tmp_path)
    ex = TwoGpus()
    rep = bench_kernels(root, None, out_dir=tmp_path / "out", scheduler=Scheduler(executor=ex, screen=False))
    assert rep.ok and set(rep.verdicts) == {"swiglu_fwd", "swiglu_bwd"}
    assert ex.runs == [(True, True), (True, True)]  # no screening: every run times, alone
    assert ex.most == 2  # the two kernels at once, one per GPU
    assert rep.schedule == "2 GPUs (two fakes); every timing alone on its GPU"
    assert rep.markdown_path is not None


def test_regress_uses_every_gpu_and_says_so(tmp_path, monkeypatch):
    stub_static_compile(monkeypatch)
    root = _workspace(tmp_path)
    ex = TwoGpus()
    rep = regress(root, cpu_only=False, scheduler=Scheduler(executor=ex, screen=False))
    assert [r.status for r in rep.rows] == ["pass", "pass"], [r.message for r in rep.rows]
    assert ex.most == 2 and all(run == (True, True) for run in ex.runs)
    assert rep.schedule and rep.schedule.startswith("2 GPUs")

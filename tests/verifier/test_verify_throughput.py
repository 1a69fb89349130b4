"""benchmarks/verify_throughput.py's measurement on the CPU test device: pure-torch
candidates (static/compile stubbed), two stand-in GPUs; every mode verifies every file, the
outcomes agree and the report and table say so; the Ray mode on a local Ray cluster with a
stand-in GPU resource (skipped without Ray), with a narrowed benchmark stage."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
from verifier_helpers import stub_static_compile

from coda_agent.verifier.schedule import fake_gpus
from coda_agent.verifier.spec import load_spec

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

GOOD = """
import torch

def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""
WRONG = GOOD.replace("torch.nn.functional.silu(pre[:, 0::2])", "pre[:, 0::2]")


def _script():
    spec = importlib.util.spec_from_file_location("verify_throughput", ROOT / "benchmarks" / "verify_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_throughput_modes_agree_on_every_outcome(tmp_path, monkeypatch):
    stub_static_compile(monkeypatch)
    vt = _script()
    fwd = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
    items = []
    for i, body in enumerate((GOOD, WRONG, GOOD)):
        d = tmp_path / f"c{i}"
        d.mkdir()
        (d / "kernel.py").write_text(textwrap.dedent(body))
        items.append((fwd, d / "kernel.py"))
    rep = vt.measure(items, bench=False, gpu_counts=[1, 2], gpus=fake_gpus(2), device="cpu")
    assert list(rep["modes"]) == ["serial", "scheduler-1gpu", "scheduler-2gpu"]
    assert rep["same_outcomes"]
    for m in rep["modes"].values():
        assert [f["outcome"] for f in m["files"]] == ["cpu-checks-passed", "rejected", "cpu-checks-passed"]
        assert m["per_gpu_hour"] > 0 and m["candidates"] == 3
    assert rep["modes"]["scheduler-2gpu"]["gpus"] == 2
    text = vt.table(rep)
    assert "| serial | 1 | 3 |" in text and "| scheduler-2gpu | 2 | 3 |" in text and "1.00x" in text


def test_wrong_variants_are_made_from_the_accepted_kernels(tmp_path):
    vt = _script()
    items = vt.candidates(ROOT, ["swiglu_fwd", "gemm_rmsnorm"], 1, tmp_path, wrong=2)
    assert [p.parent.name for _, p in items] == [
        "swiglu_fwd-ok-0",
        "swiglu_fwd-wrong-1",
        "swiglu_fwd-wrong-2",
        "gemm_rmsnorm-ok-0",
        "gemm_rmsnorm-wrong-1",
        "gemm_rmsnorm-wrong-2",
    ]
    assert items[0][1].read_text() == (ROOT / "generated_kernels" / "swiglu_fwd" / "kernel.py").read_text()
    assert 'return {"D": pack(g, u), "postact": sigmoid(g) * u}' in items[1][1].read_text()
    with pytest.raises(ValueError, match="no wrong variant of swiglu_bwd"):
        vt.candidates(ROOT, ["swiglu_bwd"], 1, tmp_path, wrong=1)


def test_the_ray_mode_and_a_narrowed_benchmark(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from coda_agent.verifier.schedule.ray_executor import RayExecutor

    stub_static_compile(monkeypatch)  # the CPU stages run in this process (the driver)
    vt = _script()
    fwd = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
    items = []
    for i, body in enumerate((GOOD, WRONG)):
        d = tmp_path / f"c{i}"
        d.mkdir()
        (d / "kernel.py").write_text(textwrap.dedent(body))
        items.append((fwd, d / "kernel.py"))
    # a small shape of the CPU test device: the spec's benchmark shapes are production sizes
    small = [{"name": "small", "dims": {"M": 256, "K": 128, "I": 128}}]
    saved = []
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        rep = vt.measure(
            items,
            bench=True,
            gpu_counts=[],
            gpus=fake_gpus(1),
            device="cpu",
            serial=False,
            ray=RayExecutor(None, device="cpu"),
            bench_shapes=small,
            baselines=["torch_eager"],
            checkpoint=lambda r: saved.append(list(r["modes"])),
        )
    finally:
        ray.shutdown()
    assert list(rep["modes"]) == ["ray-1gpu"] and saved == [["ray-1gpu"]]
    files = rep["modes"]["ray-1gpu"]["files"]
    assert [f["outcome"] for f in files] == ["cpu-checks-passed", "rejected"]
    assert "Ray node" in files[0]["placement"] and "alone" in files[0]["placement"]
    assert "baselines: torch_eager" in vt.table(rep)

"""The scheduler and the memory budgets on a real Hopper GPU (``gpu``: skipped elsewhere).

* the race: a neighbour grabs GPU memory between one worker's read of the free memory and
  its allocation. Sizing the poison from that read (the old way) runs out of memory; sized
  from the worker's budget it does not;
* a worker's budget is enforced in the worker: past it, its own allocation raises
  ``OutOfMemoryError`` while the device still has free memory;
* verifications of the accepted swiglu_fwd kernel side by side on one GPU, next to a
  neighbour that allocates and frees its whole budget in a loop: every verdict passes
  correctness (no false reject), and the GPU held several at once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30

GRAB = textwrap.dedent(
    """
    import sys, time, torch
    n = int(sys.argv[1])
    held = torch.empty(n, dtype=torch.uint8, device="cuda")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    """
)

CHURN = textwrap.dedent(
    """
    import sys, time, torch
    budget, seconds = int(sys.argv[1]), float(sys.argv[2])
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(budget / total, 0)
    t0 = time.monotonic()
    n = 0
    print("churning", flush=True)
    while time.monotonic() - t0 < seconds:
        x = torch.empty(int(budget * 0.9), dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        del x
        torch.cuda.empty_cache()  # give it back, take it again: the neighbour the race needs
        n += 1
    print(n, flush=True)
    """
)


def _start(code: str, *args: object) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    p.stdout.readline()  # its allocation is in place
    return p


def test_poison_sized_from_the_budget_survives_a_neighbour_taking_free_memory():
    import torch

    from coda_agent.verifier.gpu.poison import fill_free_memory

    dev = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(dev)  # worker A reads the free memory ...
    budget = 4 * GIB
    grabber = _start(GRAB, free - budget - 2 * GIB, 60)  # ... neighbour B takes most of it ...
    try:
        with pytest.raises(torch.OutOfMemoryError):  # ... and A's allocation sized from its read fails
            torch.empty(int(free * 0.5), dtype=torch.uint8, device=dev)
        poisoned = fill_free_memory(dev, torch.cuda.synchronize, budget)  # sized from A's budget: fits
        assert budget // 2 - (2 << 20) <= poisoned <= budget
    finally:
        grabber.kill()
        grabber.wait()


BUDGETED = textwrap.dedent(
    """
    import torch
    from coda_agent.verifier.gpu.memory_budget import apply
    dev = torch.device("cuda", 0)
    applied = apply(dev, 2 << 30)
    x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)  # within the budget
    try:
        y = torch.empty(3 << 30, dtype=torch.uint8, device=dev)
        print("allocated past the budget")
    except torch.OutOfMemoryError:
        free, _ = torch.cuda.mem_get_info(dev)
        print("refused", applied, free)
    """
)


def test_a_worker_past_its_budget_runs_out_of_memory_itself():
    out = subprocess.run([sys.executable, "-c", BUDGETED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    word, applied, free = out.stdout.split()
    assert word == "refused" and int(applied) == 2 * GIB
    assert int(free) > 8 * GIB  # the device had room: the budget refused it, not the GPU


def test_side_by_side_verifications_next_to_a_churning_neighbour_have_no_false_rejects(tmp_path):
    from coda_agent.verifier.schedule import GpuPool, Job, LocalExecutor, Scheduler, visible_gpus
    from coda_agent.verifier.spec import load_spec

    gpus = visible_gpus()[:1]
    ex = LocalExecutor(gpus, per_gpu=4)
    ex.pool = GpuPool(gpus, per_gpu=4, lock_dir=tmp_path / "locks")
    loaded = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
    kernel = ROOT / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    copies = []
    for i in range(3):
        d = tmp_path / f"k{i}"
        d.mkdir()
        copies.append(Path(shutil.copy(kernel, d / "kernel.py")))
    neighbour = ex.pool.acquire(ex.pool.slot_bytes(gpus[0]), exclusive=False)  # the fourth slot
    churn = _start(CHURN, neighbour.budget, 900)
    try:
        t0 = time.monotonic()
        verdicts = Scheduler(executor=ex).verify_many(
            [Job(loaded, c, bench=False, label=f"copy {i}") for i, c in enumerate(copies)]
        )
    finally:
        churn.kill()
        churn.wait()
        ex.pool.release(neighbour)
    for v in verdicts:
        assert v.gpu_correct, (v.environment.placement, v.failed_stage)
        assert "run again" not in (v.environment.placement or ""), v.environment.placement
    assert ex.pool.stats.most_at_once[0] >= 3, ex.pool.stats  # the neighbour and verifications side by side
    print(f"3 verifications side by side: {time.monotonic() - t0:.0f} s")

"""Host time per op call: the launch paths of an accepted kernel against the bare launch.

Why: a fused GEMM saves memory traffic on the GPU, but every call also costs host time
(Python, argument checks, quack's host decisions); when the host falls behind, the GPU
idles and the step gets no faster. This measures that cost per path, at a shape so small
that the GPU never limits (M = 128 rows, widths 1024 / 2048: each launch is a few
microseconds of GPU work), so calls per second measure the host alone. (At 8B widths even
M = 128 reads ~235 MB of weights per call: GPU-bound, not a host measurement.)

Paths, per kernel (same inputs, same process, same GPU):

* ``bare``: ``EpiPlan.run`` of a plan made once, outputs preallocated -- quack's cheapest
  launch short of a raw TVM-FFI call; the floor.
* ``launcher``: the kernel's entry as training runs it (``coda_agent.kernels._registry.entry``:
  launchers with cached plans, :mod:`coda_agent.runtime.launch`).
* ``epimod``: the kernel module's own entry (``EpiMod.__call__`` per mod, the launch path
  before launchers).
* ``op``: the training op in eager (``coda_agent.kernels.<op>``: the custom op, its
  argument checks, the dispatcher, the launcher).
* ``op_epimod``: the same op with ``CODA_LAUNCH=mod`` (a child process: the variable is
  read once per process).
* ``cublas``: ``torch.mm`` of the same A and B (PyTorch's own host path for a GEMM).

Method: per path, 3 rounds of 300 calls after 50 warm-up calls; the host time per call is
the round's wall time / 300 with one synchronize at the end (the GPU, a few microseconds
per launch, keeps up); the median round is reported, in microseconds.

Usage (device)::

    python3 benchmarks/host_time.py --out $OUT/host_time.json

Writes the JSON and prints a table. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

M = 128
CALLS, WARMUP, ROUNDS = 300, 50, 3


def per_call_us(fn) -> float:
    """Median over rounds of host wall time per call (microseconds)."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(rounds)


def cases():
    """(kernel, op callable, entry args, cuBLAS operands) at M = 128 and small widths (D = 1024,
    I = 2048: a few microseconds of GPU work per launch, so the host alone sets the pace)."""
    from coda_agent import kernels as K

    d = dict(device="cuda", dtype=torch.bfloat16)
    D, I = 1024, 2048  # noqa: E741
    x = torch.randn(M, D, **d)
    w1 = torch.randn(2 * I, D, **d) * 0.02
    w_o = torch.randn(D, D, **d) * 0.02
    w_down = torch.randn(D, I, **d) * 0.02
    gamma = torch.ones(D, **d)
    post = torch.randn(M, I, **d)
    rstd = torch.rand(M, device="cuda") + 0.5
    return [
        ("swiglu_fwd", lambda: K.swiglu_fwd_op(x, w1), (x, w1), (x, w1.T)),
        (
            "gemm_residual_partial_rms",
            lambda: K.gemm_residual_partial_rms_op(x, w_o, x, gamma),
            (x, w_o, x, gamma),
            (x, w_o.T),
        ),
        ("gemm_rmsnorm_swiglu", lambda: K.gemm_rmsnorm_swiglu_op(x, rstd, w1), (x, rstd, w1), (x, w1.T)),
        ("gemm_rmsnorm", lambda: K.gemm_rmsnorm_op(post, rstd, w_down), (post, rstd, w_down), (post, w_down.T)),
    ]


def bare_plan(kernel: str, args):
    """A callable running the kernel's first epilogue call through its ``EpiPlan.run``
    directly (outputs and scratch preallocated, no host code of the kernel): the floor."""
    from coda_agent.kernels import _registry
    from coda_agent.runtime.launch import Launcher

    fn, _ = _registry.entry(kernel)
    cap: dict = {}
    orig = Launcher._run

    def spy(self, entry, A, B, C, out, store_d, operands):
        cap.setdefault("call", (entry, A, B, C, operands))
        return orig(self, entry, A, B, C, out, store_d, operands)

    Launcher._run = spy
    try:
        fn(*args)
    finally:
        Launcher._run = orig
    (plan, recipes, sinks, dyn), A, B, C, operands = cap["call"]
    outs = {n: torch.empty(s, dtype=t, device="cuda") for n, s, t in recipes}
    scratch = {n: torch.empty(s, dtype=t, device="cuda") for n, s, t in sinks}
    sem = torch.zeros(1, dtype=torch.int32, device="cuda") if dyn else None
    return lambda: plan.run(A, B, C, out=outs, scratch=scratch, tile_count_semaphore=sem, **operands)


def measure() -> dict:
    from coda_agent.kernels import _registry

    rows = {}
    for kernel, op, args, (A, Bt) in cases():
        r = {"bare": per_call_us(bare_plan(kernel, args))}
        fn, _ = _registry.entry(kernel)
        r["launcher"] = per_call_us(lambda fn=fn, a=args: fn(*a))
        own = getattr(_registry._pkg.load(kernel), kernel)
        r["epimod"] = per_call_us(lambda own=own, a=args: own(*a))
        r["op"] = per_call_us(op)
        r["cublas"] = per_call_us(lambda A=A, Bt=Bt: torch.mm(A, Bt))
        rows[kernel] = r
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="also cProfile the op path of one kernel")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_time.py needs a CUDA GPU")
    if a.child:  # CODA_LAUNCH=mod: only the ops
        from coda_agent import kernels  # noqa: F401

        rows = {k: per_call_us(op) for k, op, _, _ in cases()}
        print(json.dumps(rows))
        return 0
    rows = measure()
    env = {**os.environ, "CODA_LAUNCH": "mod"}
    child = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
    for k, us in json.loads(child.stdout.strip().splitlines()[-1]).items():
        rows[k]["op_epimod"] = us
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "M": M, "us_per_call": rows}
    cols = ["bare", "launcher", "epimod", "op", "op_epimod", "cublas"]
    print(f"host us per call on {res['gpu']} (M={M}, median of {ROUNDS} x {CALLS} calls)")
    print("| kernel | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for k, r in rows.items():
        print(f"| {k} | " + " | ".join(f"{r[c]:.1f}" if c in r else "n/a" for c in cols) + " |")
    if a.profile:
        import cProfile
        import pstats

        k, op, _, _ = cases()[1]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            op()
        pr.disable()
        torch.cuda.synchronize()
        print(f"cProfile of 200 {k} op calls (cumulative, top 25):")
        pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does the way a kernel is timed change its speedup? (dev tool; H200 only.)

Why: on the results page swiglu_bwd at llama3-8b/M8192 reads 1.54 ms (do_bench, L2
flushed, the kernel alone, back to back), 1.26x torch.compile of its spec's baseline
(1.94 ms); the catalogue's target is 1.3x. Inside a training step
(``probes/op_training_step.py --profile``, 2026-12-01,
``benchmarks/results/dev/2026-12-01-h200-op-training-probe-profiles.json``) the same kernel
at the same shape took 1.415 ms of GPU time under ``torch.profiler``, while the unfused path
it replaces (dgrad GEMM + Inductor's dSwiGLU pass) took 1.37 + 0.55 ms there: 1.36x. Either
the timing method or the context (sustained back-to-back load, clocks) moves the fused
kernel by ~9 % and the GEMM by ~2 %. This probe times the same three calls several ways in
one process:

* ``do_bench``: ``triton.testing.do_bench`` median, L2 flushed (the verifier's method), a
  0.15 s and a 1 s run;
* ``profiler``: the mean kernel time per call under ``torch.profiler`` over 20
  back-to-back calls;
* ``after idle``: CUDA events around one call that follows a ~2 ms spin kernel
  (``torch.cuda._sleep``: no tensor-core or memory work), median of 20;

for swiglu_bwd's accepted kernel, torch.compile of the spec's ``baseline`` and the bare
dgrad GEMM (cuBLAS), in interleaved rounds, while ``nvidia-smi`` samples SM clock and
power every 50 ms (mean per measurement). Writes ``timing_context.json`` under ``--out``;
prints one line per measurement. Never scores or changes a kernel. Raises SystemExit
without CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from host_time_by_layer import env_line, kernel_profile, load_kernel, load_reference  # noqa: E402  (sibling dev script)
from host_time_by_layer import randn_bf16 as _randn  # noqa: E402


def _profiled_ms(fn, calls: int = 20) -> float:
    """Mean GPU kernel time per call (ms) over ``calls`` back-to-back calls under
    ``torch.profiler`` (``host_probe.kernel_profile``)."""
    return kernel_profile(fn, calls)["gpu us/step"] / 1e3


def _after_idle_ms(fn, calls: int = 20, idle_cycles: int = 4_000_000) -> float:
    """Median ms of CUDA events around one call that follows a ~2 ms spin kernel
    (``torch.cuda._sleep``: the SMs spin, no tensor-core or memory work)."""
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(idle_cycles)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _do_bench(rep_ms: int):
    def run(fn) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))

    return run


METHODS = {
    "do_bench 0.15 s": _do_bench(150),
    "do_bench 1 s": _do_bench(1000),
    "profiler": _profiled_ms,
    "after idle": _after_idle_ms,
}
"""Timing methods by row label (``after idle``: after a ~2 ms spin kernel, see :func:`_after_idle_ms`)."""


class ClockSampler:
    """``nvidia-smi`` sampling SM clock (MHz) and power (W) every 50 ms in the background."""

    def __init__(self, path: Path):
        self.path = path
        self.out = open(path, "w")
        try:
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,clocks.sm,power.draw",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "50",
                ],
                stdout=self.out,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            self.proc = None

    def mean_between(self, t0: float, t1: float) -> dict:
        """Mean SM clock and power of the samples whose wall time falls in [t0, t1] (epoch s)."""
        if self.proc is None:
            return {}
        import datetime as dt

        clocks, power = [], []
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                if t0 <= t <= t1:
                    clocks.append(float(parts[1]))
                    power.append(float(parts[2]))
            except (ValueError, IndexError):
                continue
        if not clocks:
            return {}
        return {
            "sm_mhz": round(statistics.mean(clocks)),
            "power_w": round(statistics.mean(power)),
            "samples": len(clocks),
        }

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.out.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every method and call")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("timing_context_probe: needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    m, k, i = 8192, 4096, 14336  # llama3-8b down projection, M = 8192
    kern, ref = load_kernel("swiglu_bwd"), load_reference("swiglu_bwd")
    dout, w_down, preact = _randn(m, k), _randn(k, i, std=i**-0.5), _randn(m, 2 * i)
    compiled = torch.compile(ref.baseline, dynamic=False)
    calls = {
        "swiglu_bwd kernel": lambda: kern.swiglu_bwd(dout, w_down, preact),
        "torch_compile baseline": lambda: compiled(dout=dout, w_down=w_down, preact=preact),
        "bare_gemm (cuBLAS)": lambda: dout @ w_down,
    }
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    sampler = ClockSampler(args.out / "clocks.csv")
    time.sleep(0.5)
    results = {"env": env_line(), "shape": "llama3-8b/M8192 (M=8192, K=4096, I=14336)", "rounds": []}
    try:
        for r in range(args.rounds):
            rnd = {}
            for method, measure in METHODS.items():
                for name, fn in calls.items():
                    t0 = time.time()
                    ms = measure(fn)
                    clock = sampler.mean_between(t0, time.time())
                    rnd[f"{method}: {name}"] = {"ms": round(ms, 4), **clock}
                    print(f"round {r} {method:16s} {name:24s} {ms:8.4f} ms {clock}", flush=True)
            for method in METHODS:
                fused = rnd[f"{method}: swiglu_bwd kernel"]["ms"]
                rnd[f"{method}: speedup vs torch_compile"] = round(
                    rnd[f"{method}: torch_compile baseline"]["ms"] / fused, 3
                )
                rnd[f"{method}: fused / bare_gemm"] = round(fused / rnd[f"{method}: bare_gemm (cuBLAS)"]["ms"], 3)
            results["rounds"].append(rnd)
            (args.out / "timing_context.json").write_text(json.dumps(results, indent=1))
    finally:
        sampler.stop()
    for method in METHODS:
        print(
            method,
            [r[f"{method}: speedup vs torch_compile"] for r in results["rounds"]],
            "x torch.compile; fused/bare",
            [r[f"{method}: fused / bare_gemm"] for r in results["rounds"]],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

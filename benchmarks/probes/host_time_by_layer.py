"""Where the candidate worker's extra host time comes from (dev tool; H200 only).

Why: on the 2026-11-30 page gemm_rope's fused call at llama3-1b-qkv/M8192 reads 0.40 ms
(host 0.48 ms) in the candidate worker, while quack's own rope epilogue, doing the same
per-call table preparation, reads 0.19 ms in the reference worker, and the same entry timed
in a plain process reads 0.17 ms (``probes/tile_configs_vs_cublas.py --rope-host``). Calls with several
torch launches (gemm_cross_entropy, cross_entropy_bwd) show host times of 0.5 ms too, while
one-launch kernels read 0.06 ms. Something the candidate worker adds costs time per launch.

This probe adds the worker's layers one at a time in one process, in the order the worker
has them (the irreversible ones last), and after each measures three calls: gemm_rope's
entry (about 12 launches), a chain of 6 small torch ops, and one ``torch.mm``:

0. plain (CUDA up);
1. after one ``torch.profiler.profile`` session (the worker counts launches with it);
2. inside the per-call guard (sync debug mode "error" + heap ballast, as ``no_host_sync``);
3. after the seccomp filter (``landlock.install_seccomp``);
4. after Landlock (``landlock.restrict_writes``).

Per call: host us in a pipelined loop (no sync inside), host us of one call right after a
sync (what the page's "host ms" is), and do_bench ms. Writes ``host_probe.json`` and prints
one line per layer. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def load_reference(name: str):
    """Import ``kernel_specs/<name>/reference.py`` as a standalone module (the spec's baselines),
    registered in ``sys.modules``: torch.compile looks a function's globals up by module name."""
    spec = importlib.util.spec_from_file_location(f"ref_{name}", REPO / "kernel_specs" / name / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def randn_bf16(*shape, std=1.0):
    """A CUDA bf16 tensor of N(0, std^2) values (drawn in fp32, then rounded)."""
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * std).to(torch.bfloat16)


def env_line() -> str:
    """GPU, torch, CUDA, cutlass-dsl and quack versions and the UTC time, for a results header."""
    import importlib.metadata as md

    return (
        f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"nvidia-cutlass-dsl {md.version('nvidia-cutlass-dsl')}, quack-kernels {md.version('quack-kernels')}; "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )


def load_kernel(name: str):
    """Import ``generated_kernels/<name>/kernel.py`` as a standalone module (no package)."""
    spec = importlib.util.spec_from_file_location(f"probe_{name}", REPO / "generated_kernels" / name / "kernel.py")
    kern = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kern)
    return kern


def _rope_entry():
    kern = load_kernel("gemm_rope")
    m, k, hq, hkv, hd = 8192, 2048, 32, 8, 64
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn((hq + 2 * hkv) * hd, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    positions = torch.arange(m, device="cuda") % 4096
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    small = torch.randn(4096, device="cuda")
    return {
        "gemm_rope entry": lambda: kern.gemm_rope(x, w, positions, inv_freq, HQ=hq, HKV=hkv),
        "6 small torch ops": lambda: torch.nn.functional.pad(((small.double() * 2).float() + 1).exp(), (0, 2)) * 3,
        "torch.mm": lambda: torch.mm(x, w.T),
    }


def kernel_profile(run, steps: int, top: int = 10) -> dict:
    """GPU time per step of ``run()`` by kernel, from ``torch.profiler`` (CUDA device events,
    the launch rule of ``protocol.gpu_kernels``; GPU-side annotations of record_function
    ranges, where the profiler flags them ``is_user_annotation``, left out): ``gpu us/step`` (sum of kernel times: busy
    time, not wall time), ``kernels/step``, ``top``: the ``top`` costliest kernel names with
    us/step and calls/step (names cut to 100 characters); and where the GPU sat idle:
    ``span us/step`` (first kernel start to last kernel end, over the ``steps`` back-to-back
    steps), ``idle us/step`` (span minus busy) and ``gaps``: the 8 longest idle stretches
    (us, and the kernels before and after, cut to 60 characters)."""
    from coda_agent.verifier.gpu.protocol import gpu_kernels

    run()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    # a record_function range also appears on the GPU timeline, as an annotation spanning its
    # kernels: not a kernel. (Not by name: Inductor's triton launches have CPU events named
    # like their kernels.)
    events = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    kept = set(gpu_kernels([e.name for e in events]))
    launches = sorted((e for e in events if e.name in kept), key=lambda e: e.time_range.start)
    per: dict[str, list[float]] = {}
    for e in launches:
        per.setdefault(e.name, []).append(float(e.time_range.end - e.time_range.start))
    ranked = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:top]
    busy = sum(map(sum, per.values()))
    res = {
        "gpu us/step": round(busy / steps, 1),
        "kernels/step": len(launches) / steps,
        "top": [
            {"kernel": k[:100], "us/step": round(sum(v) / steps, 1), "calls/step": len(v) / steps} for k, v in ranked
        ],
    }
    if launches:
        span = max(e.time_range.end for e in launches) - launches[0].time_range.start
        gaps, end = [], launches[0].time_range.end
        for prev, e in zip(launches, launches[1:], strict=False):
            end = max(end, prev.time_range.end)
            if e.time_range.start > end:
                gaps.append((e.time_range.start - end, prev.name[:60], e.name[:60]))
        res["span us/step"] = round(span / steps, 1)
        res["idle us/step"] = round((span - busy) / steps, 1)
        res["gaps"] = [{"us": round(g, 1), "after": a, "before": b} for g, a, b in sorted(gaps, reverse=True)[:8]]
    return res


def pipelined_host_us(call, per_round: int = 40, rounds: int = 5, warm: int = 10) -> float:
    """Median host us per ``call()`` over ``rounds`` back-to-back runs of ``per_round``
    calls (no synchronize inside a round: launches queue as in a training step)."""
    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    piped = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            call()
        piped.append((time.perf_counter() - t0) / per_round * 1e6)
        torch.cuda.synchronize()
    return statistics.median(piped)


def _measure(fn, wrap) -> dict:
    from triton.testing import do_bench

    def call():
        return wrap(fn)

    piped = pipelined_host_us(call)
    after_sync = []
    for _ in range(21):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        after_sync.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return {
        "host_us_pipelined": round(piped, 1),
        "host_us_after_sync": round(statistics.median(after_sync), 1),
        "do_bench_ms": round(float(do_bench(call, return_mode="median")), 4),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("host_probe: needs a CUDA device")
    from coda_agent.verifier.confine import landlock

    args.out.mkdir(parents=True, exist_ok=True)
    calls = _rope_entry()
    rng = random.Random(1)

    def plain(fn):
        return fn()

    def guarded(fn):  # as Worker.no_host_sync
        raw = rng.randbytes(48)
        ballast = [bytearray(b + 1) for b in raw[1 : 2 + raw[0] % 47]]
        torch._C._cuda_set_sync_debug_mode(2)
        try:
            return fn()
        finally:
            torch._C._cuda_set_sync_debug_mode(0)
            del ballast

    def profiled():
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ):
            calls["6 small torch ops"]()
            torch.cuda.synchronize()

    results, wrap = [], plain
    layers = [
        ("0 plain", None),
        ("1 after a profiler session", profiled),
        ("2 guard", "guard"),
        ("3 + seccomp", lambda: landlock.install_seccomp(drop_caps=False)),
        (
            "4 + landlock",
            lambda: landlock.restrict_writes([tempfile.mkdtemp(), *landlock.own_proc_dir(), *landlock.device_files()]),
        ),
    ]
    for name, step in layers:
        note = None
        if step == "guard":
            wrap = guarded
        elif step is not None:
            note = step()
        row = {
            "layer": name,
            "note": note if isinstance(note, str) else None,
            **{label: _measure(fn, wrap) for label, fn in calls.items()},
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "host_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

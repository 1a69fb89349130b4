"""Candidates verified per GPU-hour: one at a time against the scheduler, per GPU count.

The candidates are accepted kernels (``--kernels``, each ``--copies`` times) and
``--wrong`` wrong variants of each (the accepted kernel with one term of its epilogue
dropped, :data:`WRONG`: it passes static and compile and fails correctness): the shape of
a best-of-N batch, several answers to one prompt, most of them wrong. Each mode verifies
all of them and records the wall time and every verdict's outcome:

* ``serial``: ``pipeline.verify`` one file after the other (CPU stages, then GPU stages,
  alone on the first GPU): how verification ran before the scheduler;
* ``scheduler-<g>gpu``: :class:`~coda_agent.verifier.schedule.Scheduler` over the first
  ``g`` visible GPUs (g = 1, 2, ..., all; ``CUDA_VISIBLE_DEVICES`` limits what is visible):
  CPU stages in parallel, correctness screened side by side within memory budgets, every
  timing alone on its GPU.

Throughput = candidates / (wall hours x GPUs used). Outcomes must not differ between modes
(same files, independent secret seeds): the JSON says so per file (``same_outcomes``).
With ``--no-bench`` every mode stops after correctness (no timing: shared GPUs throughout).

Usage (device; one command, results under ``--out``)::

    python benchmarks/verify_throughput.py --out $OUT/throughput [--kernels swiglu_fwd,gemm_rmsnorm]
        [--copies 1] [--wrong 3] [--no-bench] [--gpus 1,2,8] [--skip-serial]

Writes ``throughput.json`` (per mode: wall s, GPUs, candidates per GPU-hour, each file's
outcome and placement) and ``throughput.md`` (the table); exits 1 when outcomes differ
between modes. :func:`measure` also runs on the CPU test device with stand-in GPUs
(tests/verifier/test_verify_throughput.py); those numbers are not GPU numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KERNELS = ("swiglu_fwd", "gemm_rmsnorm")
WRONG = {
    "swiglu_fwd": ("g * sigmoid(g) * u", "sigmoid(g) * u"),  # the gate's factor g dropped
    "gemm_rmsnorm": ('{"D": acc * rstd}', '{"D": acc}'),  # the row scale dropped
}
"""Per kernel, the text replaced in its accepted ``kernel.py`` to make a wrong variant."""


def candidates(root: Path, kernels: list[str], copies: int, work: Path, wrong: int = 0) -> list[tuple[Any, Path]]:
    """``(loaded spec, file)`` for each accepted kernel, ``copies`` times, and ``wrong`` wrong
    variants of it (:data:`WRONG`), each its own file under ``work``. Raises ``ValueError``
    for a wrong variant of a kernel :data:`WRONG` has none for."""
    from coda_agent.verifier.spec import load_spec

    out = []
    for name in kernels:
        loaded = load_spec(root / "kernel_specs" / name)
        src = (root / "generated_kernels" / name / "kernel.py").read_text()
        if wrong and (name not in WRONG or WRONG[name][0] not in src):
            raise ValueError(f"no wrong variant of {name} (benchmarks/verify_throughput.py WRONG)")
        bodies = [("ok", src)] * copies + [("wrong", src.replace(*WRONG[name]) if wrong else src)] * wrong
        for i, (kind, body) in enumerate(bodies):
            d = work / f"{name}-{kind}-{i}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "kernel.py").write_text(body)
            out.append((loaded, d / "kernel.py"))
    return out


def run_serial(items: list[tuple[Any, Path]], bench: bool, device: str) -> list[Any]:
    from coda_agent.verifier.pipeline import verify

    return [verify(loaded, path, bench=bench, device=device) for loaded, path in items]


def run_scheduler(items: list[tuple[Any, Path]], bench: bool, gpus: list[Any], device: str) -> list[Any]:
    from coda_agent.verifier.schedule import Job, LocalExecutor, Scheduler

    sched = Scheduler(executor=LocalExecutor(gpus, device=device), screen=True)
    return sched.verify_many([Job(loaded, path, bench=bench, label=path.parent.name) for loaded, path in items])


def measure(
    items: list[tuple[Any, Path]],
    *,
    bench: bool,
    gpu_counts: list[int],
    gpus: list[Any],
    device: str = "cuda",
    serial: bool = True,
) -> dict[str, Any]:
    """Every mode over ``items``; the report dict (see the module docstring)."""
    modes: dict[str, Any] = {}
    plan = ([("serial", 1)] if serial else []) + [(f"scheduler-{g}gpu", g) for g in gpu_counts]
    for mode, g in plan:
        t0 = time.monotonic()
        verdicts = (
            run_serial(items, bench, device) if mode == "serial" else run_scheduler(items, bench, gpus[:g], device)
        )
        wall = time.monotonic() - t0
        modes[mode] = {
            "gpus": g,
            "wall_s": round(wall, 1),
            "candidates": len(items),
            "per_gpu_hour": round(len(items) / (wall / 3600) / g, 1),
            "files": [
                {"file": p.parent.name, "outcome": v.outcome, "placement": v.environment.placement}
                for (_, p), v in zip(items, verdicts, strict=True)
            ],
        }
    outcomes = [[f["outcome"] for f in m["files"]] for m in modes.values()]
    return {
        "bench": bench,
        "device": device,
        "gpus": [g.label for g in gpus],
        "modes": modes,
        "same_outcomes": all(o == outcomes[0] for o in outcomes),
    }


def table(rep: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    base = rep["modes"].get("serial", {}).get("per_gpu_hour")
    lines = [
        f"Candidates verified per GPU-hour ({'full verification' if rep['bench'] else 'correctness only'}; "
        f"{', '.join(rep['gpus']) or 'no GPU'}; outcomes equal across modes: {rep['same_outcomes']})",
        "",
        "| mode | GPUs | candidates | wall s | per GPU-hour | vs serial |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in rep["modes"].items():
        vs = f"{m['per_gpu_hour'] / base:.2f}x" if base else "-"
        lines.append(f"| {name} | {m['gpus']} | {m['candidates']} | {m['wall_s']} | {m['per_gpu_hour']} | {vs} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for throughput.json and throughput.md")
    ap.add_argument("--kernels", default=",".join(DEFAULT_KERNELS), help="accepted kernels, comma-separated")
    ap.add_argument("--copies", type=int, default=1, help="copies of each accepted kernel (default 1)")
    ap.add_argument("--wrong", type=int, default=3, help="wrong variants of each kernel (default 3)")
    ap.add_argument("--no-bench", action="store_true", help="correctness only (no timing)")
    ap.add_argument("--gpus", help="GPU counts to measure, comma-separated (default 1, 2, 4, ... and all)")
    ap.add_argument("--skip-serial", action="store_true", help="leave out the one-at-a-time mode")
    a = ap.parse_args(argv)
    from coda_agent.verifier.schedule import visible_gpus

    gpus = visible_gpus()
    if not gpus:
        print("no GPU visible: this measures GPU verification", file=sys.stderr)
        return 2
    counts = [int(x) for x in a.gpus.split(",")] if a.gpus else sorted({*(2**i for i in range(8)), len(gpus)})
    counts = [g for g in counts if 1 <= g <= len(gpus)]
    a.out.mkdir(parents=True, exist_ok=True)
    items = candidates(ROOT, [k for k in a.kernels.split(",") if k], a.copies, a.out / "candidates", a.wrong)
    rep = measure(items, bench=not a.no_bench, gpu_counts=counts, gpus=gpus, serial=not a.skip_serial)
    (a.out / "throughput.json").write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
    (a.out / "throughput.md").write_text(table(rep))
    print(table(rep))
    return 0 if rep["same_outcomes"] else 1


if __name__ == "__main__":
    sys.exit(main())

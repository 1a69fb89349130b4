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
  timing alone on its GPU;
* ``ray-<g>gpu`` (with ``--ray ADDRESS|auto``): the same scheduler with its GPU runs as Ray
  tasks on that cluster's ``g`` GPUs (:mod:`~coda_agent.verifier.schedule.ray_executor`).

Throughput = candidates / (wall hours x GPUs used). Outcomes must not differ between modes
(same files, independent secret seeds): the JSON says so per file (``same_outcomes``).
With ``--no-bench`` every mode stops after correctness (no timing: shared GPUs throughout);
``--bench-shapes`` and ``--baselines`` narrow the benchmark stage of every mode alike (the
spec's names), for a shorter run.

Usage (device; one command, results under ``--out``)::

    python benchmarks/verify_throughput.py --out $OUT/throughput [--kernels swiglu_fwd,gemm_rmsnorm]
        [--copies 1] [--wrong 3] [--no-bench] [--gpus 1,2,8] [--skip-serial] [--ray auto]
        [--bench-shapes llama3-8b/M8192] [--baselines bare_gemm]

Writes ``throughput.json`` (per mode: wall s, GPUs, candidates per GPU-hour, each file's
outcome and placement; rewritten after each mode, so a run cut short keeps the modes done)
and ``throughput.md`` (the table); exits 1 when outcomes differ between modes. :func:`measure` also runs on the CPU test device with stand-in GPUs
(tests/verifier/test_verify_throughput.py); those numbers are not GPU numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

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


def run_serial(items: list[tuple[Any, Path]], bench: bool, device: str, **narrow: Any) -> list[Any]:
    """``pipeline.verify`` file after file; ``narrow``: ``bench_shapes``, ``baselines``."""
    from coda_agent.verifier.pipeline import verify

    return [verify(loaded, path, bench=bench, device=device, **narrow) for loaded, path in items]


def run_scheduler(items: list[tuple[Any, Path]], bench: bool, executor: Any, **narrow: Any) -> list[Any]:
    """The scheduler over ``executor`` (a ``LocalExecutor`` or a ``RayExecutor``)."""
    from coda_agent.verifier.schedule import Job, Scheduler

    sched = Scheduler(executor=executor, screen=True)
    return sched.verify_many(
        [Job(loaded, path, bench=bench, label=path.parent.name, **narrow) for loaded, path in items]
    )


def measure(
    items: list[tuple[Any, Path]],
    *,
    bench: bool,
    gpu_counts: list[int],
    gpus: list[Any],
    device: str = "cuda",
    serial: bool = True,
    ray: Any = None,
    bench_shapes: list[Any] | None = None,
    baselines: list[str] | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every mode over ``items``; the report dict (see the module docstring). ``ray``: a
    ``RayExecutor`` (adds the ``ray-<g>gpu`` mode, g its GPU count); ``bench_shapes`` (the
    spec's names, or ``{"name", "dims"}``) and ``baselines``: the benchmark stage's (None:
    the spec's); ``checkpoint(report)`` is
    called after each mode with the report so far."""
    from coda_agent.verifier.schedule import LocalExecutor

    narrow: dict[str, Any] = {"bench_shapes": bench_shapes, "baselines": baselines}
    modes: dict[str, Any] = {}
    plan: list[tuple[str, int, Callable[[], list[Any]]]] = []
    if serial:
        plan.append(("serial", 1, lambda: run_serial(items, bench, device, **narrow)))
    for g in gpu_counts:
        plan.append(
            (
                f"scheduler-{g}gpu",
                g,
                lambda g=g: run_scheduler(items, bench, LocalExecutor(gpus[:g], device=device), **narrow),
            )
        )
    if ray is not None:
        plan.append((f"ray-{ray.gpu_count}gpu", ray.gpu_count, lambda: run_scheduler(items, bench, ray, **narrow)))
    rep: dict[str, Any] = {}
    for mode, g, run in plan:
        t0 = time.monotonic()
        verdicts = run()
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
        rep = {
            "bench": bench,
            "bench_shapes": bench_shapes,
            "baselines": baselines,
            "device": device,
            "gpus": [g.label for g in gpus],
            "modes": modes,
            "same_outcomes": all(o == outcomes[0] for o in outcomes),
        }
        if checkpoint is not None:
            checkpoint(rep)
    return rep


def table(rep: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    base = rep["modes"].get("serial", {}).get("per_gpu_hour")
    what = "correctness only"
    if rep["bench"]:
        what = "full verification"
        if rep.get("bench_shapes") or rep.get("baselines"):
            shapes = ", ".join(
                x if isinstance(x, str) else x["name"] for x in rep.get("bench_shapes") or ["the spec's"]
            )
            timed = ", ".join(rep.get("baselines") or ["the spec's"])
            what += f" (bench shapes: {shapes}; baselines: {timed})"
    lines = [
        f"Candidates verified per GPU-hour ({what}; "
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
    ap.add_argument("--ray", metavar="ADDRESS", help="also measure the scheduler on this Ray cluster (or auto)")
    ap.add_argument("--bench-shapes", help="the spec's benchmark shapes to time, comma-separated (default: all)")
    ap.add_argument("--baselines", help="baselines to time, comma-separated (default: the spec's)")
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
    ray = None
    if a.ray:
        from coda_agent.verifier.schedule.ray_executor import RayExecutor

        ray = RayExecutor(a.ray)

    def save(rep: dict[str, Any]) -> None:
        (a.out / "throughput.json").write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
        (a.out / "throughput.md").write_text(table(rep))

    def names(text: str | None) -> list[str] | None:
        return [x for x in text.split(",") if x] if text else None

    rep = measure(
        items,
        bench=not a.no_bench,
        gpu_counts=counts,
        gpus=gpus,
        serial=not a.skip_serial,
        ray=ray,
        bench_shapes=names(a.bench_shapes),
        baselines=names(a.baselines),
        checkpoint=save,
    )
    print(table(rep))
    return 0 if rep["same_outcomes"] else 1


if __name__ == "__main__":
    sys.exit(main())

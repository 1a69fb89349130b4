"""``coda-agent tune`` and ``coda-agent build``: the functions behind the two commands.

``cli.py`` registers the parsers (:func:`add_parsers`) and ``commands/tune.py`` prints;
these functions return rows and raise ``ValueError`` for bad input (the CLI turns it into
exit code 2).

* ``tune [KERNEL...] [--shape NAME]... [--space quick|full] [-j N]`` (GPU): per kernel,
  :func:`coda_agent.verifier.tune.tune.tune_kernel`; the table is merged into
  ``generated_kernels/tuning.json`` and the page written under ``--out`` (default
  ``benchmarks/results/<date>-<gpu>-tuning.md`` with the raw sweep records beside it).
* ``build [KERNEL...] [--shape NAME]... [-j N] [--arch sm_90a]`` (CPU or GPU machine):
  compiles every accepted kernel at the given benchmark shapes with its own configs and
  every tuned config of ``tuning.json`` into the kernel cache
  (:func:`coda_agent.runtime.cache.cache_dir`), so a training run's first step loads
  objects instead of compiling.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from pathlib import Path
from typing import Any

from ...runtime import tuning
from ..spec import load_spec


def accepted(root: Path) -> list[str]:
    """Accepted kernels (a ``kernel.py`` under ``generated_kernels/``) that have a spec."""
    kdir = root / "generated_kernels"
    return sorted(
        p.parent.name
        for p in kdir.glob("*/kernel.py")
        if (root / "kernel_specs" / p.parent.name / "spec.toml").is_file()
    )


def _kernels(root: Path, names: list[str]) -> list[str]:
    have = accepted(root)
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ValueError(f"not an accepted kernel: {', '.join(unknown)} (accepted: {', '.join(have)})")
    return names or have


def slug(gpu: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100``: the results-file prefix."""
    m = re.search(r"(h100|h200|h20|h800|gh200)", gpu.lower())
    return "nvidia-" + (m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-"))


def run_tune(
    root: Path,
    names: list[str],
    shapes: list[str],
    space: str,
    workers: int,
    out: Path | None,
    table_path: Path | None = None,
    progress=None,
) -> tuple[list[Any], Path, Path]:
    """Tune ``names`` (all accepted kernels when empty); returns (results, table path, page path).
    Needs a CUDA GPU (RuntimeError otherwise)."""
    import torch

    from ..pipeline import verify
    from .tune import markdown, shapes_for, tune_kernel, write_table

    if not torch.cuda.is_available():
        raise RuntimeError("coda-agent tune needs a CUDA GPU (sm_90)")
    gpu = torch.cuda.get_device_name()
    kernels = _kernels(root, names)
    page = out or (root / "benchmarks" / "results" / f"{_dt.date.today().isoformat()}-{slug(gpu)}-tuning.md")
    workdir = page.with_suffix("")
    workdir.mkdir(parents=True, exist_ok=True)
    table_path = table_path or (root / "generated_kernels" / tuning.TABLE_NAME)
    results = []
    for k in kernels:
        loaded = load_spec(root / "kernel_specs" / k)
        if progress:
            progress(f"{k}: compiling, sweeping, re-verifying")
        res = tune_kernel(
            root,
            k,
            loaded,
            shapes_for(loaded, shapes or None),
            space=space,
            workers=workers,
            workdir=workdir,
            gpu=gpu,
            verify_fn=verify,
        )
        results.append(res)
        write_table(table_path, [res])  # per kernel: a later crash keeps what is done
        page.write_text(markdown(results, gpu))
    return results, table_path, page


def run_build(root: Path, names: list[str], shapes: list[str], workers: int, arch: str, progress=None) -> list[Any]:
    """Compile ``names`` (all accepted when empty) at ``shapes`` (each kernel's
    :data:`~coda_agent.verifier.tune.tune.DEFAULT_SHAPES` when empty) with their own
    configs and every tuned config of the table, into the kernel cache; returns the
    :class:`~coda_agent.verifier.tune.build.Done` list."""
    from . import build
    from .tune import shapes_for

    if arch != build.TARGET_ARCH:
        raise ValueError(f"--arch {arch}: only {build.TARGET_ARCH} (Hopper) kernels are built")
    table = tuning.load(root / "generated_kernels" / tuning.TABLE_NAME)
    jobs = []
    for k in _kernels(root, names):
        loaded = load_spec(root / "kernel_specs" / k)
        tuned: dict[str, dict[str, dict[str, Any]]] = {}
        for e in table.entries:
            if e.kernel == k:
                tuned.setdefault(e.epilogue, {})[e.bucket] = e.config
        for sh in shapes_for(loaded, shapes or None):
            jobs.append(build.Job(k, str(loaded.directory), sh["dims"], {}, f"{k} {sh['name']} own"))
            if tuned:
                jobs.append(build.Job(k, str(loaded.directory), sh["dims"], tuned, f"{k} {sh['name']} tuned"))
    t0 = time.monotonic()
    done = build.compile_jobs(
        jobs, workers, progress=(lambda n, t: progress(f"{n}/{t} compiled")) if progress else None
    )
    if progress:
        progress(f"{len(done)} builds in {time.monotonic() - t0:.0f} s")
    return done


def add_parsers(sub, fn_tune, fn_build) -> None:
    """Register ``tune`` and ``build`` on the CLI's subparsers."""
    t = sub.add_parser("tune", help="search each accepted kernel's GEMM config per shape on the GPU (tuning.json)")
    t.add_argument("kernel", nargs="*", help="accepted kernels (default: all)")
    t.add_argument("--shape", action="append", default=[], help="a spec benchmark shape name (repeatable)")
    t.add_argument("--space", choices=("quick", "full"), default="full", help="config space (default: full)")
    t.add_argument("-j", "--jobs", type=int, default=0, help="compile workers (default: CPU cores)")
    t.add_argument("--out", type=Path, help="the tuning page (default: benchmarks/results/<date>-<gpu>-tuning.md)")
    t.set_defaults(fn=fn_tune)
    b = sub.add_parser("build", help="compile accepted kernels ahead of time into the kernel cache")
    b.add_argument("kernel", nargs="*", help="accepted kernels (default: all)")
    b.add_argument("--shape", action="append", default=[], help="a spec benchmark shape name (repeatable)")
    b.add_argument("-j", "--jobs", type=int, default=0, help="compile workers (default: CPU cores)")
    b.add_argument("--arch", default="sm_90a", help="target architecture (only sm_90a)")
    b.set_defaults(fn=fn_build)

"""GEMM configs and the kernel cache: ``coda-agent tune`` and ``coda-agent build``.

The work and the parsers are :mod:`~coda_agent.verifier.tune.command`'s; these functions
print its rows. Exit code 1 when a kernel failed to tune or build; 2 for bad input (its
``ValueError``) and for a ``tune`` that could not run (its ``RuntimeError``: no GPU, a
sweep that kept crashing).
"""

from __future__ import annotations

from rich.markup import escape

from .common import FAILED, OK, UsageError, console, workspace_root


def cmd_tune(args) -> int:
    """Tune accepted kernels' GEMM configs on the GPU (``verifier/tune/command.py``)."""
    import os

    from ..verifier.tune.command import run_tune

    root = workspace_root(args)
    try:
        results, table, page = run_tune(
            root,
            args.kernel,
            args.shape,
            args.space,
            args.jobs or os.cpu_count() or 1,
            args.out,
            progress=lambda m: console.print(escape(m)),
        )
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"tune: {e}") from None
    for r in results:
        for row in r.rows:
            console.print(
                escape(
                    f"{r.kernel} {row['shape']} {row['epilogue']}: default {row['default_ms']} ms, "
                    f"best {row['best_ms']} ms ({row['best_name']}), cuBLAS {row['cublas_ms']} ms, "
                    f"route {row.get('route')}"
                )
            )
        if r.status != "ok":
            console.print(escape(f"{r.kernel}: {r.status}: {r.note}"), style="red")
    console.print(escape(f"wrote {table} and {page}"))
    return OK if all(r.status == "ok" for r in results) else FAILED


def cmd_build(args) -> int:
    """Compile accepted kernels ahead of time into the kernel cache."""
    import os

    from ..runtime.cache import cache_dir
    from ..verifier.tune.command import run_build

    root = workspace_root(args)
    try:
        done = run_build(root, args.kernel, args.shape, args.jobs or os.cpu_count() or 1, args.arch)
    except ValueError as e:
        raise UsageError(f"build: {e}") from None
    for d in done:
        line = f"{d.job.label}: {'ok' if d.ok else 'FAILED ' + d.error} ({d.seconds:.1f} s, {d.planned} variants)"
        console.print(escape(line), style=None if d.ok else "red")
    console.print(escape(f"kernel cache: {cache_dir()}"))
    return OK if all(d.ok for d in done) else FAILED

"""``coda-agent tune``: per shape bucket, the fastest GEMM config of each accepted kernel,
re-verified, and the route the dispatcher takes, written to ``generated_kernels/tuning.json``.

Per kernel, in order:

1. **compile** every stage-1 candidate config (:mod:`.space`) ahead of time on CPU
   workers (:mod:`.build`), so the GPU never waits on a JIT compile;
2. **sweep** (:mod:`.sweep`, a subprocess per kernel): the entry with its own configs, with
   each candidate pinned to one epilogue call, and cuBLAS on that call's operands; a
   process that dies is restarted without the config it was running (the ``try`` record
   with no result), at most :data:`MAX_RESTARTS` times;
3. **choose**: per (epilogue, bucket), the fastest candidate, kept only when it beats the
   kernel's own config by more than :data:`MIN_GAIN` (else the kernel's own is recorded);
4. **re-verify** when any config changed (``verify(..., tuning=..., bench=False)``: every
   public case, the secret coverage, gradients, with the chosen configs: a new config is a
   new binary). A kernel whose re-verification does not pass gets no entry;
5. **route**: ``fused`` where the tuned entry's median beats the standard path's
   (``torch.compile`` of the spec's baseline: cuBLAS + compiled elementwise), timed in the
   same sweep on the same inputs, else ``standard``.

The table is merged into the existing one (entries of other kernels, GPUs and buckets
stay) and written atomically; a markdown summary goes beside the sweep's raw records.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...runtime import tuning
from ..spec import LoadedSpec
from ..workspace import atomic_write_text, sha256_file
from . import build as _build
from .space import stage1

MIN_GAIN = 0.01
"""A tuned config must beat the kernel's own by more than 1 % (the run-to-run spread of a
median at these sizes) to replace it."""
MAX_RESTARTS = 4
DEFAULT_SHAPES = ("llama3-1b/M8192", "llama3-8b/M8192")
"""The shapes tuned when ``--shape`` is not given and the spec has them (the widths
``benchmarks/llama_layer.py`` and ``hf_train.py`` train at); else the spec's first shape."""


@dataclass
class KernelResult:
    """What tuning one kernel produced (for the CLI table and the JSON report)."""

    kernel: str
    entries: list[tuning.Entry] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    compile_s: float = 0.0
    sweep_s: float = 0.0
    verify_s: float = 0.0
    status: str = "ok"
    note: str = ""


def shapes_for(loaded: LoadedSpec, wanted: list[str] | None) -> list[dict[str, Any]]:
    """The spec's benchmark shapes to tune: ``wanted`` names (ValueError for an unknown
    one), else :data:`DEFAULT_SHAPES` present in the spec, else its first shape."""
    bench = {b.name: dict(b.dims) for b in loaded.spec.shapes.benchmark}
    if wanted:
        unknown = [w for w in wanted if w not in bench]
        if unknown:
            raise ValueError(f"{loaded.name}: unknown benchmark shape(s) {unknown} (spec has {sorted(bench)})")
        names = wanted
    else:
        names = [n for n in DEFAULT_SHAPES if n in bench] or list(bench)[:1]
    return [{"name": n, "dims": bench[n]} for n in names]


def _compile_all(kernel: str, loaded: LoadedSpec, shapes, space: str, workers: int) -> float:
    """Compile both stages of every epilogue's space at every shape (jobs on CPU workers)."""
    import time

    kernels = importlib.import_module("coda_agent.kernels")
    from ...runtime.launch import epilogue_mods

    t0 = time.monotonic()
    mods = epilogue_mods(kernels.load(kernel))
    jobs = []
    for sh in shapes:
        for epi, mod in mods.items():
            # stage 2 (dynamic persistent) compiles on first use in the sweep: it holds only
            # the leaders' few variants
            for cfg in stage1(mod, space):
                jobs.append(
                    _build.Job(kernel, str(loaded.directory), sh["dims"], {epi: {"*": tuning.config_to_dict(cfg)}})
                )
    _build.compile_jobs(jobs, workers)
    return time.monotonic() - t0


def _sweep(kernel: str, loaded: LoadedSpec, shapes, space: str, workdir: Path, timeout_s: float) -> list[dict]:
    """Run the sweep subprocess (restarted past crashing configs); its records."""
    out = workdir / f"{kernel}.sweep.jsonl"
    out.unlink(missing_ok=True)
    skip: list[str] = []
    for _ in range(MAX_RESTARTS + 1):
        req = workdir / f"{kernel}.request.json"
        req.write_text(
            json.dumps(
                {"kernel": kernel, "spec_dir": str(loaded.directory), "shapes": shapes, "space": space, "skip": skip}
            )
        )
        done_before = _records(out)
        proc = subprocess.run(
            [sys.executable, "-m", "coda_agent.verifier.tune.sweep", str(req), str(out)],
            timeout=timeout_s,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            capture_output=True,
            text=True,
        )
        recs = _records(out)
        if proc.returncode == 0:
            return recs
        tries = [r for r in recs[len(done_before) :] if r["kind"] == "try"]
        results = {(r["shape"], r["epilogue"], r["config"]) for r in recs if r["kind"] in ("time", "fail")}
        crashed = [t for t in tries if (t["shape"], t["epilogue"], t["config"]) not in results]
        if not crashed:
            raise RuntimeError(f"tune sweep of {kernel} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        skip.append(f"{crashed[-1]['epilogue']}:{crashed[-1]['config']}")
        # the shapes already swept stay in the file; the restart appends (choose() takes the last)
    raise RuntimeError(f"tune sweep of {kernel}: more than {MAX_RESTARTS} crashing configs ({skip})")


def _records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def choose(records: list[dict]) -> list[dict[str, Any]]:
    """Per (shape, epilogue, bucket): the kernel's own config and ms, the best candidate,
    cuBLAS ms, and ``tuned`` (the config to record: the best when it beats the default
    entry time by more than :data:`MIN_GAIN`, else the kernel's own)."""
    sites, default_ms, cublas, best, calls, base = {}, {}, {}, {}, {}, {}
    for r in records:
        k = r["kind"]
        if k == "baseline" and "ms" in r:
            base[(r["shape"], r["baseline"])] = r["ms"]
        if k == "sites":
            calls[r["shape"]] = r.get("call")
            for s in r["sites"]:
                sites[(r["shape"], s["epilogue"], s["bucket"])] = s
        elif k == "default":
            default_ms[r["shape"]] = r["ms"]
        elif k == "cublas":
            cublas[(r["shape"], r["epilogue"], r["bucket"])] = r["ms"]
        elif k == "time":
            key = (r["shape"], r["epilogue"], r["bucket"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    rows = []
    for key, s in sites.items():
        shape, epi, b = key
        d_ms, top = default_ms.get(shape), best.get(key)
        gain = top is not None and d_ms is not None and top["ms"] < d_ms * (1 - MIN_GAIN)
        rows.append(
            dict(
                shape=shape,
                call=calls.get(shape),
                epilogue=epi,
                bucket=b,
                default_config=s["default"],
                default_ms=d_ms,
                best_config=top["config_fields"] if top else None,
                best_name=top["config"] if top else None,
                best_ms=top["ms"] if top else None,
                cublas_ms=cublas.get(key),
                tuned=top["config_fields"] if gain and top else s["default"],
                tuned_ms=top["ms"] if gain and top else d_ms,
                changed=bool(gain),
                standard_ms=base.get((shape, "standard")),
                bare_gemm_ms=base.get((shape, "bare_gemm")),
            )
        )
    return rows


def tune_kernel(
    root: Path,
    kernel: str,
    loaded: LoadedSpec,
    shapes: list[dict[str, Any]],
    *,
    space: str,
    workers: int,
    workdir: Path,
    gpu: str,
    verify_fn: Callable[..., Any],
    sweep_timeout_s: float = 3600,
) -> KernelResult:
    """Steps 1-5 of the module docstring for one kernel; raises RuntimeError when its sweep
    cannot finish."""
    import time

    res = KernelResult(kernel)
    path = root / "generated_kernels" / kernel / "kernel.py"
    sha = sha256_file(path)
    res.compile_s = _compile_all(kernel, loaded, shapes, space, workers)
    t0 = time.monotonic()
    rows = choose(_sweep(kernel, loaded, shapes, space, workdir, sweep_timeout_s))
    res.sweep_s = time.monotonic() - t0
    overrides: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        overrides.setdefault(r["epilogue"], {})[r["bucket"]] = r["tuned"]
        ms, std = r["tuned_ms"], r["standard_ms"]
        r["route"] = "fused" if std is None or ms is None or ms <= std else "standard"
    res.rows = rows
    status = "own configs (already verified)"
    if any(r["changed"] for r in rows):
        t0 = time.monotonic()
        verdict = verify_fn(loaded, path, tuning=overrides, bench=False)
        res.verify_s = time.monotonic() - t0
        (workdir / f"{kernel}.verdict.json").write_text(verdict.model_dump_json(indent=1))
        fs = verdict.failed_stage
        status = "pass" if verdict.gpu_correct else (f"{fs.stage} {fs.status}" if fs else "not run on a GPU")
        if not verdict.gpu_correct:
            res.status, res.note = "rejected", f"re-verification with the tuned configs: {status}"
            return res
    today = _dt.date.today().isoformat()
    for r in rows:
        if r["default_ms"] and r["tuned_ms"]:
            res.entries.append(
                tuning.Entry(
                    kernel=kernel,
                    kernel_sha256=sha,
                    gpu=gpu,
                    epilogue=r["epilogue"],
                    bucket=r["bucket"],
                    shape=r["shape"],
                    config=r["tuned"],
                    default_ms=r["default_ms"],
                    tuned_ms=r["tuned_ms"],
                    cublas_ms=r["cublas_ms"],
                    standard_ms=r["standard_ms"],
                    route=r["route"],
                    call=r["call"],
                    verified={"date": today, "numerics": status},
                )
            )
    return res


def write_table(path: Path, results: list[KernelResult]) -> tuning.Table:
    """Merge every result's entries into the table at ``path`` and write it atomically."""
    table = tuning.load(path).merged([e for r in results for e in r.entries])
    atomic_write_text(path, tuning.dump(table))
    return table


def markdown(results: list[KernelResult], gpu: str) -> str:
    """The tuning page: default vs tuned vs cuBLAS per kernel, epilogue and shape; routes."""
    lines = [
        f"# Tuned GEMM configs on {gpu}",
        "",
        "All numbers from one sweep per kernel (do_bench medians, ms, L2 flushed, rotated input sets, same",
        "inputs): default = the kernel entry with its own configs; tuned = with the chosen config (the best",
        "candidate when it beats default by more than 1 %, re-verified; else the default); best = the",
        "fastest candidate (config); GEMM = cuBLAS `torch.mm` on that epilogue call's own operands; bare =",
        "the spec's bare GEMM; standard = `torch.compile` of the spec's baseline (cuBLAS + compiled",
        "elementwise). tuned/GEMM is the fused kernel against cuBLAS; route: the path the dispatcher takes.",
        "",
        "| kernel | shape | epilogue | default | tuned | best (config) | GEMM | tuned/GEMM | bare | standard | route |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x):
        return "n/a" if x is None else f"{x:.4f}"

    for res in results:
        for r in res.rows:
            best = f"{f(r['best_ms'])} ({r['best_name']})" if r["best_name"] else "n/a"
            t, g = r.get("tuned_ms"), r.get("cublas_ms")
            ratio = f"{t / g:.3f}" if t and g else "n/a"
            lines.append(
                f"| {res.kernel} | {r['shape']} | {r['epilogue']} | {f(r['default_ms'])} | {f(t)} | {best} | "
                f"{f(g)} | {ratio} | {f(r.get('bare_gemm_ms'))} | {f(r.get('standard_ms'))} | "
                f"{r.get('route', 'n/a')} |"
            )
        if res.status != "ok":
            lines.append(f"| {res.kernel} | | | {res.status}: {res.note} | | | | | | | |")
    return "\n".join(lines) + "\n"

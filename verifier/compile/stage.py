"""Stage 2 of the verifier: compile the candidate's kernels for sm_90a, without launching them.

The candidate is imported and its entry point called with CPU ``torch.empty`` tensors in
a subprocess (:mod:`coda_agent.verifier.compile.worker`); quack traces each
``@gemm_epilogue``, lowers it and runs ptxas for sm_90a, but the launch is replaced by a
counter. This needs no GPU (CI runs it), takes 1-3 s per kernel variant after a ~5 s
import, and catches before any GPU time is spent: DSL errors in the epilogue (typos,
unsupported constructs), host-code errors on the spec's shapes, a ragged shape the host
code cannot handle, outputs of the wrong count/type/shape/dtype, entries that never
build a kernel, and hangs.

Design
------
* **The candidate is untrusted even after the static stage**, so it runs in a child
  process (``sys.executable -m coda_agent.verifier.compile.worker``) in its own session
  and process group, in a private temporary folder, with ``CUDA_VISIBLE_DEVICES=""`` and
  an environment reduced to what Python, CUDA tools, quack and the DSL need (no API keys
  or tokens). On timeout the whole group is killed. The result comes back as a JSON file
  (written atomically), never through stdout, which the candidate may flood (the worker
  caps the size of files it writes; the parent reads only the tail of stderr).
* **Two shape cases.** :func:`compile_stage` calls the entry with the spec's first
  correctness case and with one ragged case (a dim not a multiple of 128), in the same
  worker. Kernels are compiled for symbolic shapes, so the second call usually compiles
  nothing new -- but it runs the host code on a shape it was not written for, and the
  outputs of both calls are checked against the spec's shapes and dtypes here, in the
  trusted parent.
* **Compile cache: private per call (default).** quack caches compiled kernels on disk
  (``$QUACK_CACHE_DIR``, default ``$TMPDIR/$USER/quack_cache``) keyed by a deep
  fingerprint of each epilogue fn, and the CuTe DSL keeps its own file cache
  (``$CUTE_DSL_CACHE_DIR``). A shared cache would be *correct* (the key changes with the
  fn's source and everything it references), but the verifier does not use one by
  default: (1) a compile must really compile, so that ``variants_compiled`` and
  ``compile_s`` measure this candidate and the verdict does not depend on what an earlier
  run left on the machine; (2) an untrusted process should not write objects that later
  processes (other candidates, the trusted reference worker) load. So quack's disk cache is
  disabled (``QUACK_CACHE_ENABLED=0``: in-process compile only) and both cache variables
  point into the call's temporary folder, which is deleted afterwards. Callers that accept
  sharing (a test suite compiling many candidates that share an epilogue) pass
  ``cache_dir=``; the metric ``cache`` says which mode ran.
* **Findings point at the candidate.** Errors carry the candidate line (the DSL's own
  line for ``DSLUserCodeError``, else the innermost candidate frame); hangs and crashes
  are located from a ``faulthandler`` stack dump; output mismatches point at the entry's
  ``return``.

Finding kinds (stable): ``timeout``, ``worker-crash``, ``import-error``, ``entry-missing``,
``compile-error``, ``no-kernel``, ``output-count``, ``output-type``, ``output-shape``,
``output-dtype`` (failures); ``tuned-default`` (a note on a passing stage);
``verifier-error`` / ``environment`` (status ``error``: not the candidate's fault).
"""

from __future__ import annotations

import ast
import json
import signal
import tempfile
from pathlib import Path
from typing import Any

from ..confine.sandbox import read_worker_file, run_worker, tail_file, worker_env
from ..spec import KernelSpec, LoadedSpec, ShapeCase
from ..verdict import Finding, StageResult
from .worker import FAULT_FILE, STARTED_FILE, clip_lines, lines_from_stack_dump, strip_ansi

__all__ = ["compile_cpu", "compile_stage", "select_cases", "strip_ansi", "FAIL_KINDS"]

FAIL_KINDS = frozenset(
    {
        "timeout",
        "worker-crash",
        "import-error",
        "entry-missing",
        "compile-error",
        "no-kernel",
        "output-count",
        "output-type",
        "output-shape",
        "output-dtype",
    }
)
"""Finding kinds that fail the stage (others are notes)."""

ERROR_KINDS = frozenset({"verifier-error", "environment"})
"""Finding kinds that make the status ``error`` (the verifier or machine, not the candidate)."""

ArgSpec = tuple[str, tuple[int, ...], str]
"""One entry argument: (input name, shape, torch dtype name)."""


# --------------------------------------------------------------------------- worker process


def _run_worker(
    candidate: Path,
    entry: str,
    calls: list[dict[str, Any]],
    timeout_s: float,
    cache_dir: Path | None,
    sha256: str | None = None,
) -> dict[str, Any]:
    """Run the worker on ``calls``; return its result plus ``rc``, ``timed_out``, ``stderr``,
    ``fault`` (faulthandler text) and ``wall_s``."""
    with tempfile.TemporaryDirectory(prefix="coda-compile-") as tmp_s:
        tmp = Path(tmp_s)
        req_path, res_path = tmp / "request.json", tmp / "result.json"
        req_path.write_text(json.dumps({"candidate": str(candidate), "sha256": sha256, "entry": entry, "calls": calls}))
        env = worker_env()
        env.update(
            QUACK_ARCH="sm_90",
            CUTE_DSL_ARCH="sm_90a",
            CUDA_VISIBLE_DEVICES="",
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONUNBUFFERED="1",
            NO_COLOR="1",
            TMPDIR=str(tmp),  # the worker may write only beneath tmp (and a shared cache)
            TRITON_CACHE_DIR=str(tmp / "triton_cache"),
        )
        if cache_dir is None:
            env.update(
                QUACK_CACHE_ENABLED="0",
                QUACK_CACHE_DIR=str(tmp / "quack_cache"),
                CUTE_DSL_CACHE_DIR=str(tmp / "cute_dsl_cache"),
            )
        else:
            cache_dir.mkdir(parents=True, exist_ok=True)
            env.update(
                QUACK_CACHE_ENABLED="1",
                QUACK_CACHE_DIR=str(cache_dir / "quack"),
                CUTE_DSL_CACHE_DIR=str(cache_dir / "cute_dsl"),
            )
        dump_after = max(timeout_s - min(5.0, 0.2 * timeout_s), 0.5)
        out = run_worker(
            "coda_agent.verifier.compile.worker",
            ["--request", str(req_path), "--result", str(res_path), "--dump-after", f"{dump_after:.2f}"],
            timeout_s,
            cwd=tmp,
            env=env,
            log_dir=tmp,
        )
        timed_out = out.status == "timeout"
        rc, wall = out.returncode, out.duration_s
        result: dict[str, Any] = {}
        data = read_worker_file(res_path)
        if data is not None:
            try:
                parsed = json.loads(data)
            except ValueError:  # not JSON, or not UTF-8
                parsed = None
            result = parsed if isinstance(parsed, dict) else {}
        stderr = out.stderr_tail
        fault = tail_file(tmp / FAULT_FILE)
        started = (tmp / STARTED_FILE).is_file()
    result.update(rc=rc, timed_out=timed_out, stderr=stderr, fault=fault, wall_s=wall, started=started)
    return result


# --------------------------------------------------------------------------- interpretation


def _entry_return_line(source: str, entry: str) -> int | None:
    """Line of the last ``return`` in the module-level entry def (output findings point there)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            rets = [n.lineno for n in ast.walk(node) if isinstance(n, ast.Return)]
            return max(rets) if rets else node.lineno
    return None


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except (ValueError, TypeError):
        return f"signal {-rc}"


def _interpret(
    res: dict[str, Any],
    candidate: Path,
    entry: str,
    timeout_s: float,
    expected: dict[str, list[tuple[str, tuple[int, ...], str]]] | None,
    cache_mode: str,
) -> StageResult:
    findings: list[Finding] = []
    source = candidate.read_text(errors="replace") if candidate.is_file() else ""
    ret_line = _entry_return_line(source, entry)
    err = res.get("error")
    calls = res.get("calls", [])
    cases = [c.get("case", "") for c in calls]

    if res["timed_out"]:
        lines = lines_from_stack_dump(res.get("fault", ""), str(candidate))
        where = f" (it was running candidate line {lines[0]} when the time ran out)" if lines else ""
        findings.append(
            Finding(
                kind="timeout",
                line=lines[0] if lines else None,
                message=f"the candidate did not finish within {timeout_s:.0f} s{where}; the worker was killed. "
                "An infinite loop or a wait that never ends?",
            )
        )
    elif not res.get("phase") and res["rc"] != 0:
        lines = lines_from_stack_dump(res.get("fault", ""), str(candidate))
        how = _signal_name(res["rc"]) if res["rc"] < 0 else f"exit code {res['rc']}"
        tail = clip_lines("\n".join(res.get("stderr", "").strip().splitlines()[-15:]), 15)
        findings.append(
            Finding(
                kind="worker-crash",
                line=lines[0] if lines else None,
                message=f"the compile worker died ({how}) while running the candidate"
                + (f" at candidate line {lines[0]}" if lines else "")
                + (f"\n{tail}" if tail else ""),
            )
        )
    elif not res.get("phase") and res.get("started"):
        # it exited cleanly (os._exit, SystemExit in a thread, ...) after the candidate's code
        # began to run and before a result was written: the candidate's doing, not ours
        findings.append(
            Finding(
                kind="worker-crash",
                message="the compile worker exited without a result while running the candidate's code "
                "(does the module exit or kill its own process?)",
            )
        )
    elif not res.get("phase"):
        findings.append(
            Finding(
                kind="verifier-error",
                message="the compile worker exited without writing a result\n" + clip_lines(res.get("stderr", ""), 15),
            )
        )
    elif res["phase"] == "setup":
        findings.append(
            Finding(
                kind="environment",
                message="quack/cutlass could not be set up for the CPU compile:\n" + (err or {}).get("message", ""),
            )
        )
    elif res["phase"] == "import":
        assert err is not None  # the worker records why it stopped in this phase
        findings.append(
            Finding(
                kind="import-error", line=err.get("line"), message="importing the candidate failed: " + err["message"]
            )
        )
    elif res["phase"] == "entry":
        assert err is not None  # the worker records why it stopped in this phase
        findings.append(Finding(kind="entry-missing", message=err["message"]))
    elif res["phase"] == "call" and err:
        case = err.get("case") or None
        msg = err["message"]
        if err.get("frames") and not err.get("dsl"):
            tb = "\n".join(f"  line {f['line']}, in {f['function']}: {f['code']}" for f in err["frames"])
            msg += f"\ncandidate frames (outermost first):\n{tb}"
        findings.append(Finding(kind="compile-error", line=err.get("line"), case=case, message=msg))

    if res.get("phase") == "done":
        if res.get("variants_compiled", 0) == 0:
            findings.append(
                Finding(
                    kind="no-kernel",
                    line=ret_line,
                    message=f"`{entry}` returned without building any quack kernel: the fused op must run "
                    "through a @gemm_epilogue mod (mod(A, B, C, out=..., tuned=False) or mod.gemm(...))",
                )
            )
        if expected is not None:
            for call in calls:
                findings += _check_outputs(call, expected.get(call.get("case", ""), []), ret_line)
    for note in res.get("notes", []) or []:
        findings.append(Finding(kind="tuned-default", message=note))

    if any(f.kind in ERROR_KINDS for f in findings):
        status = "error"
    elif any(f.kind in FAIL_KINDS for f in findings):
        status = "fail"
    else:
        status = "pass"
    metrics: dict[str, Any] = {
        "variants_compiled": res.get("variants_compiled", 0),
        "kernel_calls": res.get("kernel_calls", 0),
        "tuned_forced": res.get("tuned_forced", 0),
        "compile_s": round(float(res.get("compile_s", 0.0)), 3),
        "setup_s": round(float(res.get("setup_s", 0.0) or 0.0), 3),
        "import_s": round(float(res.get("import_s", 0.0) or 0.0), 3),
        "wall_s": round(float(res["wall_s"]), 3),
        "cases": cases,
        "outputs": {c.get("case", ""): c.get("outputs") for c in calls if c.get("outputs") is not None},
        "cache": cache_mode,
        "sandbox": res.get("sandbox") or "not reported (the worker ended before its result)",
    }
    if status == "pass":
        summary = f"compiled {metrics['variants_compiled']} kernel variant(s) for sm_90a (cases: {', '.join(cases)})"
    else:
        first = next(f for f in findings if f.kind in FAIL_KINDS | ERROR_KINDS)
        summary = f"{first.kind}: {first.message.splitlines()[0][:160]}"
    return StageResult(
        stage="compile",
        status=status,
        summary=summary,
        findings=findings,
        metrics=metrics,
        duration_s=float(res["wall_s"]),
    )


def _check_outputs(
    call: dict[str, Any], expected: list[tuple[str, tuple[int, ...], str]], line: int | None
) -> list[Finding]:
    out: list[Finding] = []
    case = call.get("case") or None
    desc = call.get("outputs") or {"container": "single", "items": []}
    items = desc["items"]
    names = [e[0] for e in expected]
    if desc["container"] == "dict":
        out.append(
            Finding(
                kind="output-type",
                line=line,
                case=case,
                message=f"the entry returned a dict; return the outputs as a tuple ({', '.join(names)}) in the spec's order",
            )
        )
        return out
    if len(items) != len(expected):
        got = "one value" if desc["container"] == "single" else f"{len(items)} values"
        out.append(
            Finding(
                kind="output-count",
                line=line,
                case=case,
                message=f"the entry returned {got}; the spec has {len(expected)} output(s): ({', '.join(names)})",
            )
        )
        return out
    for (name, shape, dtype), item in zip(expected, items, strict=False):
        if not item.get("is_tensor"):
            out.append(
                Finding(
                    kind="output-type",
                    line=line,
                    case=case,
                    output=name,
                    message=f"output `{name}` is a {item['type']}, not a torch.Tensor",
                )
            )
            continue
        if not item.get("exact_tensor"):
            out.append(
                Finding(
                    kind="output-type",
                    line=line,
                    case=case,
                    output=name,
                    message=f"output `{name}` is a {item['type']} (a tensor subclass); return a plain torch.Tensor",
                )
            )
        if tuple(item["shape"]) != tuple(shape):
            out.append(
                Finding(
                    kind="output-shape",
                    line=line,
                    case=case,
                    output=name,
                    message=f"output `{name}` has shape {tuple(item['shape'])} for case `{case}`; the spec says {tuple(shape)}",
                )
            )
        if item["dtype"] != dtype:
            out.append(
                Finding(
                    kind="output-dtype",
                    line=line,
                    case=case,
                    output=name,
                    message=f"output `{name}` has dtype {item['dtype']}; the spec says {dtype} (outputs must keep the spec's precision)",
                )
            )
    return out


# --------------------------------------------------------------------------- API


def compile_cpu(
    candidate: Path,
    entry: str,
    args: list[ArgSpec],
    timeout_s: float = 300,
    *,
    cache_dir: Path | None = None,
) -> StageResult:
    """Compile a candidate's kernels for sm_90a on the CPU by calling its entry once.

    Args:
        candidate: path of the candidate module (untrusted; run in a subprocess).
        entry: name of the entry function.
        args: the entry's arguments in order as ``(name, shape, dtype)``; each becomes a CPU
            ``torch.empty(shape, dtype=torch.<dtype>)``.
        timeout_s: wall-clock limit for the worker (import + compile); the process group is
            killed when it runs out.
        cache_dir: share quack's compile cache in this folder instead of a private,
            disabled one (see the module docstring).

    Returns:
        ``StageResult(stage="compile")``: ``pass`` when the call returned after building at
        least one kernel; ``fail`` with findings (``compile-error``, ``import-error``,
        ``timeout``, ``worker-crash``, ``no-kernel``, ...) otherwise; ``error`` when the
        environment cannot compile at all. Outputs are described in ``metrics["outputs"]``
        but not checked (see :func:`compile_stage`). ``metrics`` also holds
        ``variants_compiled``, ``kernel_calls``, ``compile_s``, ``import_s``, ``wall_s``.

    Raises:
        Nothing for candidate problems; ``OSError`` if the worker cannot be started.
    """
    candidate = Path(candidate).resolve()
    calls = [{"case": "call", "args": [[n, list(s), d] for n, s, d in args]}]
    return _run_and_interpret(candidate, entry, calls, timeout_s, cache_dir, expected=None)


def select_cases(spec: KernelSpec) -> list[ShapeCase]:
    """The correctness cases the compile stage uses: the first, plus the first ragged one
    (some dim not a multiple of 128) when the first is aligned."""
    cases = spec.shapes.correctness
    chosen = [cases[0]]
    if not any(v % 128 for v in cases[0].dims.values()):
        ragged = next((c for c in cases[1:] if any(v % 128 for v in c.dims.values())), None)
        if ragged is not None:
            chosen.append(ragged)
    return chosen


def compile_stage(
    loaded: LoadedSpec,
    candidate: Path,
    timeout_s: float = 300,
    *,
    cache_dir: Path | None = None,
    sha256: str | None = None,
) -> StageResult:
    """The pipeline's compile stage: compile on the spec's first and a ragged shape case and
    check that the returned outputs have the spec's count, types, shapes and dtypes.

    Args:
        loaded: the loaded spec.
        candidate: path of the candidate module.
        timeout_s: wall-clock limit for the worker (both cases together).
        cache_dir: see :func:`compile_cpu`.
        sha256: the hex digest of the snapshot the pipeline judged (:mod:`snapshot`): the
            worker imports the file only when its bytes have it (``None``: no check).

    Returns:
        ``StageResult(stage="compile")``; output mismatches are ``output-count``,
        ``output-type``, ``output-shape``, ``output-dtype`` findings naming the output and
        case. ``metrics["cases"]`` lists the case names run.

    Raises:
        Nothing for candidate problems; ``OSError`` if the worker cannot be started.
    """
    spec = loaded.spec
    calls, expected = [], {}
    for i, case in enumerate(select_cases(spec)):
        dims = spec.dims_of(case)
        name = case.name or f"case{i}"
        calls.append(
            {
                "case": name,
                "args": [[t.name, list(spec.shape_of(t, dims)), t.dtype] for t in spec.entry.inputs],
                "kwargs": spec.constants_of(dims),
            }
        )
        expected[name] = [(o.name, spec.shape_of(o, dims), o.dtype) for o in spec.entry.outputs]
    return _run_and_interpret(
        Path(candidate).resolve(), spec.entry.function, calls, timeout_s, cache_dir, expected, sha256
    )


def _run_and_interpret(
    candidate: Path,
    entry: str,
    calls: list[dict[str, Any]],
    timeout_s: float,
    cache_dir: Path | None,
    expected: dict | None,
    sha256: str | None = None,
) -> StageResult:
    if not candidate.is_file():
        return StageResult(
            stage="compile",
            status="error",
            summary=f"no candidate file at {candidate}",
            findings=[Finding(kind="verifier-error", message=f"no candidate file at {candidate}")],
        )
    res = _run_worker(candidate, entry, calls, timeout_s, cache_dir, sha256)
    mode = "private" if cache_dir is None else f"shared:{cache_dir}"
    return _interpret(res, candidate, entry, timeout_s, expected, mode)

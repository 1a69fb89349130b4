"""The compile-stage worker: imports an UNTRUSTED candidate and compiles its kernels for sm_90a.

Run only by :mod:`coda_agent.verifier.compile.stage`, as
``python -m coda_agent.verifier.compile.worker --request REQ.json --result RES.json``
in its own session/process group, with a timeout, in a private temporary folder.

Design
------
* **Compile without launching, without a GPU.** The recipe: ``QUACK_ARCH=sm_90`` and ``CUTE_DSL_ARCH=sm_90a``
  before quack is imported (the parent sets them; ``setdefault`` here for manual runs),
  ``quack.gemm_runtime.host.get_max_active_clusters`` answered without the driver
  (``132 // cluster_size``, the H100/H200 SM count), and ``run_gemm_epi_plan`` replaced by
  a counter so nothing launches. The candidate's entry is then called with CPU
  ``torch.empty`` tensors of the requested shapes/dtypes: quack traces the epilogue,
  builds MLIR, runs ptxas in-process and returns a plan per kernel variant; outputs come
  back as ordinary (unwritten) tensors whose types/shapes/dtypes the parent checks.
* **No autotuning.** A mod called with ``tuned=True`` (quack's default) and no ``config=``
  would benchmark configs on a GPU. ``EpiMod.__call__`` is wrapped to pass ``tuned=False``
  in that case (the per-arch default config is compiled instead) and a note is recorded;
  the explicit autotune entry (``tuned_mod_gemm``) raises a clear error.
* **What is counted.** ``variants_compiled`` counts plans built
  (``build_gemm_epi_plan`` calls: one per kernel variant the candidate needs; quack's
  plan cache makes repeated calls with the same metadata free) and ``kernel_calls`` the
  suppressed launches (what the GPU would have run).
* **Results travel in a file, never stdout**: the candidate may print anything. The
  result JSON is written to a temp name and renamed, so the parent sees all or nothing.
* **Errors are trimmed to the candidate's own code.** ANSI colors are stripped, frames
  outside the candidate file are dropped, CuTe DSL ``DSLUserCodeError`` messages are kept
  as the DSL wrote them (they already name the file, line and snippet), and the
  candidate's absolute path is shortened to its file name so messages are reproducible.
* **Hangs and crashes still say where.** ``faulthandler`` writes the Python stack to
  ``faulthandler.txt`` on a fatal signal and shortly before the parent's deadline; the
  parent extracts the candidate's line from it.

The helpers at the top are stdlib-only and importable without torch (the parent and the
tests use them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""ANSI escape sequences (colors, cursor moves) as emitted by the CuTe DSL."""

MAX_MESSAGE_LINES = 40
MAX_LINE_CHARS = 400

CUDA_HINT = (
    "hint: the compile stage runs on CPU tensors; allocate on the inputs' device "
    "(torch.empty(..., device=x.device)) instead of hard-coding 'cuda'"
)

_FAULT_FILE_HANDLE = None  # set by main(); the hang dump is armed when the candidate runs
STARTED_FILE = "candidate-started"
"""Touched just before the candidate module runs (an exit after it is the candidate's)."""
FAULT_FILE = "faulthandler.txt"


def strip_ansi(text: str) -> str:
    """Remove ANSI escape codes (the DSL colors its diagnostics)."""
    return ANSI_RE.sub("", text)


def clip_lines(text: str, max_lines: int = MAX_MESSAGE_LINES, max_chars: int = MAX_LINE_CHARS) -> str:
    """Trim ``text`` to ``max_lines`` lines of at most ``max_chars`` characters each."""
    lines = [ln if len(ln) <= max_chars else ln[: max_chars - 3] + "..." for ln in text.strip("\n").splitlines()]
    if len(lines) > max_lines:
        dropped = len(lines) - max_lines
        lines = lines[:max_lines] + [f"... ({dropped} more line(s))"]
    return "\n".join(lines)


def _same_file(a: str | None, b: str) -> bool:
    if not a:
        return False
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def candidate_frames(tb_frames: list[traceback.FrameSummary], candidate: str) -> list[dict[str, Any]]:
    """The traceback frames that lie in the candidate file, outermost first.

    Returns dicts ``{"line": int, "function": str, "code": str}``.
    """
    return [
        {"line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
        for f in tb_frames
        if _same_file(f.filename, candidate)
    ]


def lines_from_stack_dump(text: str, candidate: str) -> list[int]:
    """Candidate line numbers in a ``faulthandler``/traceback text dump, innermost first.

    ``faulthandler`` prints the most recent call first (``File "x.py", line 12 in f``);
    Python tracebacks print it last. Both are handled by keeping the order of the dump
    for faulthandler and the caller choosing the first element.
    """
    out: list[int] = []
    name = os.path.basename(candidate)
    for m in re.finditer(r'File "([^"]+)", line (\d+)', text):
        if _same_file(m.group(1), candidate) or os.path.basename(m.group(1)) == name:
            out.append(int(m.group(2)))
    return out


def summarize_exception(exc: BaseException, candidate: str) -> dict[str, Any]:
    """Describe an exception raised by candidate code, trimmed to the candidate's frames.

    Returns ``{"type", "message", "line", "frames", "dsl"}``: ``message`` is ANSI-free and
    clipped; for CuTe DSL errors it is the DSL's own diagnostic; ``line`` is the best
    candidate line (the DSL's reported line when it points into the candidate, else the
    innermost candidate frame, else a ``SyntaxError``'s line).
    """
    frames = candidate_frames(traceback.extract_tb(exc.__traceback__), candidate)
    is_dsl = any(c.__name__ == "DSLBaseError" for c in type(exc).__mro__)
    if is_dsl:
        text = strip_ansi(str(exc)).strip()
        if not text:
            text = strip_ansi(str(getattr(exc, "message", "") or type(exc).__name__))
        message = f"{type(exc).__name__}: {text.removeprefix('error:').strip()}"
    else:
        text = strip_ansi(str(exc)).strip()
        message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if cause is not None:
            ctext = strip_ansi(str(cause)).strip().splitlines()
            if ctext and ctext[-1] not in message:
                message += f"\n(caused by {type(cause).__name__}: {ctext[-1]})"
    line = None
    dsl_line = getattr(exc, "line", None)
    if is_dsl and isinstance(dsl_line, int) and _same_file(getattr(exc, "filename", None), candidate):
        line = dsl_line
    elif isinstance(exc, SyntaxError) and _same_file(exc.filename, candidate):
        line = exc.lineno
    elif frames:
        line = frames[-1]["line"]
    if any(
        s in message
        for s in ("Torch not compiled with CUDA", "Found no NVIDIA driver", "No CUDA GPUs are available", "CUDA driver")
    ):
        message += "\n" + CUDA_HINT
    message = message.replace(os.path.realpath(candidate), os.path.basename(candidate))
    message = message.replace(candidate, os.path.basename(candidate))
    return {
        "type": type(exc).__name__,
        "message": clip_lines(message),
        "line": line,
        "frames": frames,
        "dsl": is_dsl,
    }


# --------------------------------------------------------------------------- worker


class _Counters:
    def __init__(self) -> None:
        self.variants = 0
        self.kernel_calls = 0
        self.tuned_forced = 0
        self.compile_s = 0.0
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _install_patches(counters: _Counters) -> None:
    """Make quack compile for sm_90a on the CPU and never launch (see module docstring)."""
    os.environ.setdefault("QUACK_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import quack.gemm_runtime.host as host

    host.get_max_active_clusters = lambda cluster_size: 132 // cluster_size

    import quack.epilogue.frontend as fe

    def suppressed_launch(*args: Any, **kwargs: Any) -> None:
        counters.kernel_calls += 1

    real_build = fe.build_gemm_epi_plan

    def counted_build(*args: Any, **kwargs: Any):
        t = time.perf_counter()
        try:
            plan = real_build(*args, **kwargs)
        finally:
            counters.compile_s += time.perf_counter() - t
        counters.variants += 1
        return plan

    fe.run_gemm_epi_plan = suppressed_launch
    host.run_gemm_epi_plan = suppressed_launch
    fe.build_gemm_epi_plan = counted_build

    real_call = fe.EpiMod.__call__

    def untuned_call(self, *args: Any, **kwargs: Any):
        if kwargs.get("config") is None and kwargs.get("tuned", True):
            kwargs["tuned"] = False
            counters.tuned_forced += 1
            counters.note(
                "a mod was called with tuned=True (quack's default) and no config=: autotuning "
                "needs a GPU, so the compile stage compiled the default config instead; pass "
                "tuned=False (or an explicit config=) to say what you mean"
            )
        return real_call(self, *args, **kwargs)

    fe.EpiMod.__call__ = untuned_call

    import quack.gemm_runtime.autotune as autotune

    def no_autotune(*args: Any, **kwargs: Any):
        raise RuntimeError(
            "autotuning (gemm_tuned / tuned_mod_gemm) cannot run in the compile stage: it "
            "benchmarks on a GPU; call the mod with tuned=False or an explicit config="
        )

    autotune.tuned_mod_gemm = no_autotune


def _describe_outputs(result: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    import torch

    if isinstance(result, tuple):
        container, items = "tuple", list(result)
    elif isinstance(result, list):
        container, items = "list", list(result)
    elif isinstance(result, dict):
        container, items = "dict", list(result.values())
    else:
        container, items = "single", [result]
    storages = {}
    for name, t in inputs.items():
        try:
            storages[t.untyped_storage().data_ptr()] = name
        except Exception:  # pragma: no cover - CPU tensors always have storage
            pass
    described = []
    for x in items:
        d: dict[str, Any] = {"type": f"{type(x).__module__}.{type(x).__qualname__}"}
        if isinstance(x, torch.Tensor):
            d.update(
                is_tensor=True,
                exact_tensor=type(x) is torch.Tensor,
                shape=list(x.shape),
                dtype=str(x.dtype).removeprefix("torch."),
                stride=list(x.stride()),
            )
            try:
                d["aliases_input"] = storages.get(x.untyped_storage().data_ptr())
            except Exception:  # pragma: no cover
                d["aliases_input"] = None
        else:
            d["is_tensor"] = False
        described.append(d)
    return {"container": container, "items": described}


def run_request(req: dict[str, Any]) -> dict[str, Any]:
    """Import the candidate and run each requested call; return the JSON-able result.

    ``req``: ``{"candidate": path, "entry": name, "calls": [{"case": str,
    "args": [[name, [dims...], dtype], ...]}]}``.
    """
    candidate = str(req["candidate"])
    out: dict[str, Any] = {"ok": False, "phase": "setup", "calls": [], "error": None}
    counters = _Counters()
    t0 = time.perf_counter()
    try:
        import torch

        _install_patches(counters)
    except Exception as e:  # the environment, not the candidate
        out["error"] = {
            "type": type(e).__name__,
            "message": clip_lines(strip_ansi(traceback.format_exc())),
            "line": None,
            "frames": [],
            "dsl": False,
        }
        return out
    out["setup_s"] = time.perf_counter() - t0

    out["phase"] = "import"
    t1 = time.perf_counter()
    try:
        from ..confine.snapshot import load_module

        if req.get("started_marker"):
            Path(req["started_marker"]).touch()  # from here on, an exit is the candidate's doing
        if req.get("dump_deadline") and _FAULT_FILE_HANDLE is not None:
            import faulthandler

            remaining = req["dump_deadline"] - time.monotonic()
            if remaining > 0:
                faulthandler.dump_traceback_later(remaining, repeat=False, file=_FAULT_FILE_HANDLE)
        from ..confine import audit

        audit.install(str(Path(candidate)))  # the candidate's own frames may not exec, walk frames or reach the OS
        module = load_module(candidate, "coda_candidate", req.get("sha256"))
        audit.seal()
    except BaseException as e:  # noqa: BLE001 - untrusted code may raise anything
        out["error"] = summarize_exception(e, candidate)
        return _finish(out, counters)
    out["import_s"] = time.perf_counter() - t1

    entry = getattr(module, req["entry"], None)
    if not callable(entry):
        out["phase"] = "entry"
        out["error"] = {
            "type": "AttributeError",
            "message": f"the candidate defines no callable `{req['entry']}`",
            "line": None,
            "frames": [],
            "dsl": False,
        }
        return _finish(out, counters)

    out["phase"] = "call"
    for call in req["calls"]:
        # Float inputs are left uninitialized (only shapes/dtypes matter to compile); integer
        # inputs (class indices, positions) are zeros, a valid value for any index range, so
        # host-side indexing in the candidate does not fail on garbage before the GPU stages.
        inputs = {
            name: (torch.zeros if dtype.startswith("int") else torch.empty)(tuple(shape), dtype=getattr(torch, dtype))
            for name, shape, dtype in call["args"]
        }
        tc = time.perf_counter()
        rec: dict[str, Any] = {"case": call.get("case", ""), "variants_before": counters.variants}
        try:
            result = entry(*inputs.values(), **call.get("kwargs", {}))
        except BaseException as e:  # noqa: BLE001
            rec["seconds"] = time.perf_counter() - tc
            out["calls"].append(rec)
            out["error"] = summarize_exception(e, candidate)
            out["error"]["case"] = rec["case"]
            return _finish(out, counters)
        rec["seconds"] = time.perf_counter() - tc
        rec["outputs"] = _describe_outputs(result, inputs)
        rec["variants_after"] = counters.variants
        out["calls"].append(rec)
    out["ok"] = True
    out["phase"] = "done"
    return _finish(out, counters)


def _finish(out: dict[str, Any], counters: _Counters) -> dict[str, Any]:
    out["variants_compiled"] = counters.variants
    out["kernel_calls"] = counters.kernel_calls
    out["tuned_forced"] = counters.tuned_forced
    out["compile_s"] = round(counters.compile_s, 3)
    out["notes"] = counters.notes
    return out


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, default=str))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """CLI entry: read the request, run it, write the result file. Returns the exit code."""
    assert __doc__ is not None  # the module's docstring
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--request", required=True, type=Path)
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--dump-after", type=float, default=0.0, help="dump the Python stack after this many seconds")
    ns = ap.parse_args(argv)
    import faulthandler
    import resource

    # No core dumps; no runaway file writes (stray dumps in its folder) beyond 1 GiB; its
    # stdout/stderr are pipes the parent caps (sandbox.LOG_HEAD).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    cap = 1 << 30 if hard == resource.RLIM_INFINITY else min(1 << 30, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, hard))

    global _FAULT_FILE_HANDLE
    fault = open(ns.result.parent / FAULT_FILE, "w")  # noqa: SIM115 - must outlive main()
    _FAULT_FILE_HANDLE = fault
    faulthandler.enable(file=fault)
    req = json.loads(ns.request.read_text())
    req["started_marker"] = str(ns.result.parent / STARTED_FILE)
    # The stack dump (which names the candidate line of a hang) is armed only when the
    # candidate's code starts to run: dumping while torch/quack are still importing
    # crashed the worker with SIGSEGV about 1 run in 5 (seen in CI-like runs).
    req["dump_deadline"] = time.monotonic() + ns.dump_after if ns.dump_after > 0 else None
    # Bound the address space: a candidate allocating tens of GB at import must fail here,
    # not push the CI machine into swap (measured: the CPU compile works under 4 GiB).
    cap_as = int(os.environ.get("CODA_COMPILE_MEMORY_LIMIT", 8 << 30))
    _, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    if cap_as > 0 and (hard_as == resource.RLIM_INFINITY or cap_as <= hard_as):
        resource.setrlimit(resource.RLIMIT_AS, (cap_as, hard_as))
    # Candidate code runs in here (tracing imports and calls it): from now on this process
    # may write only beneath its temporary folder (TMPDIR, private caches) and the shared
    # compile cache when one was asked for (verifier/confine/landlock.py).
    from ..confine.landlock import confine_worker

    shared = [os.environ[k] for k in ("QUACK_CACHE_DIR", "CUTE_DSL_CACHE_DIR") if os.environ.get(k)]
    sandbox = confine_worker([ns.result.parent, *shared])
    result = run_request(req)
    result["sandbox"] = sandbox
    faulthandler.cancel_dump_traceback_later()
    _write_json_atomic(ns.result, result)
    sys.stdout.flush()
    # Skip interpreter teardown: candidate/DSL atexit hooks cannot change the result now.
    os._exit(0)


if __name__ == "__main__":
    main()

"""The trusted-side GPU worker: reference outputs, autograd gradients and baseline timings.

Run as ``python -m coda_agent.verifier.gpu.worker_reference --dir WORKDIR/ref`` by the
pipeline *after* the candidate worker, in a separate process that never imports the
candidate (so nothing the candidate does can reach the references: threats 1, 5, 12).

For every trial of the plan (the same keys, dims and seeds as the candidate worker's,
including the post-timing recheck) it regenerates the inputs with
:func:`~coda_agent.verifier.gpu.inputs.make_inputs` (bit-identical to the candidate's) and
saves ``<key>.pt = {"inputs", "ref32", "ref_lowp"}`` (CPU tensors):

* ``ref32[o]``  -- ``reference.reference`` on fp32-upcast inputs (TF32 off), kept fp32;
* ``ref_lowp[o]`` -- the same function on the low-precision inputs, as it returns them;
* gradient outputs -- ``torch.autograd.grad(reference.<of>(inputs minus upstream),
  inputs[wrt], grad_outputs=inputs[upstream])``, in fp32 and in low precision;
* ``fp8_band[o]`` (fp8 outputs only) -- ``ref32``'s own rounding per block of the output's
  scale: the largest ``|ref32 - ref64|`` over the block, ``ref64`` being the reference on
  float64-upcast inputs (:func:`fp8_bands`; the fp8 rule's boundary band).

``inputs`` holds the entry's inputs only (the reference-only ones never reach the
candidate, so there is nothing to compare them with).

Bench: at each shape, times the spec's baselines (``torch_eager`` = ``reference.baseline``,
``torch_compile`` = one ``torch.compile(reference.baseline, dynamic=False)`` reused across
shapes and warmed up before timing, ``bare_gemm``/``quack_library``/others = the
reference function of that name) with the same method as the candidate: rotated input
sets, ``triton.testing.do_bench(return_mode="median")``. A baseline that fails is
recorded with its error and the others still run.

``quack_gemm`` (added by ``coda-agent bench`` wherever ``bare_gemm`` is timed) is quack's
identity-epilogue GEMM on the operands ``bare_gemm`` hands to ``aten.mm``, captured per
input set before timing (:mod:`~coda_agent.verifier.gpu.gemm_floor`): the floor for an
epilogue on quack's mainloop.

``liger`` (Liger Kernel, an optional dependency) is ``reference.liger`` when the
reference defines it, else ``liger`` of the spec's optional ``liger.py`` (imported by
path, like reference.py; not part of the spec hash). It is an error string, not a
callable, when neither exists (:data:`NO_LIGER`) or when ``liger_kernel`` does not
import (:data:`LIGER_MISSING`). Baselines are timed under ``torch.no_grad()``: an
adapter that needs autograd enters ``torch.enable_grad()`` itself.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from ..confine.records import append_record
from ..spec import LIGER_MISSING, NO_LIGER, GradientSpec, load_spec
from . import gemm_floor, samples
from .inputs import entry_inputs, make_inputs, rotation_count, tensor_bytes, upcast
from .protocol import BENCH_SEED_BASE, PLAN_FILE, RESULTS_FILE, Plan, Run


def _exact_fp32() -> None:
    """No TF32 anywhere: ref32 must be a true fp32 computation."""
    torch.set_float32_matmul_precision("highest")
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    except Exception:  # noqa: BLE001 -- newer torch may deprecate the flags
        pass


def autograd_gradient(
    ref: Any, g: GradientSpec, inputs: dict[str, torch.Tensor], consts: dict[str, int]
) -> torch.Tensor:
    """d ref.<g.of>(inputs \\ upstream) / d inputs[g.wrt], contracted with inputs[g.upstream]."""
    args = {k: v.detach() for k, v in inputs.items() if k != g.upstream}
    wrt = args[g.wrt].clone().requires_grad_(True)
    args[g.wrt] = wrt
    with torch.enable_grad():
        y = getattr(ref, g.of)(**args, **consts)
        upstream = inputs[g.upstream].to(y.dtype)
        (grad,) = torch.autograd.grad(y, wrt, grad_outputs=upstream)
    return grad.detach()


def reference_outputs(
    spec: Any, ref: Any, inputs: dict[str, torch.Tensor], dims: dict[str, int]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(ref32, ref_lowp)`` for every output of ``spec`` (CPU tensors): ``ref.reference`` (and
    the autograd of each gradient output's forward) on the fp32-upcast ``inputs`` (kept
    fp32) and on the low-precision ``inputs`` as they are. Call with TF32 off."""
    in32 = upcast(inputs)
    consts = spec.constants_of(dims)
    ref32: dict[str, torch.Tensor] = {}
    lowp: dict[str, torch.Tensor] = {}
    if spec.value_outputs:
        with torch.no_grad():
            r32 = ref.reference(**in32, **consts)
            rlp = ref.reference(**inputs, **consts)
        for o in spec.value_outputs:
            ref32[o.name] = r32[o.name].detach().float().cpu()
            lowp[o.name] = rlp[o.name].detach().cpu()
    for o in spec.gradient_outputs:
        assert o.gradient is not None
        ref32[o.name] = autograd_gradient(ref, o.gradient, in32, consts).float().cpu()
        lowp[o.name] = autograd_gradient(ref, o.gradient, inputs, consts).cpu()
    return ref32, lowp


def fp8_bands(
    spec: Any, ref: Any, inputs: dict[str, torch.Tensor], dims: dict[str, int], ref32: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Per fp8 output of ``spec`` (none: ``{}``), the fp32 reference's own rounding per block
    of its scale (CPU fp64, the scale's shape): ``max |ref32 - ref64|`` over each block's
    finite elements, where ``ref64`` is ``ref.reference`` on float64-upcast ``inputs``
    (the true value to ~1e-16, so the difference is ref32's accumulation error on these
    very inputs). ``ref32`` from :func:`reference_outputs`."""
    if not spec.fp8_outputs:
        return {}
    in64 = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.no_grad():
        r64 = ref.reference(**in64, **spec.constants_of(dims))
    bands = {}
    for o in spec.fp8_outputs:
        diff = (ref32[o.name].double() - r64[o.name].detach().double().cpu()).abs()
        diff = torch.nan_to_num(diff, nan=0.0, posinf=0.0)
        scale_shape = spec.shape_of(next(s for s in spec.entry.outputs if s.name == o.scale), dims)
        bands[o.name] = samples.block_max(diff, scale_shape)
    return bands


class RefWorker:
    """State of one reference-worker run."""

    def __init__(self, folder: Path):
        self.t0 = time.perf_counter()  # records carry seconds since the worker started ("t")
        self.dir = folder
        self.plan = Plan.from_json((folder / PLAN_FILE).read_text())
        self.results = folder / RESULTS_FILE
        self.device = torch.device(self.plan.device)
        self.cuda = self.device.type == "cuda"
        self.loaded = load_spec(self.plan.spec_dir)
        self.spec = self.loaded.spec
        self.ref = self.loaded.load_reference()

    def record(self, part: str, **fields: Any) -> None:
        append_record(self.results, {"part": part, "t": round(time.perf_counter() - self.t0, 4), **fields})

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    # -- references ---------------------------------------------------------------------
    def references(self, run: Run) -> dict[str, Any]:
        inputs = make_inputs(self.loaded, run.dims, run.seed, self.device, self.ref, run.draw)
        ref32, lowp = reference_outputs(self.spec, self.ref, inputs, run.dims)
        bands = fp8_bands(self.spec, self.ref, inputs, run.dims, ref32)
        saved_inputs = {k: v.cpu() for k, v in entry_inputs(self.spec, inputs).items()}
        if run.sample:  # a bench-shape check: the same sampled positions as the candidate worker
            picked = samples.output_samples(self.spec, run.dims, run.sample, run.seed)
            pos = {o.name: i for i, o in enumerate(self.spec.entry.outputs)}
            for d in (ref32, lowp):
                for name in list(d):
                    d[name] = d[name].reshape(-1)[picked[pos[name]]]
            for o in self.spec.fp8_outputs:  # the band of each sampled element's block
                assert o.scale is not None  # OutputSpec: an fp8 output names its scale
                bands[o.name] = bands[o.name].reshape(-1)[picked[pos[o.scale]]]
            saved_inputs = {}
        fname = f"{run.key}.pt"
        saved = {"inputs": saved_inputs, "ref32": ref32, "ref_lowp": lowp}
        if bands:
            saved["fp8_band"] = bands
        torch.save(saved, self.dir / fname)
        return dict(key=run.key, file=fname, recheck=run.recheck)

    # -- baselines ------------------------------------------------------------------------
    def baseline_fns(self) -> dict[str, Callable[..., Any] | gemm_floor.Floor | str]:
        """name -> callable(**inputs), or an error string when the baseline is unavailable."""
        names = self.plan.baselines if self.plan.baselines is not None else list(self.spec.bench.baselines)
        fns: dict[str, Callable[..., Any] | gemm_floor.Floor | str] = {}
        for b in names:
            if b == "torch_eager":
                fns[b] = self.ref.baseline
            elif b == "torch_compile":
                try:
                    import torch._dynamo

                    for attr in ("recompile_limit", "cache_size_limit"):
                        if hasattr(torch._dynamo.config, attr):
                            setattr(torch._dynamo.config, attr, max(64, getattr(torch._dynamo.config, attr)))
                    fns[b] = torch.compile(self.ref.baseline, dynamic=False)
                except Exception as e:  # noqa: BLE001
                    fns[b] = f"torch.compile unavailable: {type(e).__name__}: {e}"
            elif b == "liger":
                fns[b] = self.liger_fn()
            elif b == gemm_floor.NAME:
                fns[b] = self.quack_gemm_fn()
            else:
                f = getattr(self.ref, b, None)
                fns[b] = f if callable(f) else f"reference.py defines no function {b!r}"
        return fns

    def liger_fn(self) -> Callable[..., Any] | str:
        """The Liger baseline: reference.liger, else liger.py's ``liger``; or why there is none."""
        f = getattr(self.ref, "liger", None)
        if not callable(f):
            try:
                mod = self.loaded.load_liger()
            except Exception as e:  # noqa: BLE001 -- a broken adapter is that baseline's error
                return f"liger.py does not import: {type(e).__name__}: {str(e)[:400]}"
            if mod is None:
                return NO_LIGER
            f = getattr(mod, "liger", None)
            if not callable(f):
                return "liger.py defines no function 'liger'"
        try:
            import liger_kernel  # noqa: F401  # pyright: ignore[reportMissingImports]  (optional extra `bench`)
        except ImportError as e:
            if getattr(e, "name", None) in (None, "liger_kernel"):
                return LIGER_MISSING
            return f"liger-kernel does not import: {type(e).__name__}: {str(e)[:400]}"
        except Exception as e:  # noqa: BLE001 -- e.g. a triton/torch mismatch inside it
            return f"liger-kernel does not import: {type(e).__name__}: {str(e)[:400]}"
        return f

    def quack_gemm_fn(self) -> gemm_floor.Floor | str:
        """The quack_gemm floor (:mod:`~coda_agent.verifier.gpu.gemm_floor`), or why there is none."""
        if not self.cuda:
            return "quack_gemm needs a CUDA GPU (quack's GEMM)"
        f = getattr(self.ref, "bare_gemm", None)
        return gemm_floor.Floor(f) if callable(f) else "reference.py defines no function 'bare_gemm'"

    def time_ms(self, call: Callable[[], Any]) -> float:
        if self.cuda:
            import triton.testing

            return float(triton.testing.do_bench(call, return_mode="median"))  # pyright: ignore[reportArgumentType]  (a float for "median"; triton's annotation lacks it)
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    def bench_shape(self, name: str, dims: dict[str, int], fns: dict[str, Any]) -> dict[str, Any]:
        n = rotation_count(tensor_bytes(self.spec, dims, "inputs"))
        consts = self.spec.constants_of(dims)
        sets = [
            {**make_inputs(self.loaded, dims, BENCH_SEED_BASE + self.plan.secret + k, self.device, self.ref), **consts}
            for k in range(n)
        ]
        self.sync()
        out: dict[str, dict[str, Any]] = {}
        for b, f in fns.items():
            if isinstance(f, str):
                out[b] = {"error": f}
                continue
            counter = [0]
            per_set: list[Callable[[], Any]] = []  # one no-argument call per input set

            def call(counter=counter, per_set=per_set):
                i = counter[0] % n
                counter[0] += 1
                return per_set[i]()

            try:
                t0 = time.perf_counter()
                with torch.no_grad():
                    # quack_gemm: bare_gemm's operands captured per set, before timing
                    per_set += (
                        f.prepare(sets)
                        if isinstance(f, gemm_floor.Floor)
                        else [functools.partial(f, **s) for s in sets]
                    )
                    call()
                    call()
                    self.sync()
                    warm_s = time.perf_counter() - t0
                    ms = self.time_ms(call)
                out[b] = {"ms": ms, "warmup_s": warm_s}
            except Exception as e:  # noqa: BLE001 -- a broken baseline is reported, not fatal
                out[b] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
            finally:
                per_set.clear()  # quack_gemm's captured operands (e.g. M x V logits per set) go with it
        del sets
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
        return dict(shape=name, dims=dims, baselines=out, n_sets=n)

    def main(self) -> int:
        from .environment import collect_environment

        _exact_fp32()
        budget = self.plan.memory_budget
        if self.cuda:  # the verification's budget holds for the trusted worker too
            from . import memory_budget

            budget = memory_budget.apply(self.device, budget)
        self.record(
            "setup",
            ok=True,
            memory_budget=budget,
            device=str(self.device),
            plan_sha256=self.plan.sha256(),
            env=collect_environment(probe_gpu=self.cuda).model_dump(),
        )
        for run in self.plan.runs:
            self.record("begin", what=f"reference {run.key}")
            self.record("trial", **self.references(run))
        if self.plan.bench and self.plan.bench_shapes:
            fns = self.baseline_fns()
            for bs in self.plan.bench_shapes:
                self.record("begin", what=f"baselines {bs.name}")
                self.record("bench", **self.bench_shape(bs.name, bs.dims, fns))
        self.record("done")
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="coda-agent reference worker (trusted side)")
    ap.add_argument("--dir", required=True, type=Path, help="worker folder holding plan.json")
    a = ap.parse_args(argv)
    try:
        return RefWorker(a.dir).main()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Shared helpers of the coda_agent.kernels op tests (imported by test_*_ops.py).

* ``reference_module(name)``: a spec's reference.py, imported straight from its file (the
  specs' ``baseline`` / ``reference`` functions are the CPU stand-ins for the kernels);
* ``use_standins(monkeypatch, entries)``: make ``coda_agent.kernels.load`` return the
  stand-ins and switch ``_check_device`` (the stand-ins run on the CPU) and, unless asked,
  ``_check_layout`` off;
* ``check_against_torch``: an op's outputs and gradients (random upstream gradients for
  every output) against autograd through a plain torch implementation in float64;
* ``check_on_gpu``: the real kernels in bf16 against an fp32 torch reference, with the
  error budget set by the same computation in bf16 PyTorch (the CODA criterion).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from pathlib import Path

import torch

import coda_agent.kernels as K

ROOT = Path(__file__).resolve().parents[2]


def module_from_file(path: Path, name: str):
    """Import the file ``path`` as a fresh module ``name``, registered in ``sys.modules``
    (dataclasses and torch.compile look a module up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def reference_module(name: str):
    """Import kernel_specs/<name>/reference.py as a fresh module."""
    return module_from_file(ROOT / "kernel_specs" / name / "reference.py", f"coda_test_reference_{name}")


def entry(fn, inputs: list[str], outputs: list[str]):
    """Adapt a spec function ``fn(**inputs) -> dict`` to the kernel entry convention
    ``entry(*inputs in order) -> tuple(outputs in order)``, with the inputs' names as its
    signature (as an accepted kernel's entry has: run_kernel's messages name them)."""

    def call(*args):
        res = fn(**dict(zip(inputs, args, strict=False)))
        return tuple(res[o] for o in outputs)

    call.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in inputs]
    )
    return call


def use_standins(monkeypatch, entries: dict, *, check_layout: bool = False) -> dict:
    """``K.load(name)`` -> a namespace with ``name = entries[name]``; ``_check_device`` off,
    and ``_check_layout`` (bf16 / fp32 / int64 dtypes, contiguity, 16-byte rows) off unless
    ``check_layout`` (the float64 gradchecks need it off). Returns a dict counting the calls
    of each stand-in."""
    calls = {name: 0 for name in entries}

    def counted(name):
        fn = entries[name]

        def call(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)

        call.__signature__ = inspect.signature(fn)  # keep keyword-only constants visible
        return call

    mods = {name: types.SimpleNamespace(**{name: counted(name)}) for name in entries}

    def load(name):
        if name not in mods:
            raise ModuleNotFoundError(f"no stand-in for {name!r}")
        return mods[name]

    monkeypatch.setattr(K, "load", load)
    monkeypatch.setattr(K, "_check_device", lambda *a, **kw: None)
    if not check_layout:
        monkeypatch.setattr(K, "_check_layout", lambda *a, **kw: None)
    return calls


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _upstream(outs, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(device=o.device, dtype=o.dtype) for o in outs]


def check_against_torch(fn, torch_fn, args, diff, *, rtol, seed=0, names=None):
    """fn(*args) vs torch_fn(*args in float64): outputs, and gradients w.r.t. args[i] for
    i in ``diff``. Tolerance: |a - r| <= rtol * (max |r| + 1) per tensor."""
    args = [a.detach().clone().requires_grad_() if i in diff else a for i, a in enumerate(args)]
    outs = _tuple(fn(*args))
    ups = _upstream(outs, seed)
    grads = torch.autograd.grad(outs, [args[i] for i in diff], ups)
    rargs = [
        a.detach().double().requires_grad_() if i in diff else (a.double() if a.is_floating_point() else a)
        for i, a in enumerate(args)
    ]
    routs = _tuple(torch_fn(*rargs))
    rgrads = torch.autograd.grad(routs, [rargs[i] for i in diff], [u.double() for u in ups])
    names = names or [f"out{i}" for i in range(len(outs))] + [f"d_arg{i}" for i in diff]
    assert len(outs) == len(routs)
    for name, a, r in zip(names, (*outs, *grads), (*routs, *rgrads), strict=False):
        assert a.shape == r.shape, f"{name}: shape {tuple(a.shape)} != {tuple(r.shape)}"
        err = (a.double() - r.double()).abs().max().item()
        tol = rtol * (r.abs().max().item() + 1.0)
        assert err <= tol, f"{name}: max err {err:.3e} > {tol:.3e}"


def check_on_gpu(fn, torch_fn, args, diff, names, *, seed=0):
    """The real kernels (bf16 inputs on the GPU) vs an fp32 torch reference from the same
    inputs; error budget 2 * (error of the same torch code in bf16) + 1e-6 per tensor
    (``diff`` empty: outputs only, the forward alone.)"""
    args = [a.detach().clone().requires_grad_() if i in diff else a for i, a in enumerate(args)]
    outs = _tuple(fn(*args))
    ups = _upstream(outs, seed)
    grads = torch.autograd.grad(outs, [args[i] for i in diff], ups) if diff else ()

    def run(cast):
        xs = [cast(a).detach().requires_grad_() if i in diff else cast(a) for i, a in enumerate(args)]
        o = _tuple(torch_fn(*xs))
        if not diff:
            return o
        g = torch.autograd.grad(o, [xs[i] for i in diff], [u.to(oo.dtype) for u, oo in zip(ups, o, strict=False)])
        return (*o, *g)

    ref = run(lambda a: a.float() if a.is_floating_point() else a)
    low = run(lambda a: a.detach().clone())
    for name, a, r, b in zip(names, (*outs, *grads), ref, low, strict=False):
        assert a.shape == r.shape, f"{name}: shape {tuple(a.shape)} != {tuple(r.shape)}"
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype}, the torch code gives {b.dtype}"
        err = (a.float() - r.float()).abs().max().item()
        budget = 2 * (b.float() - r.float()).abs().max().item() + 1e-6
        assert err <= budget, f"{name}: max err {err:.3e} > allowed {budget:.3e}"


MODES = ("eager", "torch.compile", "cudagraphs")
"""How a GPU test runs an op: as is, under ``torch.compile(fullgraph=True)``, or under
``torch.compile(fullgraph=True, mode="reduce-overhead")`` (CUDA graph trees)."""


def compiled_for(mode: str, op, args, diff):
    """``op`` prepared for ``mode`` (one of :data:`MODES`). For ``cudagraphs`` it runs the
    training step (forward, then gradients w.r.t. ``args[i]`` for i in ``diff``) twice on
    ``args`` -- Inductor's warm-up run, then the recording run -- and asserts that Inductor
    recorded graphs and skipped none, so the caller's next call is a graph replay."""
    if mode == "eager":
        return op
    if mode == "torch.compile":
        return torch.compile(op, fullgraph=True)
    assert mode == "cudagraphs", mode
    from torch._dynamo.utils import counters

    fn = torch.compile(op, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    recorded = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
    for _ in range(2):
        xs = [a.detach().clone().requires_grad_() if i in diff else a for i, a in enumerate(args)]
        outs = _tuple(fn(*xs))
        if diff:
            torch.autograd.grad(outs, [xs[i] for i in diff], [torch.ones_like(o) for o in outs])
    torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == skips, "Inductor skipped CUDA graphs for this op"
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] > recorded, "no CUDA graph was recorded"
    return fn

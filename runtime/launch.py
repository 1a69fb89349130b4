"""Direct launches of an accepted kernel's epilogue GEMMs: one ``EpiPlan`` per shape class.

An accepted kernel calls its ``@gemm_epilogue`` mods by name from host code
(``res = swiglu_epi(x, w1.T, tuned=False, config=CFG)``). :func:`bind_entry` returns the
kernel's entry function re-bound so that each of those names resolves to a
:class:`Launcher` around the mod; the kernel's bytes and its module are untouched (the
module keeps its ``EpiMod`` globals, which quack's compile-cache identity reads).

A launcher call:

1. keys the call on the metadata quack compiles for (dtype, shape, stride of every tensor;
   scalar values; the output set) -- a dict lookup, no allocation;
2. on a miss, resolves the GEMM config -- the tuning table's winner for this GPU, epilogue
   and shape bucket (:mod:`coda_agent.runtime.tuning`), else the kernel's own ``config=``,
   else quack's per-arch default -- and builds the launch with ``EpiMod.plan`` (compiling,
   or loading the ahead-of-time object from quack's disk cache: :mod:`.cache`);
3. allocates the outputs and reduce scratch the plan recorded, and calls
   ``EpiPlan.run`` ("zero host decisions": quack's cheapest launch path short of a raw
   TVM-FFI call), then finalizes the reduce sinks exactly as ``EpiMod.__call__`` does.

Rules (each one a past pitfall; tests/runtime/test_launch.py shows them):

* Anything the direct path does not model (varlen, gather, block-scaled operands,
  A-operand transforms, concat layouts, reduce-add stores, rounding or epilogue-key
  overrides, the dynamic scheduler flag, autotuning without a table entry) goes to the
  mod itself with the resolved config: never a silent approximation.
* Under ``torch.compile`` tracing the launcher defers to the mod (quack's
  ``quack::gemm_epi`` op); the project's ops are opaque custom ops whose bodies run
  eagerly, so traced calls only happen when a user calls a kernel entry in a graph.
* Reduce scratch and the dynamic-scheduler semaphore are fresh per call (stream-ordered,
  CUDA-graph-pool friendly); a cached scratch buffer could be returned to the caller by
  a sink whose finalize is the identity.
* A config the caller passes is honoured unless the table has an entry for the shape:
  the table holds only configs re-verified for this kernel's hash (``coda-agent tune``).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

_DIRECT_KWARGS = frozenset({"config", "tuned", "out", "store_d", "out_dtype"})
"""``EpiMod.__call__`` keywords the direct path models."""


def _call_keywords() -> frozenset[str]:
    import inspect

    from quack.epilogue.frontend import EpiMod

    sig = inspect.signature(EpiMod.__call__)
    return frozenset(n for n, p in sig.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)


_DELEGATED_KWARGS = _call_keywords() - _DIRECT_KWARGS
"""The other keywords of ``EpiMod.__call__`` (cu_seqlens_m, A_idx, SFA, transform_a,
add_to_output, dynamic_scheduler, ...): a call with one of them goes to the mod itself.
Every keyword in neither set is an epilogue operand (``**operands``), which the plan takes."""


def _meta(v: Any) -> Any:
    """The part of one argument a compiled launch depends on (never a data pointer)."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.shape, v.stride(), v.device)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return (type(v), id(v))


class Launcher:
    """Calls one epilogue mod of one kernel through cached ``EpiPlan`` s (module docstring).

    ``config_for(mod_name, M, N, K, device)`` returns a tuned ``GemmConfig`` or None;
    ``observe(mod_name, A, B, config)`` (optional) sees every planned call, for the tuner.
    ``compile_only``: plan (compile or load) but never launch; outputs come back
    allocated and unwritten (``coda-agent build`` on CPU tensors, no GPU needed).
    """

    __slots__ = ("mod", "name", "config_for", "observe", "compile_only", "_plans", "stats")

    def __init__(
        self,
        mod: Any,
        name: str,
        config_for: Callable[..., Any] | None = None,
        observe: Callable[..., None] | None = None,
        compile_only: bool = False,
    ):
        self.mod = mod
        self.name = name
        self.config_for = config_for
        self.observe = observe
        self.compile_only = compile_only
        self._plans: dict[tuple, tuple] = {}
        self.stats = {"planned": 0, "direct": 0, "delegated": 0}

    def __repr__(self) -> str:
        return f"Launcher({self.name}, plans={len(self._plans)})"

    def __getattr__(self, attr: str) -> Any:
        # Rationale: host code may use the mod's other entry points (``.gemm``, ``.plan``,
        # ``.outputs``); they reach the mod itself, with the config the caller passes.
        return getattr(self.mod, attr)

    # -- config -----------------------------------------------------------------------
    def resolve_config(self, A: torch.Tensor, B: torch.Tensor, config: Any) -> Any:
        """The config this call runs with: table entry > caller's ``config`` > quack default.
        ``B`` is (K, N) as the mod receives it."""
        if self.config_for is not None:
            m = A.numel() // A.shape[-1]
            tuned = self.config_for(self.name, m, B.shape[-1], A.shape[-1], A.device)
            if tuned is not None:
                return tuned
        if config is not None:
            return config
        return self.mod._default_config(A, B, None)

    # -- call -------------------------------------------------------------------------
    def __call__(self, A, B, C=None, **kw):
        if torch.compiler.is_compiling() or not _DELEGATED_KWARGS.isdisjoint(kw) or A.dim() != 2:
            return self._delegate(A, B, C, kw)
        out = kw.get("out")
        store_d = kw.get("store_d", True)
        operands = {k: v for k, v in kw.items() if k not in _DIRECT_KWARGS}
        key = (
            _meta(A),
            _meta(B),
            _meta(C),
            tuple((k, _meta(v)) for k, v in sorted(operands.items())),
            None if out is None else tuple((k, _meta(v)) for k, v in sorted(out.items())),
            store_d,
            kw.get("out_dtype"),
            id(kw.get("config")),
        )
        entry = self._plans.get(key)
        if entry is None:
            entry = self._plan(A, B, C, kw, operands)
            self._plans[key] = entry
        self.stats["direct"] += 1
        return self._run(entry, A, B, C, out, store_d, operands)

    def _delegate(self, A, B, C, kw):
        """The mod itself, with the resolved config (see _DIRECT_KWARGS)."""
        if self.compile_only:
            raise RuntimeError(
                f"{self.name}: a call the direct path does not model ({sorted(set(kw) & _DELEGATED_KWARGS)}, "
                f"{A.dim()}-D A) cannot be compiled ahead of time; it compiles on first use"
            )
        self.stats["delegated"] += 1
        kw = dict(kw)
        if A.dim() == 2 and not torch.compiler.is_compiling():
            kw["config"] = self.resolve_config(A, B, kw.get("config"))
        return self.mod(A, B, C, **kw)

    def _plan(self, A, B, C, kw, operands) -> tuple:
        mod = self.mod
        cfg = self.resolve_config(A, B, kw.get("config"))
        store_d = kw.get("store_d", True)
        provided = dict(kw.get("out") or {})
        outs = mod._alloc_outputs(provided, A, B, C, store_d, kw.get("out_dtype"), None, None)
        plan_out = outs if store_d else {k: v for k, v in outs.items() if k != "D"}
        plan = mod.plan(A, B, C, out=plan_out, config=cfg, **operands)
        recipes = tuple((k, tuple(t.shape), t.dtype) for k, t in plan_out.items() if provided.get(k) is None)
        sinks = tuple(
            (k, tuple(t.shape), t.dtype) for k, t in plan.scratch.items() if k in mod.sinks and k not in operands
        )
        dyn = bool(cfg.is_dynamic_persistent) and A.device.type == "cuda"
        self.stats["planned"] += 1
        if self.observe is not None:
            self.observe(self.name, A, B, cfg)
        return plan, recipes, sinks, dyn

    def _run(self, entry, A, B, C, out, store_d, operands):
        plan, recipes, sinks, dyn = entry
        dev = A.device
        outs = dict(out) if out else {}
        for name, shape, dt in recipes:
            if outs.get(name) is None:
                outs[name] = torch.empty(shape, dtype=dt, device=dev)
        scratch = {name: torch.empty(shape, dtype=dt, device=dev) for name, shape, dt in sinks}
        if not self.compile_only:
            sem = torch.zeros(1, dtype=torch.int32, device=dev) if dyn else None
            plan.run(A, B, C, out=outs, scratch=scratch, tile_count_semaphore=sem, **operands)
        result = outs if store_d else {k: v for k, v in outs.items() if k != "D"}
        for name in scratch:
            result[name] = self.mod._finalize_sink(name, scratch[name], None, plan.gemm_plan)
        return result


def epilogue_mods(module: types.ModuleType) -> dict[str, Any]:
    """The module-level ``EpiMod`` s of a kernel module, by global name."""
    from quack.epilogue.frontend import EpiMod

    return {k: v for k, v in vars(module).items() if isinstance(v, EpiMod)}


def bind_entry(
    module: types.ModuleType,
    entry: str,
    config_for: Callable[..., Any] | None = None,
    observe: Callable[..., None] | None = None,
    compile_only: bool = False,
) -> tuple[Callable[..., Any], dict[str, Launcher]]:
    """``module.<entry>`` re-bound so that every module-level epilogue mod it (or a
    module-level helper function) calls by name is a :class:`Launcher`.

    Returns ``(entry function, {mod name: launcher})``. The module is not modified: the
    functions are copies whose globals are a copy of the module's dict with the mods
    replaced. Raises AttributeError when the module has no callable ``entry``."""
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise AttributeError(f"kernel module {module.__name__!r} defines no function {entry!r}")
    g = dict(vars(module))
    launchers = {k: Launcher(m, k, config_for, observe, compile_only) for k, m in epilogue_mods(module).items()}
    g.update(launchers)
    for k, v in vars(module).items():
        if isinstance(v, types.FunctionType) and v.__globals__ is vars(module):
            f = types.FunctionType(v.__code__, g, v.__name__, v.__defaults__, v.__closure__)
            f.__kwdefaults__ = v.__kwdefaults__
            f.__qualname__, f.__doc__, f.__module__ = v.__qualname__, v.__doc__, v.__module__
            g[k] = f
    bound = g.get(entry, fn)
    return (bound if isinstance(bound, types.FunctionType) else fn), launchers

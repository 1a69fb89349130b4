"""Stage 1 of the verifier: a static (``ast``) check of the candidate contract, on the CPU.

The candidate module is untrusted code written by an LLM. Before anything imports it,
this stage parses it and enforces the contract of ARCHITECTURE.md ("The candidate
contract"); every violation becomes one :class:`~coda_agent.verifier.verdict.Finding`
naming the line, so the repair prompt can quote the offending code.

Design
------
* **Allow-lists where the surface is small, ban-lists where it is not.** Imports are an
  allow-list of explicit modules (``torch``, ``math``, ``functools``, ``operator``,
  ``typing``, ``__future__`` and :data:`surface.LIBRARY_MODULES`: ``cutlass``,
  ``cutlass.cute``, ``cutlass.cute.math``, ``quack.epilogue`` and its ``ops``/``math``/
  ``rotary``/``head_rmsnorm``/``scaled_exp``/``quantize_out`` submodules,
  ``quack.activation``, ``quack.gemm_config``; not
  ``quack.epilogue.library``, whose ready-made mods are the baseline) -- not
  package trees -- so ``gc``/``inspect``/``sys``/``os``/``triton``/``ctypes`` and
  ``cutlass.base_dsl``/``cutlass.torch`` are rejected without being named.
* **The import surface is resolved by introspection, not by name.** Allowed libraries
  re-export the standard library (``cutlass.cute.tuple.signature`` is
  ``inspect.signature``, ``cutlass.base_dsl.Path`` is ``pathlib.Path``, ``cutlass.torch.torch``
  is torch), so every ``from M import n`` and every attribute chain rooted at an imported
  alias is resolved by :mod:`coda_agent.verifier.static.surface` in this trusted process (it
  imports the *libraries*, never the candidate) and the object itself is judged: modules
  must be allowed and reached under their own name, other objects must be defined in
  cutlass/quack (``__module__``), be immutable constants, or be on the small
  math/operator/functools/typing whitelist (no ``update_wrapper``, ``singledispatch``,
  ``get_type_hints``, ``NamedTuple``, ``attrgetter``); unresolvable names are
  ``unknown-name``. String annotations (evaluated as code by typing/inspect machinery),
  ``type``/``object``/``super``, ``SystemExit``-style exits, ``str.format`` field traversal
  and ``next()`` on shared iterators are rejected too. Attributes of the ``torch`` module are an allow-list too (allocation, views,
  dtypes, types, plus the spec's ``entry.allowed_torch``): host code only allocates,
  makes views and calls the epilogue mods. Attributes of *values* (tensors, call results,
  locals: their type is invisible to ``ast``) are an allow-list, :data:`VALUE_ATTRIBUTES`
  (metadata, views, ``GemmConfig`` fields: quack's ``Scalar(name).to_params(0, obj)`` is
  a getattr, tests/verifier/corpus/getattr_gadget_exec.py); the ban-lists before it
  name the specific misuse with its own finding: the math that does the op's work
  (``.sum()``, ``.exp()``, ``.matmul()`` ...), precision casts (``.float()``,
  ``.to(torch.float32)``), pointer access (``.data_ptr()``), streams/events/sync.
* **Strings stay in place.** A string constant may be a docstring, a dict key, a
  subscript, a comparison operand, or an argument of a cutlass/quack/torch call or an
  epilogue mod; bound to a name, concatenated or passed to the candidate's own functions,
  it could become a dunder name or a format string at run time (``"_" + "_globals__"``,
  ``FMT % obj``), which no literal-based rule sees.
* **Names are resolved through the imports.** ``import torch.nn.functional as F`` makes
  ``F.silu`` resolve to ``torch.nn.functional.silu``; ``from torch import matmul as mm``
  makes ``mm`` resolve to ``torch.matmul``. Calls on names rooted in ``cutlass``/``quack``/
  ``math`` are exempt from the value-method ban-list, which is why epilogue bodies may
  call ``cute.math.exp`` or ``quack.activation.swiglu`` and do arithmetic with ``*``/``+``.
  The ``@`` operator is torch math (epilogue values never use it).
* **State across calls is rejected at its source, deny by default.** No
  ``global``/``nonlocal``; no attribute store or delete *anywhere*, whatever the syntax
  (assignment, ``for`` and comprehension targets: ``[0 for torch.Tensor.detach in [f]]``
  patches a method); no subscript store or delete at all
  (``x[i] = v``: host code has no use for item assignment, and ownership analysis is
  defeated by aliasing such as ``[_CACHE][0][0] = v``); no container-mutating method call
  on any receiver (``.append/.update/.setdefault/...``), nor any *reference* to such a
  method or to an in-place tensor method (``list.append`` passed around); at import time
  (module-level values, default arguments, decorators) only cutlass/quack/math
  constructors may be called (``_HOG = torch.empty(...)``, ``_BUF = _make()`` are
  rejected; decorators other than ``@gemm_epilogue`` too); no generator functions and no
  ``match`` statements (a class pattern reads any attribute by name, dunders included:
  ``case object(__globals__=G)`` reaches ``__builtins__``). The
  ownership analysis below still names the more specific cases (module-level
  dicts/lists, closure cells, locals aliased to them, parameters defaulting to them;
  augmented assignment, tensor in-place ``*_``). This is the static
  defense against "caching across calls" and "drift after N calls"; the GPU stage's
  fresh inputs and post-benchmark recheck are the dynamic one. ``functools.lru_cache``
  and mutable default arguments are rejected for the same reason.
* **The @gemm_epilogue contract is checked where quack is silent.** quack ignores a
  returned key that is not declared (a typo such as ``"Dd"`` silently stores the raw
  accumulator) and fails with a bare ``KeyError`` deep in its tracer when a declared
  output/reduce is not returned (measured; primitives_docs/00-contract.md, section 4). So
  the declarations (``outputs=``, ``reduces=``, ``outs=``) must be literals and every
  ``return`` of a decorated fn must be a dict literal with exactly those keys (plus
  ``"D"`` optionally).
* **quack's epilogue surface is admitted by rules, not left out.** An accumulator prepass
  (``prepass=fn, prepass_outs=(...)``) names a module-level, undecorated def of the
  module, bound once and named nowhere else (no lambda, closure or library function: quack
  calls it on DSL values; from host code it would compute on tensors); it is an epilogue
  body and returns a dict literal keyed by exactly its ``prepass_outs``. A class is allowed
  only as a custom epilogue op (``rules_classes``, table in ``op_bases``): at module level,
  over exactly one quack op base (``GroupedColStatsBase`` and its quack subclasses such as
  ``HeadRstd``), with no decorator, metaclass or keyword, and a body of a docstring, the
  base's configuration attributes set to the base's literals (``combine = "max"``) and the
  device hooks the base declares (``stat_value(self, total, group_cols)``) with exactly
  its parameters. Host-time hooks, ``__init__`` and dunders stay quack's; a hook is an
  epilogue body that never reads ``self``; the class is only constructed, at import time,
  with literal arguments. fp8 stores need nothing new: ``torch.float8_e4m3fn``/
  ``float8_e5m2`` buffers and the ``TileStore``/``GroupedColStatsOut`` ops.
* **Everything is reported, not just the first problem**, deduplicated and sorted by
  line, so one repair round can fix them all. The finding ``kind`` tags are stable
  (tests and the feedback renderer rely on them); see :data:`KINDS`.

This stage is necessary, not sufficient: it cannot see types or values, so elementwise
host math with operators, wrong numerics, aliasing and launch counts are the GPU
stages' job (poisoned allocator, input checks, profiler launch count).

Modules
-------
* ``facts.py``: what each name binds (the import table, module-level aliases, the
  module's own functions and data, numeric constants) and where a node stands, gathered
  once before any rule runs;
* ``lists.py``: the allow-lists and ban-lists, and the messages that quote them (the
  torch ones live in ``torch_lists.py``);
  ``surface.py``: the allowed libraries' import surface, resolved by introspection;
* the rules over those facts, by concern: ``rules_imports.py`` (imports, import-rooted
  names), ``rules_bindings.py`` (what a binding may shadow, reserved names),
  ``rules_module.py`` (module shape, import-time code, banned constructs),
  ``rules_values.py`` (names, attributes, values, strings, formatting),
  ``rules_calls.py`` (calls, casts, allocations, ``@``), ``rules_state.py`` (state across
  calls), ``rules_epilogue.py`` (the ``@gemm_epilogue`` contract, prepass fns and the entry
  point), ``rules_classes.py`` (custom epilogue op classes; their bases and hooks in
  ``op_bases.py``);
* ``checker.py``: runs the rules (a dispatch table by node type) and builds the
  :class:`~coda_agent.verifier.verdict.StageResult`; ``kinds.py``: the finding kinds.
"""

from __future__ import annotations

from .checker import check_static
from .kinds import KINDS

__all__ = ["KINDS", "check_static"]

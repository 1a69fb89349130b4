"""The candidate's import surface, resolved by introspection in the trusted verifier process.

Why introspection, not name lists
---------------------------------
A static stage that admits whole package trees (``cutlass.*``, ``quack.epilogue.*``) and
bans a list of *names* (``sys``, ``inspect``, ``exec`` ...) is not enough. Those packages import the
standard library for themselves, so they re-export it under other names:
``cutlass.cute.tuple.signature`` *is* ``inspect.signature`` (``eval_str=True`` evaluates
annotations), ``cutlass.base_dsl.ast_helpers.getmembers`` *is* ``inspect.getmembers``
(attribute access by string, dunders included), ``cutlass.base_dsl.typing.np`` is numpy
(``np.load(allow_pickle=True)``), ``cutlass.base_dsl.Path`` is ``pathlib.Path``,
``cutlass.torch.torch`` is torch itself (bypassing every torch rule). No list of names can
keep up with what a package tree re-exports, and renaming (``from ... import signature as s``)
defeats name matching anyway.

So this module answers, for a dotted path a candidate reaches (``from M import n``,
``alias.a.b``), *what object it is*: it imports the allowed library modules with
:mod:`importlib` -- in the verifier's own, trusted process; the candidate is never imported
or executed here -- walks the attributes with ``getattr`` and judges the object itself:

* every **module** on the way must be one of :data:`ALLOWED_MODULES` and be reached under its
  own name (``cutlass.cute`` yes; ``cutlass.base_dsl``, ``cutlass.torch``,
  ``quack.epilogue.ops.inspect``, ``quack.epilogue.ops.torch`` no);
* every other object must be *defined* in the allowed libraries (its ``__module__``, or its
  type's, under ``cutlass`` or ``quack``), be an immutable scalar constant, or be one of the
  few whitelisted standard-library objects (:data:`STD_WHITELIST`: pure arithmetic from
  ``math``/``operator``, ``functools.partial/reduce``, plain ``typing`` type constructs).
  Objects defined in ``inspect``, ``pathlib``, ``numpy``, ``functools.update_wrapper``,
  ``typing.get_type_hints``, ``types.SimpleNamespace``, builtin ``dict``s of module state ...
  are rejected whatever name they are reached by;
* a path that does not resolve is an ``unknown-name`` (a typo, or a guess at internals).

Paths rooted at ``torch`` are not resolved here: torch is judged by the static stage's
allocation/views/dtypes rules (torch.* names are stable and that surface is a policy
choice, not a re-export problem). Results are cached per process (importing quack and
cutlass takes a few seconds, once).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import types

ROOT_MODULES = ("torch", "math", "functools", "operator", "typing", "__future__")
"""Standard/torch modules a candidate may import (as themselves only)."""

LIBRARY_MODULES = (
    "cutlass",
    "cutlass.cute",
    "cutlass.cute.math",
    "quack.epilogue",
    "quack.epilogue.ops",
    "quack.epilogue.math",
    "quack.epilogue.rotary",
    "quack.epilogue.head_rmsnorm",
    "quack.epilogue.scaled_exp",
    "quack.epilogue.quantize_out",
    "quack.activation",
    "quack.gemm_config",
)
"""The library submodules candidates need (primitives_docs examples, accepted kernels, the
corpus): everything else in the cutlass/quack trees (``cutlass.base_dsl``, ``cutlass.torch``,
``cutlass.cute.runtime``, ``quack.gemm_interface`` ...) is off limits. ``quack.epilogue.library``
is excluded on purpose: its ready-made mods are the baseline a candidate is measured
against, not something to call (the mods the other modules define, such as
``scaled_exp.scaled_exp_epi``, are refused one by one: ``library-epilogue``).
``head_rmsnorm`` (``HeadRstd``), ``scaled_exp`` (``MaxLog2``) and ``quantize_out``
(``BlockScaleFactorStore``) hold quack's grouped statistics and quantized stores."""

ALLOWED_MODULES = frozenset((*ROOT_MODULES, *LIBRARY_MODULES))

LIBRARY_ROOTS = ("cutlass", "quack")
"""``__module__`` roots of objects defined by the allowed libraries."""

_OPERATOR_OK = (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "neg",
    "pos",
    "pow",
    "abs",
    "and_",
    "or_",
    "xor",
    "invert",
    "inv",
    "lshift",
    "rshift",
    "not_",
    "truth",
    "lt",
    "le",
    "eq",
    "ne",
    "ge",
    "gt",
)
_TYPING_OK = (
    "Any",
    "Optional",
    "Tuple",
    "List",
    "Dict",
    "Union",
    "Callable",
    "Sequence",
    "Mapping",
    "Iterable",
    "Literal",
)
STD_WHITELIST: dict[str, frozenset[str]] = {
    "math": frozenset(n for n in dir(math) if not n.startswith("_")),
    "operator": frozenset(_OPERATOR_OK),
    "functools": frozenset({"partial", "reduce"}),
    "typing": frozenset(_TYPING_OK),
}
"""Standard-library names a candidate may use (pure arithmetic and type constructs). Not:
``operator.attrgetter/methodcaller/setitem`` or in-place ops, ``functools.update_wrapper/
wraps/singledispatch`` (setattr / annotation eval), ``typing.get_type_hints/NamedTuple``."""

_STD_OBJECTS: dict[int, str] = {}
for _mod, _names in STD_WHITELIST.items():
    _m = importlib.import_module(_mod)
    for _n in _names:
        _STD_OBJECTS[id(getattr(_m, _n))] = f"{_mod}.{_n}"
_STD_KEEP = [getattr(importlib.import_module(m), n) for m, ns in STD_WHITELIST.items() for n in ns]
"""Keeps the whitelisted objects alive so their ids stay meaningful."""

_SCALARS = (int, float, complex, str, bytes, bool, type(None))


def _immutable_constant(obj: object) -> bool:
    if isinstance(obj, _SCALARS):
        return True
    if isinstance(obj, (tuple, frozenset)):
        return all(_immutable_constant(x) for x in obj)
    return False


def _defined_in(obj: object) -> str:
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str):
        mod = type(obj).__module__
    return mod


class LibraryUnavailable(RuntimeError):
    """An allowed library module does not import in the verifier's own process: the
    verifier's environment is incomplete (e.g. triton missing for ``quack.activation``).
    Raised, not reported as a finding: it is no fault of the candidate, so the static stage
    ends as a verifier error and an agent attempt is not spent on it."""


@functools.lru_cache(maxsize=None)
def _import(name: str):
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 - reported as a finding, not raised
        return None, f"{type(e).__name__}: {e}"


def _is_submodule(name: str) -> bool:
    import importlib.util
    import sys

    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # noqa: BLE001
        return False


def module_import_allowed(name: str) -> bool:
    """True when ``import name`` is allowed (an explicit module, not a package tree)."""
    return name in ALLOWED_MODULES


POINTER_NAMES = frozenset({"inttoptr", "make_ptr", "recast_ptr", "Pointer", "TypedPointer"})
"""Pointers made from integers or recast (``cutlass.inttoptr``, ``cute.make_ptr``,
``cute.recast_ptr``, the ``Pointer``/``TypedPointer`` classes): an epilogue reading or writing device memory that no operand names
(state kept across calls, writes into other tensors). Epilogues
reach memory only through the primitives' operands."""

EPILOGUE_BUILDERS = frozenset({"EpiMod", "StaticEpi", "epilogue_from_class"})
"""quack's ways to build an epilogue mod from any function and any declarations, outside
``@gemm_epilogue``: none of the static epilogue checks (literal declarations, return keys,
mode) would see such a mod."""

DENIED_LIBRARY_NAMES = frozenset(
    {
        "struct",
        "union",
        "register_jit_arg_adapter",
        "JitArgAdapterRegistry",
        # compiler entry points: their option strings write and read files
        # (--remark-output=PATH truncates a file), ffi loads code
        "compile",
        "jit",
        "kernel",
        "compile_to",
        "ffi",
        "CompileOptions",
        # typing.get_type_hints on a candidate's function: eval of its annotations
        "native_struct",
        "make_native_struct",
        *EPILOGUE_BUILDERS,
        *POINTER_NAMES,
    }
)
"""cutlass/quack names that mutate the objects passed to them, process-wide registries,
drive the DSL compiler directly (quack's @gemm_epilogue compiles on the candidate's behalf)
or fabricate pointers."""


@functools.lru_cache(maxsize=None)
def judge(path: str) -> tuple[str, str, bool] | None:
    """Judge the object a candidate reaches as the dotted ``path``.

    Returns None when it is allowed and is not a module; ``("module", name, True)`` when it
    is an allowed module (callers decide whether a module may be used as a value); else
    ``(kind, message, False)`` with ``kind`` one of ``banned-import``, ``foreign-object``,
    ``unknown-name``, ``banned-attribute``, ``call-cache``, ``library-epilogue``.
    """
    parts = path.split(".")
    if parts[0] in ("torch", "__future__"):
        return None
    if parts[-1] in DENIED_LIBRARY_NAMES:
        if parts[-1] in POINTER_NAMES:
            return (
                "banned-call",
                f"`{path}` makes a pointer from an integer or recasts one: an epilogue reaches "
                "memory only through its primitives' operands (RowVecLoad, TileLoad, ...)",
                False,
            )
        if parts[-1] in EPILOGUE_BUILDERS:
            return (
                "banned-call",
                f"`{path}` builds an epilogue mod outside @gemm_epilogue, where none of the "
                "epilogue checks see it: define every epilogue at module level with @gemm_epilogue(...)",
                False,
            )
        return (
            "banned-call",
            f"`{path}` modifies the classes or global registries it is given, or drives "
            "the DSL compiler (whose options write files); @gemm_epilogue mods compile themselves",
            False,
        )
    if any(p.startswith("_") for p in parts[1:]):
        return ("banned-attribute", f"`{path}`: private/dunder attributes of allowed modules are not allowed", False)
    # longest allowed module prefix
    base = None
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in ALLOWED_MODULES:
            base = i
            break
    if base is None:
        if any(m.startswith(path + ".") for m in ALLOWED_MODULES):
            return ("module", path, True)  # a package on the way to an allowed module (``quack``)
        head = ".".join(parts[:2]) if len(parts) > 1 else path
        return ("banned-import", f"`{path}` reaches `{head}`, which is not an allowed module", False)
    modname = ".".join(parts[:base])
    obj, err = _import(modname)
    if obj is None:
        raise LibraryUnavailable(
            f"allowed module `{modname}` cannot be imported in the verifier ({err}): the verifier's Python "
            f'environment is incomplete; install the project with its extras (pip install -e ".[cpu-compile]")'
        )
    std = modname if modname in STD_WHITELIST else None
    here = modname
    for p in parts[base:]:
        owner = obj
        here = f"{here}.{p}"
        if std is not None:
            if here == f"{std}.{p}" and p not in STD_WHITELIST[std]:
                if std == "functools" and p in ("lru_cache", "cache", "cached_property"):
                    return (
                        "call-cache",
                        f"`{path}` caches results across calls; every call must recompute from its inputs",
                        False,
                    )
                if not hasattr(obj, p):
                    return ("unknown-name", f"`{here}` does not exist", False)
                return (
                    "foreign-object",
                    f"`{here}` is not on the {std} whitelist ({', '.join(sorted(STD_WHITELIST[std]))[:200]})",
                    False,
                )
        try:
            obj = getattr(obj, p)
        except Exception:  # noqa: BLE001
            if _is_submodule(here):
                return (
                    "banned-import",
                    f"`{here}` is a module outside the allow-list ({', '.join(LIBRARY_MODULES)})",
                    False,
                )
            return (
                "unknown-name",
                f"`{here}` does not exist (no attribute `{p}` in `{here.rsplit('.', 1)[0]}`)",
                False,
            )
        if not isinstance(owner, types.ModuleType) and callable(obj) and not isinstance(obj, type):
            # `Scalar.to_params(Scalar(name), 0, obj)` is getattr(obj, name) by the class's
            # method (tests/verifier/corpus/class_method_gadget.py); a candidate calls module
            # functions and constructors only
            return (
                "banned-attribute",
                f"`{here}` is a method of `{here.rsplit('.', 1)[0]}`: candidates call the "
                "allowed modules' functions and constructors, never methods reached through a class or object "
                "(several cutlass/quack methods do getattr/setattr by a name they are given)",
                False,
            )
        if _identity(obj) in _denied_identities():
            # a denied object reached under another name (a re-export, an alias class attribute)
            return (
                "banned-call",
                f"`{path}` is a pointer maker or DSL compiler entry point under another name "
                "(see the contract: epilogues reach memory only through their operands, and mods compile "
                "themselves)",
                False,
            )
        bad = _judge_object(here, obj, std)
        if bad is not None:
            return bad
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__, True)
    return None


def _identity(obj: object) -> tuple[int, int]:
    """What makes two reaches of one library object the same: a bound method is created
    anew on each attribute access, so it is identified by its function and receiver."""
    return id(getattr(obj, "__func__", obj)), id(getattr(obj, "__self__", None))


@functools.lru_cache(maxsize=None)
def _denied_identities() -> frozenset[tuple[int, int]]:
    """The objects :data:`DENIED_LIBRARY_NAMES` name in the allowed library modules (classes
    and functions only), so that the same object is refused whatever name reaches it, not
    only under its last name component."""
    out = set()
    for modname in LIBRARY_MODULES:
        mod, _ = _import(modname)
        for name in DENIED_LIBRARY_NAMES:
            obj = getattr(mod, name, None) if mod is not None else None
            if obj is not None and callable(obj) and not isinstance(obj, types.ModuleType):
                out.add(_identity(obj))
    return frozenset(out)


def library_object(path: str) -> object | None:
    """The object the dotted ``path`` names when :func:`judge` allows it and it is not a
    module (imported from the allowed library modules, never from the candidate); else None."""
    if judge(path) is not None:
        return None
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in ALLOWED_MODULES:
            obj, _ = _import(".".join(parts[:i]))
            for p in parts[i:]:
                obj = getattr(obj, p, None)
            return obj
    return None


@functools.lru_cache(maxsize=None)
def config_fields() -> frozenset[str]:
    """The field names of quack's ``GemmConfig`` (``tile_m``, ``tile_n``, ``pingpong`` ...):
    host code may read them on a config it built. Empty where quack cannot be imported."""
    mod, _ = _import("quack.gemm_config")
    cls = getattr(mod, "GemmConfig", None)
    return frozenset(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else frozenset()


@functools.lru_cache(maxsize=None)
def _epilogue_mod_class():
    """quack's ``EpiMod`` (what ``@gemm_epilogue`` returns), or None where it cannot be imported."""
    mod, _ = _import("quack.epilogue.frontend")
    return getattr(mod, "EpiMod", None)


@functools.lru_cache(maxsize=None)
def is_library_callable(path: str) -> bool:
    """True when the dotted ``path`` (rooted at ``torch``, ``cutlass`` or ``quack``) names a
    callable that is not a module (a function, a class, a mod); False for dtypes,
    constants, modules and paths that do not resolve (those are judged elsewhere)."""
    parts = path.split(".")
    if any(p.startswith("_") for p in parts):
        return False  # private paths are banned-attribute; nothing is imported for them
    obj = None
    for i in range(len(parts), 0, -1):  # only allowed modules are imported here, never a path's guess
        if ".".join(parts[:i]) in ALLOWED_MODULES:
            obj, _ = _import(".".join(parts[:i]))
            break
    if obj is None:
        return False
    for p in parts[i:]:
        try:
            obj = getattr(obj, p)
        except Exception:  # noqa: BLE001 - unresolvable: judged as unknown-name by judge()
            return False
    if isinstance(obj, type) and _is_dsl_numeric_type(obj):
        return False  # cutlass.Float32 & co. are dtypes (Scalar(..., dtype=cutlass.Float32)), passed as values
    return callable(obj) and not isinstance(obj, types.ModuleType)


def _is_dsl_numeric_type(cls: type) -> bool:
    """True for CuTeDSL's numeric types (``cutlass.Float32``, ``cutlass.Int32`` ...)."""
    mod, _ = _import("cutlass")
    numeric = getattr(mod, "Numeric", None)
    return isinstance(numeric, type) and issubclass(cls, numeric)


def _judge_object(here: str, obj: object, std: str | None) -> tuple[str, str, bool] | None:
    if isinstance(obj, type) and issubclass(obj, type):
        # a metaclass builds classes: `cutlass.NumericMeta("Zed", (int,), {k: f})` defined a
        # class with run-time dunders and a fresh type per call (a call counter through
        # cute.shape's cache), past the class-definition rule
        # (tests/verifier/corpus/metaclass_call_counter.py)
        return (
            "banned-call",
            f"`{here}` is a metaclass (it builds classes): candidates define no classes, in any form",
            False,
        )
    epi_mod = _epilogue_mod_class()
    if epi_mod is not None and isinstance(obj, epi_mod):
        return (
            "library-epilogue",
            f"`{here}` is one of quack's ready-made epilogue mods: it is the library baseline "
            "the kernel is measured against, not a candidate; write the epilogue with @gemm_epilogue from the "
            "primitives",
            False,
        )
    if isinstance(obj, types.ModuleType):
        if obj.__name__ in ALLOWED_MODULES and obj.__name__ == here:
            return None
        return (
            "banned-import",
            f"`{here}` is the module `{obj.__name__}`, reached through another module: an import in disguise "
            f"(allowed library modules: {', '.join(LIBRARY_MODULES)})",
            False,
        )
    if id(obj) in _STD_OBJECTS:
        return None
    if std is not None:
        return None  # attributes of whitelisted std objects (math.pi.real ...)
    if _immutable_constant(obj):
        return None
    mod = _defined_in(obj)
    if mod.split(".")[0] in LIBRARY_ROOTS:
        return None
    return (
        "foreign-object",
        f"`{here}` is `{mod}.{getattr(obj, '__qualname__', type(obj).__name__)}`, defined outside the allowed "
        "libraries (a standard-library/third-party object re-exported by an allowed module); "
        "candidates may use only cutlass/quack objects and the whitelisted math/operator/functools/typing names",
        False,
    )

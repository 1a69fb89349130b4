"""The allow-lists and ban-lists the static rules judge by, and the messages that quote them.

Each list names what it holds and why; the rules (``rules_*.py``) decide where a name is
looked up. The import surface of the allowed libraries is resolved by introspection in
:mod:`~coda_agent.verifier.static.surface`.
"""

from __future__ import annotations

import ast
import builtins
import re

from ..spec import KernelSpec
from . import surface
from .torch_lists import (  # noqa: F401  (re-exported: the rules import every list from here)
    CAST_METHODS,
    REFERENCE_CHECKED_METHODS,
    TORCH_ALLOWED,
    TORCH_DTYPES,
    TORCH_MATH,
    TORCH_RUNTIME,
    VALUE_MATH_METHODS,
)

ALLOWED_IMPORT_ROOTS = ("torch", "math", "functools", "operator", "typing", "__future__")
"""Modules importable as themselves only (``import torch.nn`` is not allowed)."""

ALLOWED_IMPORT_EXACT = surface.LIBRARY_MODULES
"""The library modules importable by name (explicit submodules, not package trees: see
:mod:`coda_agent.verifier.static.surface`)."""

BANNED_BUILTINS = frozenset(
    {
        "exec",
        "eval",
        "compile",
        "open",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "id",
        "breakpoint",
        "input",
        "hash",
        "exit",
        "quit",
        "memoryview",
        "__build_class__",
        "help",
        "dir",
        "type",
        "object",
        "super",
        "classmethod",
        "staticmethod",
        "property",
        "SystemExit",
        "KeyboardInterrupt",
        "BaseException",
        "GeneratorExit",
        # repr()/str() end in "at 0x<address>" and sets order objects by identity hash: a
        # stateless fingerprint of the heap that tells timed calls from checked ones; print()
        # floods the worker's log file
        "repr",
        "str",
        "ascii",
        "format",
        "print",
        "set",
        "frozenset",
        # site's interactive helpers write to the log (license() can read input)
        "credits",
        "license",
        "copyright",
        # reflection by a name built at run time (and it runs property getters)
        "hasattr",
    }
)
"""Builtins that load code, reach objects by string, read scopes or identity, or do I/O."""


BUILTIN_NAMES = frozenset(dir(builtins))
"""Every builtin's name: no scope of a candidate may rebind one (``rules_bindings``)."""

RESERVED_NAME_RE = re.compile(r"sync|memcpy|memset|memory", re.IGNORECASE)
"""Def names the launch count could mistake for profiler markers (``rules_bindings.reserved_names``)."""


POINTER_ATTRS = frozenset(
    {
        "data_ptr",
        "untyped_storage",
        "storage",
        "storage_offset_ptr",
        "_cdata",
        "__cuda_array_interface__",
        "__dlpack__",
        "unsafe_get",
        "unsafe_set",
    }
)
"""Raw pointer/storage access (cache keys on pointers, out-of-band aliasing)."""

HOST_ESCAPE_ATTRS = frozenset(
    {
        "numpy",
        "cpu",
        "tofile",
        "fromfile",
        "dump",
        "dumps",
        "tobytes",
        "tostring",
        "frombuffer",
        "from_numpy",
        "memmap",
        "savetxt",
        "save",
        "load",
        "to_dlpack",
        "from_dlpack",
        "pin_memory",
        "share_memory_",
        "new_tensor",
        "write_bytes",
        "write_text",
        "open",
        # storage classes open and mmap files (b.storage_type().from_file(path, True, n)),
        # .new(...) wraps storages/bytes, .fn runs an epilogue body eagerly on host tensors
        "storage_type",
        "new",
        "set_",
        "is_shared",
        "fn",
        "gemm_tuned",
        # host reads of tensor values (a marker written into an input, read back)
        "item",
        "tolist",
    }
)
"""Ways from a tensor to host memory, numpy or the filesystem
(``x.new_tensor(bytes).cpu().numpy().tofile(path)`` writes any file). A kernel's host code
never needs them: outputs are GPU tensors, and nothing leaves the GPU."""

INTROSPECTION_ATTRS = frozenset(
    {
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "f_trace",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "func_globals",
        "mro",
        "format",
        "format_map",
    }
)
"""Attributes that reach frames, code objects or tracebacks."""

REEXPORTED_MODULES = frozenset(
    {
        "sys",
        "os",
        "inspect",
        "gc",
        "subprocess",
        "importlib",
        "builtins",
        "ctypes",
        "threading",
        "multiprocessing",
        "socket",
        "shutil",
        "pathlib",
        "io",
        "tempfile",
        "pickle",
        "marshal",
        "types",
        "weakref",
        "signal",
        "atexit",
        "traceback",
        "posix",
        "runpy",
        "pdb",
        "cloudpickle",
        "dill",
        "triton",
        "random",
        "time",
        "concurrent",
        "asyncio",
    }
)
"""Stdlib/tool modules that allowed packages import for themselves (``quack.epilogue.frontend``
imports ``sys`` and ``inspect``): reaching them as ``allowed_module.sys`` is an import in
disguise."""

REFLECTIVE_ATTRS = frozenset(
    {
        "exec",
        "eval",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "system",
        "popen",
        "spawn",
        "fork",
        "execv",
        "execve",
        "modules",
        "import_module",
        "reload",
        "load_module",
        "exec_module",
        "currentframe",
        "getframe",
        "get_objects",
        "get_referrers",
        "get_referents",
        "settrace",
        "setprofile",
    }
)
"""Attribute names that load code, reach objects by name, or walk the heap/frames."""

MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "sort",
        "reverse",
        "appendleft",
        "extendleft",
        "popleft",
        "rotate",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "put",
        "put_nowait",
        "write",
        "set",
        "__setitem__",
        "__delitem__",
        "__iadd__",
    }
)
"""Container methods that mutate their receiver (plus any tensor in-place ``*_``)."""

OPERATOR_BANNED = {
    "attrgetter": "banned-call",
    "methodcaller": "banned-call",
    "setitem": "banned-call",
    "delitem": "banned-call",
    "iadd": "banned-call",
    "iconcat": "banned-call",
    "matmul": "torch-math",
    "imatmul": "torch-math",
}
"""``operator.<name>`` that reach objects by string, mutate, or multiply matrices."""

FUNCTOOLS_CACHES = frozenset({"lru_cache", "cache", "cached_property"})

BANNED_KEYWORDS = {
    "post_init_attrs": "quack setattr()s these onto its GEMM object; pass the library no objects to install",
    "split_k_buffers": "scratch buffers the candidate would own across calls",
    "tile_count_semaphore": "scratch buffers the candidate would own across calls",
}
"""Keyword arguments of quack calls that install candidate objects or state into the library."""

STREAM_RE = re.compile(r"stream|event|synchron|graph", re.IGNORECASE)
"""Attribute names that touch streams, events, synchronization or CUDA graphs."""

VALUE_ATTRIBUTES = frozenset(
    {
        # tensor metadata (numbers, dtypes, devices)
        "shape",
        "dtype",
        "device",
        "ndim",
        "layout",
        "is_cuda",
        "requires_grad",
        "size",
        "stride",
        "dim",
        "numel",
        "element_size",
        "itemsize",
        "nbytes",
        "is_contiguous",
        # views, and the contiguous copy (every launch is counted by the GPU stages)
        "T",
        "mT",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "expand",
        "expand_as",
        "transpose",
        "t",
        "permute",
        "unsqueeze",
        "squeeze",
        "flatten",
        "unflatten",
        "narrow",
        "select",
        "chunk",
        "split",
        "unbind",
        "movedim",
        "contiguous",
        # allocation beside a tensor, and `.to(x.device)` (casts are judged by the cast rule)
        "new_empty",
        "to",
        # torch.finfo(...)/torch.iinfo(...) numbers
        "eps",
        "tiny",
        "bits",
        "resolution",
        "smallest_normal",
        # DSL values inside an epilogue fn
        "element_type",
        "reduce",
        # reads of the dict an epilogue mod returns, and dtype facts
        "get",
        "keys",
        "values",
        "items",
        "is_floating_point",
        "is_complex",
        "is_signed",
    }
)
"""Attributes a candidate may read on *values* -- tensors, call results, locals, parameters,
module-level constants such as a ``GemmConfig`` (whose fields are allowed too, see
:func:`surface.config_fields`): an allow-list, because a value's type is invisible to
``ast`` and a ban-list misses what it does not name: a method reached on a library object
is as good as any, and quack's ``Scalar(name).to_params(gemm, obj)`` is
``getattr(obj, name)``, and with a computed ``"_" + "_globals__"`` it reached the real
``exec`` through ``torch.Tensor.__reduce_ex__``. Names the ban-lists judge (math, casts,
pointers, host escapes ...) keep their own, more specific findings."""

EPILOGUE_MODES = ("element", "acc_pair", "packed_cd_b16x2")


METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad"})

PASS_THROUGH_CALLS = frozenset({"const_expr", "dynamic_expr"})
"""Library calls that return their argument: a string given to one is a value, not in place."""

JUDGED_ELSEWHERE = (
    INTROSPECTION_ATTRS
    | REFLECTIVE_ATTRS
    | POINTER_ATTRS
    | HOST_ESCAPE_ATTRS
    | MUTATING_METHODS
    | VALUE_MATH_METHODS
    | CAST_METHODS
    | REEXPORTED_MODULES
    | {"send", "throw"}
)
"""Attribute names with a finding of their own (or, for math the spec allows, none):
:func:`rules_values.check_value_attribute` leaves them to those rules."""

TRY_STAR = (ast.TryStar,) if hasattr(ast, "TryStar") else ()


def import_msg(module: str) -> str:
    allowed = ", ".join([*ALLOWED_IMPORT_ROOTS, *ALLOWED_IMPORT_EXACT])
    return f"import of `{module}` is not allowed; candidates may import only: {allowed}"


def builtin_msg(name: str) -> str:
    return (
        f"`{name}` is not allowed in candidate code (no dynamic code, attribute access by string, "
        "scope/identity reflection or I/O)"
    )


def allowed_hint(spec: KernelSpec) -> str:
    allowed = spec.entry.allowed_torch
    return f" (the spec allows only: {allowed})" if allowed else " (the spec allows no torch math in host code)"


def torch_math_msg(q: str, spec: KernelSpec) -> str:
    return (
        f"`{q}` does the op's work in PyTorch instead of the fused epilogue; compute it inside the "
        "@gemm_epilogue fn (quack.activation / cute.math)" + allowed_hint(spec)
    )


def torch_api_msg(q: str, spec: KernelSpec) -> str:
    return (
        f"`{q}` is not allowed: host code may only allocate (torch.empty/empty_like/empty_strided), "
        "make views, name dtypes, call the epilogue mods" + allowed_hint(spec)
    )

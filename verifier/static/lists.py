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

TORCH_ALLOWED = frozenset(
    {
        # allocation (no kernel launch)
        "empty",
        "empty_like",
        "empty_strided",
        # views / metadata
        "as_strided",
        "narrow",
        "split",
        "chunk",
        "unbind",
        "movedim",
        "permute",
        "transpose",
        "t",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "reshape",
        "select",
        "broadcast_to",
        "view_as_real",
        "view_as_complex",
        "numel",
        "is_tensor",
        "is_floating_point",
        # types and dtypes
        "Tensor",
        "dtype",
        "device",
        "Size",
        "finfo",
        "iinfo",
        "layout",
        "strided",
        "bfloat16",
        "float16",
        "half",
        "float32",
        "float",
        "float64",
        "double",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "int",
        "long",
        "short",
        "bool",
        "uint16",
        "uint32",
        "uint64",
        # grad-mode decorators (with-blocks are banned separately)
        "no_grad",
        "inference_mode",
    }
)
"""``torch.<name>`` a candidate may use without the spec allowing it."""

TORCH_MATH = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "addmv",
        "addbmm",
        "baddbmm",
        "einsum",
        "linear",
        "tensordot",
        "dot",
        "vdot",
        "mv",
        "inner",
        "outer",
        "ger",
        "chain_matmul",
        "sigmoid",
        "silu",
        "relu",
        "gelu",
        "tanh",
        "softmax",
        "log_softmax",
        "logsumexp",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log1p",
        "sqrt",
        "rsqrt",
        "pow",
        "square",
        "sum",
        "nansum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "maximum",
        "minimum",
        "norm",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "cumsum",
        "cumprod",
        "prod",
        "mul",
        "multiply",
        "add",
        "sub",
        "subtract",
        "div",
        "divide",
        "true_divide",
        "addcmul",
        "addcdiv",
        "lerp",
        "clamp",
        "clip",
        "abs",
        "neg",
        "reciprocal",
        "sin",
        "cos",
        "erf",
        "sign",
        "where",
        "stack",
        "cat",
        "concat",
        "concatenate",
        "cross_entropy",
        "nll_loss",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "batch_norm",
        "dropout",
        "rot90",
        "roll",
        "polar",
        "view_as_complex_copy",
        "nn",
        "special",
        "linalg",
        "fft",
        "compile",
        "func",
        "vmap",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "fill",
        "rand",
        "randn",
        "rand_like",
        "randn_like",
        "randint",
        "clone",
        "copy",
        "tensor",
        "as_tensor",
        "from_numpy",
        "frombuffer",
        "arange",
        "linspace",
    }
)
"""``torch.<name>`` that computes or fills data (the op's work, or a fake output)."""

TORCH_RUNTIME = frozenset(
    {
        "ops",
        "library",
        "cuda",
        "backends",
        "autograd",
        "jit",
        "fx",
        "distributed",
        "multiprocessing",
        "profiler",
        "testing",
        "hub",
        "package",
        "utils",
        "compiler",
        "export",
        "overrides",
        "classes",
        "random",
        "manual_seed",
        "seed",
        "initial_seed",
        "get_rng_state",
        "set_rng_state",
        "use_deterministic_algorithms",
        "load",
        "save",
        "from_file",
        "accelerator",
        "mps",
        "xpu",
        "cpu",
        "Generator",
        "storage",
        "UntypedStorage",
        "TypedStorage",
        "set_default_dtype",
        "set_default_device",
        "set_float32_matmul_precision",
        "set_grad_enabled",
        "set_printoptions",
    }
)
"""``torch.<name>`` that reaches the runtime, RNG, dispatcher or global state."""

VALUE_MATH_METHODS = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "addmv",
        "addbmm",
        "baddbmm",
        "einsum",
        "tensordot",
        "dot",
        "vdot",
        "mv",
        "inner",
        "outer",
        "ger",
        "sigmoid",
        "sigmoid_",
        "silu",
        "relu",
        "relu_",
        "gelu",
        "tanh",
        "tanh_",
        "softmax",
        "log_softmax",
        "logsumexp",
        "exp",
        "exp_",
        "exp2",
        "expm1",
        "log",
        "log_",
        "log2",
        "log1p",
        "sqrt",
        "sqrt_",
        "rsqrt",
        "rsqrt_",
        "pow",
        "pow_",
        "square",
        "sum",
        "nansum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "norm",
        "var",
        "std",
        "cumsum",
        "cumprod",
        "prod",
        "mul",
        "mul_",
        "multiply",
        "add",
        "add_",
        "sub",
        "sub_",
        "subtract",
        "div",
        "div_",
        "divide",
        "true_divide",
        "addcmul",
        "addcmul_",
        "addcdiv",
        "addcdiv_",
        "lerp",
        "lerp_",
        "clamp",
        "clamp_",
        "clip",
        "clip_",
        "abs",
        "abs_",
        "neg",
        "neg_",
        "reciprocal",
        "reciprocal_",
        "sin",
        "cos",
        "erf",
        "where",
        "masked_fill",
        "masked_fill_",
        "fill_",
        "zero_",
        "copy_",
        "index_put_",
        "index_copy_",
        "index_fill_",
        "scatter_",
        "scatter_add_",
        "put_",
        "masked_scatter_",
        "normal_",
        "uniform_",
        "random_",
        "set_",
        "resize_",
        "resize_as_",
        "clone",
        "softplus",
        "logit",
        # a GEMM as (x[:, None] * w[None]).sum_to_size(m, n, 1)
        "sum_to_size",
        "addr",
        "kron",
        "cross",
        "trace",
        "logcumsumexp",
        "cummax",
        "cummin",
        "float_power",
        "xlogy",
        "hypot",
        "atan2",
        "dist",
        "renorm",
        # a GEMM as a broadcast product reduced with .nanmean(-1) * K, and type promotion
        # through x + x.new_zeros(1, dtype=torch.float32)
        "nanmean",
        "nanmedian",
        "median",
        "quantile",
        "nanquantile",
        "new_zeros",
        "new_ones",
        "new_full",
        # a GEMM as a broadcast product accumulated with .index_add
        "index_add",
        "scatter_add",
        "scatter_reduce",
        "index_reduce",
        "index_put",
        "masked_scatter",
        "bincount",
        "cov",
        "corrcoef",
        "histc",
        "histogram",
        "index_fill",
        "scatter",
        "put",
        # the target logit picked from materialized logits with .gather
        "gather",
        "take",
        "take_along_dim",
        "index_select",
        "masked_select",
    }
)
"""Methods on values (tensors) that compute, fill or rebind data."""

BUILTIN_NAMES = frozenset(dir(builtins))
"""Every builtin's name: no scope of a candidate may rebind one (``rules_bindings``)."""

RESERVED_NAME_RE = re.compile(r"sync|memcpy|memset|memory", re.IGNORECASE)
"""Def names the launch count could mistake for profiler markers (``rules_bindings.reserved_names``)."""

CAST_METHODS = frozenset(
    {
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "short",
        "char",
        "byte",
        "bool",
        "type",
        "type_as",
    }
)
"""Tensor dtype-cast methods (precision games)."""

REFERENCE_CHECKED_METHODS = (VALUE_MATH_METHODS | {"new_empty", "view", "new_tensor"}) - CAST_METHODS
"""Tensor methods whose calls are judged (math, allocation device, bit views): referenced
without being called, they would be judged nowhere (casts have their own message)."""

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

TORCH_DTYPES = frozenset(
    {
        "bfloat16",
        "float16",
        "half",
        "float32",
        "float",
        "float64",
        "double",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "int",
        "long",
        "short",
        "bool",
    }
)


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

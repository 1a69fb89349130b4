"""quack's op base classes a candidate may subclass, and what such a subclass may hold.

A custom epilogue op is a class over one of quack's ``EpiOp`` bases. Most of an op's
methods run on the host (``host_arg_key``, ``host_call_arg``, ``to_params``,
``config_key``, ...): per call, with the caller's torch tensors, outside the traced
kernel, where no epilogue rule would apply. So a candidate's op class may only override
the *device* hooks a base declares for subclasses -- methods quack calls while it traces
the kernel, on DSL values, which the epilogue rules cover -- and set the class attributes
the base reads as configuration, to one of the values the base knows. Everything else
(host hooks, ``__init__``, dunders, other attributes) is inherited from quack unchanged.

:data:`OP_BASES` is that table, by base class. It holds the bases whose declared hooks
can be written under the epilogue rules (no item stores, no host code):
``GroupedColStatsBase`` -- quack's grouped / per-head prepass statistics, whose stats-only
subclasses "just set ``combine`` and define ``stat_value``" (its docstring; ``HeadRstd``
and ``scaled_exp.MaxLog2`` are such subclasses). ``stat_value`` is called only inside
``@cute.jit`` methods (``fn_prepass_end``, ``fn_prepass_resolve``,
``GroupedColStatsOut.end_loop_finish``), never on the host.
tests/verifier/test_static_ops.py::test_op_base_table_matches_quack pins the table
against the installed quack.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from . import surface


@dataclass(frozen=True)
class OpBase:
    """What a subclass of one op base may define.

    Attributes:
        hooks: method name -> its exact parameter names (``self`` first), as the base declares them.
        attrs: class attribute name -> the literal values the base accepts for it.
    """

    hooks: dict[str, tuple[str, ...]]
    attrs: dict[str, tuple[str, ...]]


OP_BASES: dict[str, OpBase] = {
    "quack.epilogue.ops.GroupedColStatsBase": OpBase(
        hooks={"stat_value": ("self", "total", "group_cols")},
        attrs={"combine": ("add", "max")},
    ),
}
"""Op base (``module.qualname``) -> the hooks and class attributes its subclasses may set."""


@functools.lru_cache(maxsize=None)
def op_base(path: str) -> OpBase | None:
    """The :class:`OpBase` rules for a candidate class whose one base is the dotted ``path``
    (``quack.epilogue.head_rmsnorm.HeadRstd``), or None when that base is not a quack op
    base a candidate may subclass: not a class of an allowed module, not derived from a
    base of :data:`OP_BASES`, or built by a metaclass or carrying an ``__init_subclass__``
    (code that runs when the candidate's class is created)."""
    cls = surface.library_object(path)
    if not isinstance(cls, type) or type(cls) is not type:
        return None
    if any("__init_subclass__" in vars(k) for k in cls.__mro__ if k is not object):
        return None
    for k in cls.__mro__:
        rules = OP_BASES.get(f"{k.__module__}.{k.__qualname__}")
        if rules is not None:
            return rules
    return None


def declared_hook_params(base_path: str, hook: str) -> tuple[str, ...] | None:
    """The parameter names quack's own ``base.hook`` declares (the pin of :data:`OP_BASES`)."""
    fn = getattr(surface.library_object(base_path), hook, None)
    if fn is None:
        return None
    return tuple(inspect.signature(inspect.unwrap(fn)).parameters)


def allowed_bases() -> str:
    """The op bases, named for a message."""
    return ", ".join(sorted(p.rsplit(".", 1)[1] for p in OP_BASES)) + " (or a quack subclass of one: HeadRstd, MaxLog2)"

"""The static stage's driver: the facts of the module first, then every rule over them.

Whole-module rules run in :data:`MODULE_RULES` order; the per-node rules are looked up by
node type in :data:`NODE_RULES` during one walk of the tree. Findings are deduplicated and
sorted by line, so the order rules run in does not show in the result.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable
from typing import Any

from ..spec import KernelSpec
from ..verdict import Finding, StageResult
from . import (
    rules_bindings,
    rules_calls,
    rules_classes,
    rules_epilogue,
    rules_imports,
    rules_module,
    rules_state,
    rules_values,
)
from .facts import ModuleFacts
from .lists import TRY_STAR

NodeRule = Callable[[ModuleFacts, Any], None]  # its node: an instance of its NODE_RULES key

NODE_RULES: dict[type[ast.AST], tuple[NodeRule, ...]] = {
    ast.Try: (rules_module.try_except,),
    **{t: (rules_module.try_except,) for t in TRY_STAR},
    ast.With: (rules_module.with_statement,),
    ast.AsyncWith: (rules_module.with_statement,),
    ast.ClassDef: (rules_classes.op_class,),
    ast.Global: (rules_module.global_nonlocal,),
    ast.Nonlocal: (rules_module.global_nonlocal,),
    ast.AsyncFunctionDef: (rules_module.async_code, rules_module.string_annotations),
    ast.Await: (rules_module.async_code,),
    ast.AsyncFor: (rules_module.async_code,),
    ast.Match: (rules_module.match_statement,),
    ast.Yield: (rules_module.generator,),
    ast.YieldFrom: (rules_module.generator,),
    ast.FunctionDef: (rules_module.string_annotations, rules_module.mutable_defaults),
    ast.Lambda: (rules_module.mutable_defaults,),
    ast.AnnAssign: (rules_module.string_annotations,),
    ast.arg: (rules_module.string_annotations,),
    ast.Constant: (rules_values.string_constant,),
    ast.Name: (rules_values.check_name, rules_values.check_value_use),
    ast.Attribute: (
        rules_values.check_attribute,
        rules_values.check_value_attribute,
        rules_values.check_value_use,
        rules_values.method_references,
        rules_state.attribute_write,
    ),
    ast.Compare: (rules_values.identity_compare,),
    ast.JoinedStr: (rules_values.formatting,),
    ast.Set: (rules_values.formatting,),
    ast.SetComp: (rules_values.formatting,),
    ast.BinOp: (rules_calls.matmul_operator, rules_values.formatting),
    ast.AugAssign: (rules_calls.matmul_operator, rules_state.augmented_assignment),
    ast.Subscript: (rules_state.subscript_store,),
    ast.Call: (
        rules_calls.library_call_arguments,
        rules_calls.check_call,
        rules_state.container_mutation,
        rules_values.str_format,
    ),
}
"""Node type -> the rules judging every node of that type (each rule checks its own conditions)."""


def node_rules(m: ModuleFacts) -> None:
    """One walk of the tree, each node judged by the rules of its type (:data:`NODE_RULES`)."""
    for node in ast.walk(m.tree):
        for rule in NODE_RULES.get(type(node), ()):
            rule(m, node)


MODULE_RULES: tuple[Callable[[ModuleFacts], None], ...] = (
    rules_imports.imports,
    rules_module.module_statements,
    rules_module.import_time_calls,
    node_rules,
    rules_state.functions_state,
    rules_epilogue.epilogue_contract,  # fills m.epilogues, which entry_point reads
    rules_epilogue.entry_point,
    rules_classes.op_class_uses,
    rules_bindings.reserved_names,
    rules_bindings.bindings,
)
"""The whole-module rules, in order."""


def run_rules(m: ModuleFacts) -> None:
    """Every rule over the module's facts; the findings collect in ``m.findings``."""
    for rule in MODULE_RULES:
        rule(m)


def _dedupe_sort(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple] = set()
    out = []
    for f in findings:
        key = (f.kind, f.line, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return sorted(out, key=lambda f: (f.line if f.line is not None else 10**9, f.kind, f.message))


def check_static(spec: KernelSpec, source: str, filename: str = "candidate.py") -> StageResult:
    """Check a candidate module's source against the candidate contract, without importing it.

    Args:
        spec: the kernel spec (entry name, input names, ``entry.allowed_torch``).
        source: the candidate module's text.
        filename: used in the syntax-error message only.

    Returns:
        A ``StageResult`` with ``stage="static"``: ``status="pass"`` and summary ``"ok"``
        when nothing was found, else ``status="fail"``, summary ``"N violation(s)"`` and one
        :class:`Finding` per violation (``kind`` from :data:`~coda_agent.verifier.static.kinds.KINDS`, 1-based ``line``),
        sorted by line. ``metrics`` holds ``violations`` and ``epilogues`` (decorated fn
        names in source order).

    Raises:
        Nothing for bad candidates (a syntax error is a finding); only programming errors.
    """
    t0 = time.perf_counter()

    def rejected(finding: Finding) -> StageResult:
        return StageResult(
            stage="static",
            status="fail",
            summary="1 violation(s)",
            findings=[finding],
            metrics={"violations": 1, "epilogues": []},
            duration_s=time.perf_counter() - t0,
        )

    try:
        tree = ast.parse(source, filename=filename)
        facts = ModuleFacts(spec, tree)
        run_rules(facts)
    except SyntaxError as e:
        line = e.lineno
        msg = f"{filename}:{line}: syntax error: {e.msg}" if line else f"{filename}: syntax error: {e.msg}"
        if e.text:
            msg += f" (near `{e.text.strip()[:80]}`)"
        return rejected(Finding(kind="syntax-error", message=msg, line=line))
    except (RecursionError, MemoryError) as e:
        # a chain of ~3000 `+` terms, unary minus signs or attribute accesses parses into a
        # tree deeper than the parser's (or the checker's) recursion limit: the candidate's
        # fault, not a verifier error
        return rejected(
            Finding(
                kind="syntax-error",
                message=f"{filename}: the module is nested too deeply to "
                f"parse and check ({type(e).__name__}); split long expressions into statements",
            )
        )
    findings = _dedupe_sort(facts.findings)
    n = len(findings)
    return StageResult(
        stage="static",
        status="fail" if n else "pass",
        summary=f"{n} violation(s)" if n else "ok",
        findings=findings,
        metrics={"violations": n, "epilogues": [ep.fn.name for ep in facts.epilogues]},
        duration_s=time.perf_counter() - t0,
    )

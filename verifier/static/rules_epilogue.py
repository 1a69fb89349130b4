"""Rules on the ``@gemm_epilogue`` contract, where quack is silent, and on the entry point.

quack ignores a returned key that is not declared (a typo such as ``"Dd"`` silently stores
the raw accumulator) and fails with a bare ``KeyError`` deep in its tracer when a declared
output/reduce is not returned, so the declarations must be literals and every return of a
decorated fn a dict literal with exactly those keys (plus ``"D"``). The entry must be
defined once, with the spec's signature, and must reach an epilogue.
"""

from __future__ import annotations

import ast
import difflib

from .facts import Epilogue, ModuleFacts, bound_names, literal_name, own_nodes, snippet
from .lists import EPILOGUE_MODES


def epilogue_contract(m: ModuleFacts) -> None:
    decorator_calls: set[int] = set()
    for node in ast.walk(m.tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and m.is_gemm_epilogue(dec.func):
                decorator_calls.add(id(dec))
                if node not in m.tree.body:
                    m.add(
                        "epilogue-decorator",
                        node,
                        f"@gemm_epilogue fn `{node.name}` must be defined at module level (no factories)",
                    )
                m.epilogues.append(read_declarations(m, node, dec))
            elif m.is_gemm_epilogue(dec):
                m.add(
                    "epilogue-decorator",
                    dec,
                    "write `@gemm_epilogue(...)` with parentheses (it is a decorator factory)",
                )
    for node in ast.walk(m.tree):
        if isinstance(node, ast.Call) and m.is_gemm_epilogue(node.func) and id(node) not in decorator_calls:
            m.add(
                "epilogue-decorator",
                node,
                "apply gemm_epilogue(...) as a decorator on a module-level def, so its return "
                "keys can be checked against its declarations",
            )
    if not m.epilogues:
        m.add(
            "no-epilogue",
            None,
            "no @gemm_epilogue(...) function is defined: the fused op must be written as a quack epilogue",
        )
    for ep in m.epilogues:
        check_epilogue_fn(m, ep)
    prepass_fns(m)


def read_declarations(m: ModuleFacts, fn: ast.FunctionDef, dec: ast.Call) -> Epilogue:
    ep = Epilogue(fn=fn)
    kw = {k.arg: k.value for k in dec.keywords if k.arg}
    if any(k.arg is None for k in dec.keywords):
        m.add("non-literal-declaration", dec, "`**kwargs` in @gemm_epilogue(...): write the declarations out literally")
        ep.literal = False
    if dec.args:
        kw.setdefault("outputs", dec.args[0])
        if len(dec.args) > 1:
            m.add(
                "non-literal-declaration",
                dec,
                "pass @gemm_epilogue arguments beyond outputs by keyword (outputs=, reduces=, mode=, ...)",
            )
    if "outputs" in kw:
        names = names_from_sequence(m, kw["outputs"], "outputs")
        if names is None:
            ep.literal = False
        else:
            ep.outputs = names
    for key in ("reduces", "outs"):
        if key in kw:
            names = names_from_dict(m, kw[key], key)
            if names is None:
                ep.literal = False
            else:
                ep.sinks += names
    if ("prepass" in kw) != ("prepass_outs" in kw):
        m.add(
            "prepass-fn",
            dec,
            "prepass= and prepass_outs= come together: prepass=<module-level def>, "
            'prepass_outs=("name", ...) naming the ops its returned dict feeds',
        )
    elif "prepass_outs" in kw:
        ep.prepass_outs = names_from_sequence(m, kw["prepass_outs"], "prepass_outs")
    if "mode" in kw:
        mode = kw["mode"]
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and mode.value not in EPILOGUE_MODES:
            m.add("unknown-epilogue-mode", mode, f"mode= must be one of {list(EPILOGUE_MODES)}, got `{snippet(mode)}`")
        elif not (isinstance(mode, ast.Constant) and (mode.value is None or mode.value in EPILOGUE_MODES)):
            m.add(
                "non-literal-declaration",
                mode,
                f"mode= must be one of {list(EPILOGUE_MODES)} written as a string literal, got `{snippet(mode)}`",
            )
    return ep


def names_from_sequence(m: ModuleFacts, node: ast.AST, what: str) -> list[str] | None:
    if not isinstance(node, (ast.Tuple, ast.List)):
        m.add(
            "non-literal-declaration",
            node,
            f'{what}= must be a literal tuple/list of names (or TileStore("name", ...)), got `{snippet(node)}`',
        )
        return None
    out: list[str] = []
    for e in node.elts:
        name = literal_name(e)
        if name is None:
            m.add(
                "non-literal-declaration",
                e,
                f'{what}= entries must be string literals or TileStore("name", ...), got `{snippet(e)}`',
            )
            return None
        out.append(name)
    return out


def names_from_dict(m: ModuleFacts, node: ast.AST, what: str) -> list[str] | None:
    if not isinstance(node, ast.Dict):
        m.add(
            "non-literal-declaration",
            node,
            f'{what}= must be a literal dict {{"name": Op("name", ...)}}, got `{snippet(node)}`',
        )
        return None
    out: list[str] = []
    for k, v in zip(node.keys, node.values, strict=False):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            m.add("non-literal-declaration", k or node, f"{what}= keys must be string literals")
            return None
        op_name = literal_name(v)
        if op_name is not None and op_name != k.value:
            m.add(
                "declared-name-mismatch",
                v,
                f"{what}={{{k.value!r}: ...}} names its op {op_name!r}; quack requires the key and the op name to match",
            )
        out.append(k.value)
    return out


def prepass_fns(m: ModuleFacts) -> None:
    """``prepass-fn``: ``prepass=`` names a module-level, undecorated def of this module,
    bound once (no lambda, closure, factory product, library function or epilogue mod), and
    that def is named nowhere else: quack calls it per accumulator element on DSL values;
    called from host code it would compute on tensors. Its body is an epilogue body
    (:meth:`ModuleFacts.in_epilogue_fn`) and returns exactly its ``prepass_outs``."""
    defs = {n.name: n for n in m.tree.body if isinstance(n, ast.FunctionDef)}
    counts: dict[str, int] = {}
    for n in m.tree.body:
        for b in bound_names(n):
            counts[b] = counts.get(b, 0) + 1
    fix = "prepass= names a module-level def of this module with no decorator, `def stats(acc, ...)`"
    for k in m.prepass_keywords:
        v = k.value
        fn = defs.get(v.id) if isinstance(v, ast.Name) else None
        if fn is None or fn.name in m.epilogue_names or counts.get(fn.name, 0) > 1:
            m.add(
                "prepass-fn",
                v,
                f"prepass={snippet(v)[:40]}: {fix}, bound once (no lambda, nested def, library function "
                "or epilogue mod)",
            )
    for name in sorted(m.prepass_names & set(defs)):
        fn = defs[name]
        if fn.decorator_list:
            m.add("prepass-fn", fn, f"prepass fn `{name}` is decorated: {fix}")
    keyword_values = {id(k.value) for k in m.prepass_keywords}
    for n in ast.walk(m.tree):
        if isinstance(n, ast.Name) and n.id in m.prepass_names and id(n) not in keyword_values:
            if isinstance(n.ctx, ast.Load):
                m.add(
                    "prepass-fn",
                    n,
                    f"prepass fn `{n.id}` is named outside prepass= (`{snippet(m.parents.get(n) or n)[:60]}`): "
                    "quack calls it on the accumulator; name it only in @gemm_epilogue(prepass=...)",
                )
    for ep in m.epilogues:
        dec = next(d for d in ep.fn.decorator_list if isinstance(d, ast.Call) and m.is_gemm_epilogue(d.func))
        k = next((k for k in dec.keywords if k.arg == "prepass"), None)
        if k is None or not isinstance(k.value, ast.Name) or k.value.id not in defs:
            continue
        check_fn_body(m, defs[k.value.id], ep.prepass_outs or [], ep.prepass_outs is not None, "prepass fn", False)


def check_epilogue_fn(m: ModuleFacts, ep: Epilogue) -> None:
    declared = list(dict.fromkeys([*ep.outputs, *ep.sinks]))
    check_fn_body(m, ep.fn, declared, ep.literal, "epilogue fn", True)


def check_fn_body(
    m: ModuleFacts, fn: ast.FunctionDef, declared: list[str], literal: bool, what: str, allow_d: bool
) -> None:
    """An epilogue or prepass fn: ``acc`` first, operands by name, and every return a dict
    literal whose keys are exactly the ``declared`` names (plus ``"D"`` where ``allow_d``)."""
    a = fn.args
    params = [p.arg for p in [*a.posonlyargs, *a.args]]
    if not params or params[0] != "acc":
        m.add(
            "epilogue-signature",
            fn,
            f"{what} `{fn.name}` must take `acc` as its first parameter (got {params or 'none'})",
        )
    if a.vararg or a.kwarg or a.kwonlyargs:
        m.add(
            "epilogue-signature",
            fn,
            f"{what} `{fn.name}`: operands are named parameters only (no *args, **kwargs or keyword-only)",
        )
    returns = [n for n in own_nodes(fn) if isinstance(n, ast.Return)]
    example = '{"D": ...}' if allow_d else '{"<prepass_outs name>": ...}'
    if not returns:
        m.add(
            "epilogue-return",
            fn,
            f"{what} `{fn.name}` never returns: it must return a dict literal such as {example}",
        )
        return
    allowed = {"D", *declared} if allow_d else set(declared)
    not_declared = 'neither "D" nor a declared output/reduce' if allow_d else "not one of its prepass_outs"
    stored = " and stores the raw accumulator instead" if allow_d else ""
    for r in returns:
        if not isinstance(r.value, ast.Dict):
            m.add(
                "epilogue-return",
                r,
                f"{what} `{fn.name}` must return a dict literal with string keys (got `{snippet(r.value) if r.value else 'None'}`)",
            )
            continue
        keys: list[str] = []
        key_nodes: list[ast.AST] = []
        ok = True
        for k in r.value.keys:
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                m.add(
                    "epilogue-return",
                    k or r,
                    f"{what} `{fn.name}`: returned dict keys must be string literals (no ** or computed keys)",
                )
                ok = False
                continue
            if k.value in keys:
                m.add(
                    "duplicate-return-key",
                    k,
                    f"key {k.value!r} appears twice in the returned dict; the first value is silently dropped",
                )
            keys.append(k.value)
            key_nodes.append(k)
        if not literal:
            continue
        for k, knode in zip(keys, key_nodes, strict=False):
            if k not in allowed:
                close = difflib.get_close_matches(k, sorted(allowed), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                m.add(
                    "unknown-return-key",
                    knode,
                    f"{what} `{fn.name}` returns key {k!r}, which is {not_declared} "
                    f"({sorted(declared) or 'none declared'}). quack silently ignores unknown "
                    f"keys{stored}.{hint}",
                )
        if ok:
            for d in declared:
                if d not in keys:
                    m.add(
                        "missing-declared-key",
                        r,
                        f"{what} `{fn.name}` declares {d!r} but this return does not produce it; quack "
                        f"fails with a bare KeyError({d!r}) while tracing. Return {{..., {d!r}: <value>}} or drop the declaration.",
                    )


def entry_point(m: ModuleFacts) -> None:
    want = m.spec.entry.function
    inputs = [t.name for t in m.spec.entry.inputs]
    defs = [n for n in m.tree.body if isinstance(n, ast.FunctionDef) and n.name == want]
    rebinds = [
        n
        for n in m.tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Import, ast.ImportFrom))
        and want in bound_names(n)
    ]
    if not defs:
        m.add(
            "entry-missing",
            None,
            f"no module-level `def {want}({', '.join(inputs)})`: the entry point the spec names is missing",
        )
        return
    for extra in defs[1:] + rebinds:
        m.add(
            "name-redefined", extra, f"`{want}` is bound more than once at module level; define the entry exactly once"
        )
    fn = defs[0]
    a = fn.args
    got = [p.arg for p in [*a.posonlyargs, *a.args]]
    problems = []
    if got != inputs:
        problems.append(f"positional parameters {got} must be exactly the spec inputs {inputs} in order")
    if a.vararg or a.kwarg:
        problems.append("no *args/**kwargs")
    kwonly = [k.arg for k in a.kwonlyargs]
    if sorted(kwonly) != sorted(m.spec.entry.constants):
        problems.append(
            f"keyword-only parameters {kwonly} must be exactly the spec constants {list(m.spec.entry.constants)}"
        )
    if problems:
        m.add(
            "entry-signature",
            fn,
            f"entry `def {want}(...)`: " + "; ".join(problems) + f" (expected `{m.spec.signature()}`)",
        )
    entry_uses_epilogue(m, fn)
    names = {ep.fn.name for ep in m.epilogues}
    counts: dict[str, int] = {}
    for n in m.tree.body:
        for b in bound_names(n):
            counts[b] = counts.get(b, 0) + 1
    for name in sorted(names):
        if counts.get(name, 0) > 1:
            m.add(
                "name-redefined",
                None,
                f"epilogue `{name}` is bound more than once at module level; the last binding wins",
            )


def entry_uses_epilogue(m: ModuleFacts, entry: ast.FunctionDef) -> None:
    """``no-epilogue-call``: neither the entry nor a module-level function it calls (by
    name, transitively) names one of the module's ``@gemm_epilogue`` fns or a quack
    library epilogue (``quack.epilogue.*_epi``). Such an entry computes the op some
    other way: the epilogue is dead code that only passes the static contract. A
    necessary condition, not a proof: a branch can still skip the epilogue at some
    shapes, which the launch count at every benchmark shape catches on the GPU."""
    epis = {ep.fn.name for ep in m.epilogues}
    defs = {n.name: n for n in m.tree.body if isinstance(n, ast.FunctionDef)}
    seen, todo = {entry.name}, [entry]
    while todo:
        for node in ast.walk(todo.pop()):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in epis:
                    return
                if node.id in defs and node.id not in seen:
                    seen.add(node.id)
                    todo.append(defs[node.id])
            q = m.qualname(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if q and q.startswith("quack.epilogue.") and q.endswith("_epi"):
                return
    m.add(
        "no-epilogue-call",
        entry,
        f"the entry `{entry.name}` never uses an epilogue: neither it nor a "
        "function it calls names a @gemm_epilogue fn of this module (or a quack library epilogue); "
        "the fused op must run through the epilogue",
    )

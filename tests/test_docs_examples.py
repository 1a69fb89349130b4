"""Every marked python example in ``primitives_docs/*.md`` must parse, obey the candidate
contract and compile for sm_90a.

The docs are the only quack reference the model sees, so an example that does not compile
teaches it a bug. Each compilable block is a complete candidate-shaped module whose first
line is a marker comment::

    ```python
    # example: <id> entry=<fn> args=<name>:<dtype>[<d0>,<d1>,...];<name>:<dtype>[...] [allowed=<t1>,<t2>]
    ...
    ```

Grammar (one line, tokens separated by whitespace, ``key=value`` tokens in any order):

* ``<id>``: ``[a-z0-9_]+``, unique across all doc files (the pytest parameter id);
* ``entry=<fn>``: the module-level function the test calls (the candidate's entry point);
* ``args=``: the entry's positional arguments in order, ``;``-separated, each
  ``<name>:<dtype>[<dims>]`` with a torch dtype name (``bfloat16``, ``float16``,
  ``float32``, ``int32``, ``int64``) and positive integer dims, comma-separated (no
  spaces). Each becomes a CPU ``torch.empty(dims, dtype=torch.<dtype>)``;
* ``allowed=`` (optional): comma-separated torch names the example's host code calls
  beyond allocation and views -- the ``entry.allowed_torch`` of the minimal spec the
  static check is run against.

Blocks fenced ```python without the marker are illustrative fragments and are not
compiled (keep them few and short).

Checks:

* ``test_markers_parse`` (no GPU, no quack): every doc file has at least one marked
  example, markers parse, ids are unique, and no example leaks a solution of a shipped
  spec (its entry name, or quack's swiglu/dswiglu helpers).
* ``test_example_static``: ``coda_agent.verifier.static.check_static`` passes for every
  example against a minimal KernelSpec built from the marker (entry name, args as inputs,
  the entry's returned names as outputs); skipped when the static stage is absent.
* ``test_example_compiles`` (marked ``compile``): the example is compiled for sm_90a on
  the CPU with ``coda_agent.verifier.compile.stage.compile_cpu`` when it exists, else with the
  same recipe run here in a subprocess (QUACK_ARCH=sm_90, CUTE_DSL_ARCH=sm_90a,
  ``get_max_active_clusters`` stubbed, ``run_gemm_epi_plan`` replaced by a counter). Every
  call of the entry must launch exactly one (suppressed) kernel.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "primitives_docs"

DTYPES = ("bfloat16", "float16", "float32", "int32", "int64")
FENCE_RE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MARKER_RE = re.compile(r"^# example: (?P<id>[a-z0-9_]+)(?P<rest>(?:[ \t]+\S+)+)[ \t]*$")
ARG_RE = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*):(?P<dtype>[a-z0-9]+)\[(?P<dims>\d+(?:,\d+)*)\]$")
LEAK_PATTERNS = ("swiglu(", "dswiglu", "swiglu_mod", "silu(")


class MarkerError(ValueError):
    """A marker line that does not follow the grammar in the module docstring."""


@dataclass(frozen=True)
class Example:
    id: str
    entry: str
    args: tuple[tuple[str, tuple[int, ...], str], ...]
    allowed: tuple[str, ...]
    source: str
    doc: str
    line: int


def parse_marker(line: str) -> tuple[str, str, list[tuple[str, tuple[int, ...], str]], list[str]]:
    """Parse one marker line into (id, entry, args, allowed); raise MarkerError on any defect."""
    m = MARKER_RE.match(line.rstrip())
    if not m:
        raise MarkerError(f"not a marker line: {line!r}")
    fields: dict[str, str] = {}
    for tok in m.group("rest").split():
        key, sep, value = tok.partition("=")
        if not sep or not value:
            raise MarkerError(f"token {tok!r} is not key=value")
        if key not in ("entry", "args", "allowed"):
            raise MarkerError(f"unknown key {key!r} (expected entry=, args=, allowed=)")
        if key in fields:
            raise MarkerError(f"key {key!r} given twice")
        fields[key] = value
    for key in ("entry", "args"):
        if key not in fields:
            raise MarkerError(f"missing {key}=")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", fields["entry"]):
        raise MarkerError(f"entry={fields['entry']!r} is not a python identifier")
    args = []
    for a in fields["args"].split(";"):
        am = ARG_RE.match(a)
        if not am:
            raise MarkerError(f"argument {a!r} is not <name>:<dtype>[<d0>,<d1>,...]")
        if am.group("dtype") not in DTYPES:
            raise MarkerError(f"argument {a!r}: dtype must be one of {DTYPES}")
        dims = tuple(int(d) for d in am.group("dims").split(","))
        if any(d <= 0 for d in dims):
            raise MarkerError(f"argument {a!r}: dims must be positive")
        args.append((am.group("name"), dims, am.group("dtype")))
    names = [a[0] for a in args]
    if len(set(names)) != len(names):
        raise MarkerError(f"duplicate argument names in {names}")
    allowed = [t for t in fields.get("allowed", "").split(",") if t]
    return m.group("id"), fields["entry"], args, allowed


def collect_examples() -> tuple[list[Example], dict[str, int]]:
    """All marked examples of primitives_docs/*.md, plus the count of marked blocks per doc."""
    examples: list[Example] = []
    per_doc: dict[str, int] = {}
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        per_doc[doc.name] = 0
        for fm in FENCE_RE.finditer(text):
            body = fm.group(1)
            first = body.split("\n", 1)[0]
            if not first.startswith("# example:"):
                continue
            line = text.count("\n", 0, fm.start()) + 2
            try:
                ex_id, entry, args, allowed = parse_marker(first)
            except MarkerError as e:
                raise MarkerError(f"{doc.name}:{line}: {e}") from None
            examples.append(Example(ex_id, entry, tuple(args), tuple(allowed), body, doc.name, line))
            per_doc[doc.name] += 1
    return examples, per_doc


def _safe_collect() -> list[Example]:
    try:
        return collect_examples()[0]
    except (MarkerError, OSError):
        return []  # test_markers_parse reports the problem


EXAMPLES = _safe_collect()
IDS = [e.id for e in EXAMPLES]


def _returned_names(ex: Example) -> list[str]:
    """Names of the values the entry returns (outputs of the minimal spec)."""
    tree = ast.parse(ex.source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ex.entry)
    rets = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    value = rets[-1].value
    elts = value.elts if isinstance(value, ast.Tuple) else [value]
    inputs = {a[0] for a in ex.args}
    names = []
    for i, e in enumerate(elts):
        n = e.id if isinstance(e, ast.Name) and e.id not in inputs else f"out{i}"
        names.append(n if n not in names else f"out{i}")
    return names


def minimal_spec(ex: Example):
    """A KernelSpec carrying just what the static stage reads: entry, inputs, allowed_torch."""
    from coda_agent.verifier.spec import KernelSpec

    return KernelSpec.model_validate(
        {
            "name": ex.id,
            "description": f"documentation example {ex.id} from primitives_docs/{ex.doc}",
            "pattern": "forward",
            "math": "see the documentation text around the example",
            "entry": {
                "function": ex.entry,
                "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in ex.args],
                "outputs": [{"name": o, "shape": [1], "dtype": "float32"} for o in _returned_names(ex)],
                "allowed_torch": list(ex.allowed),
            },
            "shapes": {"correctness": [{"name": "ragged", "dims": {"M": 333}}]},
            "bench": {"flops": "1"},
        }
    )


# --------------------------------------------------------------------------- no-quack checks


def test_markers_parse():
    examples, per_doc = collect_examples()
    assert per_doc, f"no doc files under {DOCS}"
    empty = [d for d, n in per_doc.items() if n == 0]
    assert not empty, f"doc files without a marked example: {empty}"
    ids = [e.id for e in examples]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"duplicate example ids: {dup}"
    spec_entries = set()
    for toml in (ROOT / "kernel_specs").glob("*/spec.toml"):
        spec_entries |= set(re.findall(r'^function\s*=\s*"([a-z_0-9]+)"', toml.read_text(), re.MULTILINE))
    for e in examples:
        ast.parse(e.source, filename=f"{e.doc}:{e.id}")
        assert e.entry not in spec_entries, f"{e.doc}:{e.line}: example {e.id} is the entry of a shipped spec"
        leaks = [p for p in LEAK_PATTERNS if p in e.source]
        assert not leaks, f"{e.doc}:{e.line}: example {e.id} uses {leaks} (a shipped spec's solution)"
        defs = {n.name for n in ast.parse(e.source).body if isinstance(n, ast.FunctionDef)}
        assert e.entry in defs, f"{e.doc}:{e.line}: entry {e.entry!r} is not defined in example {e.id}"


def test_marker_grammar_rejects_defects():
    ok = "# example: a_1 entry=f args=x:bfloat16[2,8];t:int64[2] allowed=sum,rsqrt"
    assert parse_marker(ok) == ("a_1", "f", [("x", (2, 8), "bfloat16"), ("t", (2,), "int64")], ["sum", "rsqrt"])
    for bad in (
        "# example: a entry=f",  # no args
        "# example: a args=x:bfloat16[2]",  # no entry
        "# example: a entry=f args=x:bf16[2]",  # dtype
        "# example: a entry=f args=x:bfloat16[2, 3]",  # space in dims
        "# example: a entry=f args=x:bfloat16[0]",  # non-positive
        "# example: a entry=f args=x:bfloat16[2];x:bfloat16[2]",  # duplicate
        "# example: A entry=f args=x:bfloat16[2]",  # id case
        "# example: a entry=f args=x:bfloat16[2] tile=3",  # unknown key
    ):
        with pytest.raises(MarkerError):
            parse_marker(bad)


@pytest.mark.parametrize("ex", EXAMPLES, ids=IDS)
def test_example_static(ex: Example):
    try:
        from coda_agent.verifier.static import check_static
    except ImportError:
        pytest.skip("coda_agent.verifier.static is not available")
    res = check_static(minimal_spec(ex), ex.source, filename=f"{ex.id}.py")
    detail = "\n".join(f"  line {f.line}: [{f.kind}] {f.message}" for f in res.findings)
    assert res.status == "pass", f"{ex.doc}:{ex.line}: example {ex.id} breaks the candidate contract:\n{detail}"


# --------------------------------------------------------------------------- compile

_RUNNER = textwrap.dedent(
    """
    import importlib.util, json, os, sys, traceback
    os.environ.setdefault("QUACK_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    req = json.loads(open(sys.argv[1]).read())
    out = {"ok": False, "kernel_calls": 0}
    try:
        import torch
        import quack.gemm_runtime.host as host
        import quack.epilogue.frontend as fe
        host.get_max_active_clusters = lambda cluster_size: 132 // cluster_size
        def _count(*a, **k):
            out["kernel_calls"] += 1
        fe.run_gemm_epi_plan = _count
        spec = importlib.util.spec_from_file_location("docs_example", req["path"])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        args = [torch.empty(s, dtype=getattr(torch, d)) for _, s, d in req["args"]]
        res = getattr(mod, req["entry"])(*args)
        items = res if isinstance(res, tuple) else (res,)
        out["outputs"] = [type(t).__name__ for t in items]
        out["ok"] = all(isinstance(t, torch.Tensor) for t in items)
        if not out["ok"]:
            out["error"] = "the entry returned non-tensors: " + ", ".join(out["outputs"])
    except BaseException:
        out["error"] = traceback.format_exc()[-4000:]
    open(sys.argv[2], "w").write(json.dumps(out))
    """
)


def _compile_fallback(path: Path, ex: Example, tmp: Path) -> tuple[bool, str, int]:
    req, res = tmp / "request.json", tmp / "result.json"
    req.write_text(json.dumps({"path": str(path), "entry": ex.entry, "args": [list(a) for a in ex.args]}))
    runner = tmp / "runner.py"
    runner.write_text(_RUNNER)
    env = dict(
        os.environ,
        QUACK_ARCH="sm_90",
        CUTE_DSL_ARCH="sm_90a",
        CUDA_VISIBLE_DEVICES="",
        QUACK_CACHE_DIR=str(tmp / "quack_cache"),
        CUTE_DSL_CACHE_DIR=str(tmp / "cute_cache"),
    )
    proc = subprocess.run(
        [sys.executable, str(runner), str(req), str(res)], cwd=tmp, env=env, capture_output=True, text=True, timeout=300
    )
    if not res.is_file():
        return False, f"runner died (rc {proc.returncode}):\n{proc.stderr[-3000:]}", 0
    out = json.loads(res.read_text())
    return out["ok"], out.get("error", ""), out["kernel_calls"]


@pytest.mark.compile
@pytest.mark.parametrize("ex", EXAMPLES, ids=IDS)
def test_example_compiles(ex: Example, tmp_path: Path):
    path = tmp_path / f"{ex.id}.py"
    path.write_text(ex.source)
    try:
        from coda_agent.verifier.compile.stage import compile_cpu
    except ImportError:
        compile_cpu = None
    where = f"{ex.doc}:{ex.line}: example {ex.id}"
    if compile_cpu is not None:
        res = compile_cpu(path, ex.entry, [(n, tuple(s), d) for n, s, d in ex.args], timeout_s=300)
        detail = "\n".join(f"  line {f.line}: [{f.kind}] {f.message}" for f in res.findings)
        assert res.status == "pass", f"{where} does not compile: {res.summary}\n{detail}"
        calls = res.metrics.get("kernel_calls")
        outputs = (res.metrics.get("outputs") or {}).get("call") or {}
        items = outputs.get("items", []) if isinstance(outputs, dict) else []
        assert all(i.get("is_tensor") for i in items), f"{where} returned non-tensors: {outputs}"
    else:
        ok, err, calls = _compile_fallback(path, ex, tmp_path)
        assert ok, f"{where} does not compile:\n{err}"
    assert calls == 1, f"{where}: one call of the entry launched {calls} kernels (expected exactly 1)"


def _gpu_args(ex: Example):
    """Random CUDA inputs for an example: normal values, weights scaled by 1/sqrt(fan-in),
    integer args (class indices) drawn below the smallest other dim."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    dims = [d for _, shape, dt in ex.args if not dt.startswith("int") for d in shape]
    out = []
    for _, shape, dt in ex.args:
        if dt.startswith("int"):
            hi = min(dims) if dims else 2
            out.append(torch.randint(0, hi, shape, generator=g, device="cuda", dtype=getattr(torch, dt)))
        else:
            t = torch.randn(shape, generator=g, device="cuda")
            if len(shape) == 2:
                t = t / shape[-1] ** 0.5 if shape[-1] >= 256 else t
            out.append(t.to(getattr(torch, dt)))
    return out


@pytest.mark.gpu
def test_examples_run_on_hopper(tmp_path: Path):
    """Run every doc example once on the GPU: it launches, returns finite, non-constant
    tensors. (Numerics of the docs' toy ops are not checked against a reference here.)"""
    import importlib.util

    import torch

    failures = []
    for ex in EXAMPLES:
        path = tmp_path / f"{ex.id}.py"
        path.write_text(ex.source)
        spec = importlib.util.spec_from_file_location(f"doc_example_{ex.id}", path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
            outs = getattr(mod, ex.entry)(*_gpu_args(ex))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 -- report every example, not just the first
            failures.append(f"{ex.id}: {type(e).__name__}: {str(e)[:300]}")
            continue
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            f = o.float()
            if not torch.isfinite(f).all():
                failures.append(f"{ex.id}: output {i} has non-finite values")
            elif f.numel() > 1 and f.std() == 0:
                failures.append(f"{ex.id}: output {i} is constant")
    assert not failures, "\n".join(failures)

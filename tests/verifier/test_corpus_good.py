"""The honest candidates of tests/verifier/corpus_good/ (quack's prepass, grouped statistics,
custom op classes, fp8 stores) through the CPU stages: each passes the static stage and
compiles for sm_90a with one kernel launch per call, returning exactly the tensors its
docstring states (``ENTRY:``, ``ARGS:``, ``OUTPUTS:``; the folder's README). Compiles use a
private cache per candidate: custom op classes are keyed by module and class name in quack's
cache, not by their source (docs/threat-model.md, "Known limits")."""

from __future__ import annotations

import ast
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from verifier_helpers import once_per_run

from coda_agent.verifier.spec import KernelSpec
from coda_agent.verifier.static import check_static

GOOD = Path(__file__).resolve().parent / "corpus_good"
TENSOR_RE = re.compile(r"^(?:(?P<name>[a-z_][a-z0-9_]*):)?(?P<dtype>[a-z0-9_]+)\[(?P<dims>\d+(?:,\d+)*)\]$")


@dataclass(frozen=True)
class Good:
    path: Path
    entry: str
    args: tuple[tuple[str, tuple[int, ...], str], ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]

    @property
    def id(self) -> str:
        return self.path.stem


def _tensors(text: str) -> list[tuple[str | None, tuple[int, ...], str]]:
    out = []
    for t in text.split(";"):
        m = TENSOR_RE.match(t)
        assert m, f"not <name>:<dtype>[dims] or <dtype>[dims]: {t!r}"
        out.append((m.group("name"), tuple(int(d) for d in m.group("dims").split(",")), m.group("dtype")))
    return out


def _parse(path: Path) -> Good:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    fields = {k: re.search(rf"^{k}: (\S+)\s*$", doc, re.M) for k in ("ENTRY", "ARGS", "OUTPUTS")}
    missing = [k for k, v in fields.items() if v is None]
    assert not missing, f"{path.name}: docstring lacks {missing}"
    args = tuple((n or "", s, d) for n, s, d in _tensors(fields["ARGS"].group(1)))  # type: ignore[union-attr]
    outs = tuple((s, d) for _, s, d in _tensors(fields["OUTPUTS"].group(1)))  # type: ignore[union-attr]
    return Good(path, fields["ENTRY"].group(1), args, outs)  # type: ignore[union-attr]


CASES = [_parse(p) for p in sorted(GOOD.glob("*.py"))]


def minimal_spec(g: Good) -> KernelSpec:
    """A KernelSpec carrying what the static stage reads: the entry and its inputs."""
    return KernelSpec.model_validate(
        {
            "name": g.id,
            "description": f"honest candidate {g.id} of tests/verifier/corpus_good",
            "pattern": "forward",
            "math": "see the candidate's docstring",
            "entry": {
                "function": g.entry,
                "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in g.args],
                "outputs": [{"name": f"out{i}", "shape": [1], "dtype": "float32"} for i in range(len(g.outputs))],
            },
            "shapes": {"correctness": [{"name": "ragged", "dims": {"M": 333}}]},
            "bench": {"flops": "1"},
        }
    )


def test_every_mechanism_has_an_honest_candidate():
    text = "\n".join(c.path.read_text() for c in CASES)
    for needle in (
        "prepass=",
        "HeadRstd(",
        "GroupedColStatsOut(",
        "(GroupedColStatsBase):",
        "float8_e4m3fn",
        "float8_e5m2",
    ):
        assert needle in text, f"no honest candidate uses {needle}"
    readme = (GOOD / "README.md").read_text()
    assert all(f"| {c.path.name} |" in readme for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_static_stage_passes(case: Good):
    res = check_static(minimal_spec(case), case.path.read_text(), case.path.name)
    assert res.status == "pass", [(f.kind, f.line, f.message) for f in res.findings]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compile_cpu for every honest candidate, concurrently, each with its private cache."""
    from coda_agent.verifier.compile.stage import compile_cpu

    def compile_all():
        workers = max(2, min(4, os.cpu_count() or 2))
        with ThreadPoolExecutor(workers) as ex:
            futs = {c.id: ex.submit(compile_cpu, c.path, c.entry, list(c.args), 600) for c in CASES}
            return {k: f.result() for k, f in futs.items()}

    return once_per_run(tmp_path_factory, "corpus-good-compiles", compile_all)


@pytest.mark.compile
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_compiles_for_sm90a(case: Good, compiled):
    res = compiled[case.id]
    assert res.status == "pass", [(f.kind, f.line, f.message[:400]) for f in res.findings]
    assert res.metrics["kernel_calls"] == 1 and res.metrics["variants_compiled"] >= 1
    items = res.metrics["outputs"]["call"]["items"]
    got = [(tuple(i["shape"]), i["dtype"]) for i in items]
    assert got == list(case.outputs)
    assert all(i["exact_tensor"] and i["aliases_input"] is None for i in items)


@pytest.fixture(scope="module")
def tripwired(tmp_path_factory):
    """group_norm_proj.py with an `exec` in its op class's hook and, separately, in its
    prepass fn (what the static stage refuses), compiled past the static stage."""
    from coda_agent.verifier.compile.stage import compile_cpu

    def compile_both():
        d = tmp_path_factory.mktemp("tripwire")
        case = next(c for c in CASES if c.id == "group_norm_proj")
        src = case.path.read_text()
        variants = {
            "hook": src.replace(
                "        return total * (1.0 / group_cols)",
                '        exec("0")\n        return total * (1.0 / group_cols)',
            ),
            "prepass": src.replace(
                '    return {"mu": acc, "msq": acc * acc}', '    exec("0")\n    return {"mu": acc, "msq": acc * acc}'
            ),
        }
        out = {}
        with ThreadPoolExecutor(2) as ex:
            futs = {}
            for name, text in variants.items():
                assert text != src
                (d / f"{name}.py").write_text(text)
                futs[name] = ex.submit(compile_cpu, d / f"{name}.py", case.entry, list(case.args), 600)
            for name, f in futs.items():
                out[name] = (
                    f.result(),
                    variants[name].splitlines().index('        exec("0")' if name == "hook" else '    exec("0")') + 1,
                )
        return out

    return once_per_run(tmp_path_factory, "corpus-good-tripwire", compile_both)


@pytest.mark.compile
@pytest.mark.parametrize("where", ["hook", "prepass"])
def test_the_audit_tripwire_covers_hooks_and_prepass_fns(where, tripwired):
    """confine/audit.py under the static stage: a hook or prepass fn runs while quack traces
    the kernel, called from quack's and CuTeDSL's frames, in the candidate's own code object,
    so its `exec` is refused at the candidate's line."""
    res, line = tripwired[where]
    assert res.status == "fail"
    (f,) = res.findings
    assert f.kind == "compile-error" and f.line == line
    assert "CandidateAuditError" in f.message and "audit event" in f.message

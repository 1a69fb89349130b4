"""The numerics corpus (tests/verifier/corpus_numerics/) through the GPU stages on the CPU test device.

Each file is a pure-torch candidate (static and compile are stubbed: verifier_helpers)
whose docstring says what it does and what must catch it::

    SPEC: <spec>
    EXPECT: pass | <stage> <kind> [<rule>]   the first failing stage, the kind of every finding
                                             there, and for kind "tolerance" the numerics rule
                                             every message names ("rule <rule>: ...")
    OUTPUTS: <output> ...                    the outputs with findings
    CAUGHT AT: public | coverage             at the spec's public correctness cases, or only
                                             at the secret coverage cases
    RULES: <rule> ...                        (public) every rule that fails at the public cases

The fp8 files (SPEC: gemm_fp8_quant) are the wrong-kernel corpus of the fp8 rule
(verifier/stages/numerics_fp8.py): codes off the right rounding fail ``fp8-rounding``, a
wrong scale fails the scale's own CODA rules (max-abs included: it is wrong at the
largest values too). A missing saturation cannot show under this spec's dynamic scales
(no value exceeds 448 * scale): tests/verifier/test_numerics_fp8.py judges it with a static
scale. Three kinds of wrong kernel, each of which the single max-abs rule passed:

* wrong within max-abs (small values zeroed, small gradients' sign flipped, a coarse
  grid): the per-element, quantile and sign rules fail at the public cases, max-abs holds;
* wrong only at shapes no spec case lists (ragged last tile at large M, half the rows at
  M outside the listed range, part of K at unlisted K): the secret coverage shapes fail;
* wrong only on inputs a model produces (saturated gates): the secret input draws fail.

Every verification's secret is pinned (``secrets.randbelow`` in the pipeline), so each
test is deterministic; a shape test picks the first secret whose coverage cases
include a shape that triggers the kernel and asserts that exactly those cases fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from verifier_helpers import stub_static_compile

import coda_agent.verifier.gpu.coverage as coverage
import coda_agent.verifier.pipeline as pipeline
from coda_agent.verifier.gpu.coverage import KEY_PREFIX
from coda_agent.verifier.gpu.protocol import Run
from coda_agent.verifier.gpu.runs import make_runs
from coda_agent.verifier.pipeline import verify
from coda_agent.verifier.spec import load_spec

# Every test here runs the candidate and reference workers as subprocesses.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus_numerics"
SPECS = {
    name: load_spec(ROOT / "kernel_specs" / name)
    for name in ("swiglu_fwd", "swiglu_bwd", "gemm_fp8_quant", "gemm_qknorm_rope", "gemm_qknorm_rope_bwd")
}
RULE_NAMES = {
    "nonfinite": "non-finite",
    "max_abs": "max-abs",
    "elementwise": "per-element",
    "quantiles": "error-quantiles",
    "sign": "sign",
    "fp8_rounding": "fp8-rounding",
}
"""The rules' keys in the stage metrics -> their names in finding messages."""
PUBLIC_SECRET = 1
"""The secret of the tests whose kernels the public cases catch (any secret would do)."""


@dataclass(frozen=True)
class Case:
    path: Path
    spec: str
    stage: str  # pass | correctness | gradients
    kind: str | None
    rule: str | None
    outputs: tuple[str, ...]
    caught_at: str | None  # public | coverage
    rules: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.path.stem


def _line(doc: str, key: str) -> str | None:
    m = re.search(rf"^{key}: (.+?)\s*$", doc, re.M)
    return m.group(1) if m else None


def _parse(path: Path) -> Case:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    spec, expect = _line(doc, "SPEC"), _line(doc, "EXPECT")
    assert spec and expect, f"{path.name}: docstring needs SPEC: and EXPECT: lines"
    stage, kind, rule = (expect.split() + [None, None])[:3]
    return Case(
        path,
        spec,
        stage,
        kind,
        rule,
        tuple((_line(doc, "OUTPUTS") or "").split()),
        _line(doc, "CAUGHT AT"),
        tuple((_line(doc, "RULES") or "").split()),
    )


CASES = {c.id: c for c in (_parse(p) for p in sorted(CORPUS.glob("*.py")))}
PUBLIC = [c for c in CASES.values() if c.caught_at == "public"]
HONEST = [c for c in CASES.values() if c.stage == "pass"]

SPEC_M = (256, 16384)
"""The smallest and largest M of swiglu_fwd's correctness and benchmark shapes."""
SPEC_K = (512, 320, 264, 2048, 4096, 8192)
"""Every K of swiglu_fwd's correctness and benchmark shapes."""

SHAPE_TRIGGERS: dict[str, Callable[[dict[str, int]], bool]] = {
    "ragged_tile_dropped": lambda d: d["M"] >= 2048 and d["M"] % 128 != 0,
    "rows_outside_range": lambda d: (d["M"] < SPEC_M[0] or d["M"] > SPEC_M[1]) and d["M"] >= 2,
    "k_skipped": lambda d: d["K"] not in SPEC_K,
}
"""The shapes at which each shape-class kernel is wrong (every case with such dims fails)."""
INPUT_DRAWS = {"saturated_gate": "saturate", "saturated_grad": "saturate"}
"""The input draw that must catch each input-class kernel (any case of another draw may too,
no public case may)."""
BUDGET = {"ragged_tile_dropped": 16 << 20}
"""Coverage tensor budget for a test whose trigger the CPU device's 2 MiB never draws."""

REQUIRED = {
    "small_zeroed_fwd",
    "small_zeroed_bwd",
    "small_sign_flipped",
    "grid_snapped",
    *SHAPE_TRIGGERS,
    *INPUT_DRAWS,
    "honest_swiglu_fwd",
    "honest_swiglu_bwd",
    "honest_fp8_quant",
    "fp8_truncated",
    "fp8_e5m2_grid",
    "fp8_scale_doubled",
    "fp8_amax_group256",
    "honest_qknorm_rope",
    "honest_qknorm_rope_bwd",
}


@pytest.fixture(autouse=True)
def _stub(monkeypatch):
    stub_static_compile(monkeypatch)


def _pin_secret(monkeypatch, secret: int) -> None:
    monkeypatch.setattr(pipeline.secrets, "randbelow", lambda n: secret)


def _verify(case: Case, tmp_path: Path):
    return verify(SPECS[case.spec], case.path, device="cpu", bench=False, workdir=tmp_path / "work", timeout_s=180)


def _explain(v) -> str:
    return "\n".join(
        f"{s.stage} {s.status}: {s.summary}"
        + "".join(f"\n   [{f.kind}] {f.output} @ {f.case}: {f.message[:300]}" for f in s.findings)
        for s in v.stages
    )


def _coverage(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.key.startswith(KEY_PREFIX)]


def _first_secret(spec: str, want: Callable[[Run], bool], limit: int = 200) -> tuple[int, list[Run]]:
    """The first secret >= 1 whose CPU plan has a coverage case with ``want``, and its runs."""
    for secret in range(1, limit + 1):
        runs = make_runs(SPECS[spec].spec, secret, "cpu")
        if any(want(r) for r in _coverage(runs)):
            return secret, runs
    raise AssertionError(f"no secret in 1..{limit} draws a triggering coverage case for {spec}")


def _failed_stage(v, case: Case):
    """The failing stage, checked to be ``case.stage`` with findings of ``case.kind`` only, on
    ``case.outputs`` only, the stages before it passed."""
    st = v.stage(case.stage)
    assert v.failed_stage is not None and v.failed_stage.stage == case.stage, _explain(v)
    assert st.status == "fail", _explain(v)
    names = [s.stage for s in v.stages]
    assert all(s.status == "pass" for s in v.stages[: names.index(case.stage)]), _explain(v)
    assert {f.kind for f in st.findings} == {case.kind}, _explain(v)
    assert {f.output for f in st.findings} == set(case.outputs), _explain(v)
    if case.kind == "tolerance":
        for f in st.findings:
            assert f"{f.output} [" in f.message and f"]: rule {case.rule}: " in f.message, f.message[:300]
    return st


def test_corpus_metadata():
    assert REQUIRED <= set(CASES), f"missing: {sorted(REQUIRED - set(CASES))}"
    for c in CASES.values():
        assert c.spec in SPECS, c.id
        if c.stage == "pass":
            assert c.kind is None and not c.outputs, c.id
            continue
        assert c.stage in ("correctness", "gradients"), c.id
        assert c.kind in ("tolerance", "stale-memory"), c.id
        assert (c.rule in RULE_NAMES.values()) == (c.kind == "tolerance"), c.id
        outs = {o.name: o for o in SPECS[c.spec].spec.entry.outputs}
        assert c.outputs and set(c.outputs) <= set(outs), c.id
        # a gradient output fails in the gradients stage, a value output in correctness
        assert {outs[o].gradient is not None for o in c.outputs} == {c.stage == "gradients"}, c.id
        assert c.caught_at in ("public", "coverage"), c.id
        assert (c.caught_at == "coverage") == (c.id in SHAPE_TRIGGERS or c.id in INPUT_DRAWS), c.id
        assert (c.caught_at == "public") == bool(c.rules) and set(c.rules) <= set(RULE_NAMES), c.id


@pytest.mark.parametrize("case", PUBLIC, ids=lambda c: c.id)
def test_wrong_within_max_abs_fails_the_other_rules_at_the_public_cases(case: Case, tmp_path, monkeypatch):
    _pin_secret(monkeypatch, PUBLIC_SECRET)
    v = _verify(case, tmp_path)
    st = _failed_stage(v, case)
    public = {c.name for c in SPECS[case.spec].spec.shapes.correctness}
    assert public <= {f.case for f in st.findings}, _explain(v)
    # at every public trial: max-abs (the one rule of old) holds, exactly the listed rules fail
    trials = {k: per for k, per in st.metrics["trials"].items() if re.match(r"c\d+-", k)}
    assert len(trials) == len(public) * len(SPECS[case.spec].spec.shapes.seeds)
    for key, per in trials.items():
        for out in case.outputs:
            ratios = {r: float(x) for r, x in per[out]["rules"].items()}
            assert {r for r, x in ratios.items() if x > 1} == set(case.rules), (key, out, ratios)
            if "max_abs" not in case.rules:  # wrong within max-abs (the fp8 rule has none)
                assert ratios.get("max_abs", 0.0) <= 1, (key, out, ratios)


@pytest.mark.parametrize("name", sorted(SHAPE_TRIGGERS))
def test_wrong_at_unlisted_shapes_fails_at_the_secret_shapes(name, tmp_path, monkeypatch):
    case = CASES[name]
    trigger = SHAPE_TRIGGERS[name]
    public_dims = [dict(c.dims) for c in SPECS[case.spec].spec.shapes.correctness]
    assert not any(trigger(d) for d in public_dims)  # no public case can catch it
    if name in BUDGET:
        # at the CPU device's own budget no draw reaches the trigger (M <= 1536 here)
        spec = SPECS[case.spec].spec
        assert not any(trigger(r.dims) for s in range(1, 21) for r in _coverage(make_runs(spec, s, "cpu")))
        monkeypatch.setattr(coverage, "CPU_MEDIUM_BYTES", BUDGET[name])
    secret, runs = _first_secret(case.spec, lambda r: trigger(r.dims))
    hit = {r.case for r in _coverage(runs) if trigger(r.dims)}
    assert hit
    _pin_secret(monkeypatch, secret)
    v = _verify(case, tmp_path)
    st = _failed_stage(v, case)
    # exactly the triggering secret cases fail (the public cases and the recheck pass)
    assert {f.case for f in st.findings} == hit, _explain(v)
    if case.kind == "stale-memory":
        assert all("still hold the NaN poison" in f.message for f in st.findings), _explain(v)
    if name == "ragged_tile_dropped":
        for f in st.findings:
            m = next(r.dims["M"] for r in runs if r.case == f.case)
            assert f"only the ragged edge (rows >= {m // 128 * 128}) wrong" in f.message, f.message


@pytest.mark.parametrize("name", sorted(INPUT_DRAWS))
def test_wrong_on_model_inputs_fails_at_the_secret_draws(name, tmp_path, monkeypatch):
    case = CASES[name]
    draw = INPUT_DRAWS[name]
    secret, runs = _first_secret(case.spec, lambda r: r.draw == draw)
    _pin_secret(monkeypatch, secret)
    v = _verify(case, tmp_path)
    st = _failed_stage(v, case)
    by_case = {r.case: r for r in runs}
    failed = {by_case[f.case].draw for f in st.findings}
    assert draw in failed, _explain(v)
    # only the draws that change input values (N(0, sigma) inputs at any shape pass)
    assert failed <= {"heavy", "outliers", "saturate"}, _explain(v)
    assert all(by_case[f.case].key.startswith(KEY_PREFIX) for f in st.findings), _explain(v)


HONEST_SECRETS = (3, 1_000_003, 987_654_321)


@pytest.mark.parametrize("secret", HONEST_SECRETS)
@pytest.mark.parametrize("case", HONEST, ids=lambda c: c.id)
def test_honest_kernels_pass_every_coverage_case(case: Case, secret, tmp_path, monkeypatch):
    _pin_secret(monkeypatch, secret)
    v = _verify(case, tmp_path)
    assert all(s.status in ("pass", "skip") for s in v.stages), _explain(v)
    spec = SPECS[case.spec].spec
    runs = make_runs(spec, secret, "cpu")
    draws = {r.draw for r in _coverage(runs)}
    assert draws == {"spec", "heavy", "outliers", "saturate", "tiny_rows"}
    judged: dict[str, dict] = {}
    for stage in ("correctness", "gradients"):
        if v.stage(stage).status == "pass":
            for key, per in v.stage(stage).metrics["trials"].items():
                judged.setdefault(key, {}).update(per)
    # every coverage case was judged, on every output
    for r in _coverage(runs):
        assert set(judged[r.key]) == {o.name for o in spec.entry.outputs}, r.case
        for name, m in judged[r.key].items():
            assert m["ok"] and float(m["ratio"]) <= 1 and m["poisoned"] == 0, (r.case, name, m)

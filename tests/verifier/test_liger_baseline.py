"""The optional Liger Kernel baseline (``liger``): kernel_specs/<name>/liger.py adapters, how
the reference worker resolves them, and ``coda-agent bench`` timing them. CPU only: the
adapters' Liger calls need a GPU (and liger-kernel), so here they are only imported and
their signatures checked; the worker is exercised with a torch-only stand-in."""

import inspect
import shutil
import sys
import types
from pathlib import Path

import pytest

from coda_agent.verifier.gpu.protocol import PLAN_FILE, Plan
from coda_agent.verifier.gpu.worker_reference import RefWorker
from coda_agent.verifier.library.bench import bench_baselines, bench_kernels, results_markdown
from coda_agent.verifier.spec import LIGER_FILE, LIGER_MISSING, NO_LIGER, find_specs, load_spec, spec_hash
from coda_agent.verifier.verdict import StageResult, Verdict

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "kernel_specs"
WITH_LIGER_PY = sorted(d.name for d in SPECS.iterdir() if (d / LIGER_FILE).is_file())

# A torch-only stand-in for swiglu_fwd's adapter: same signature, runs on the CPU.
FAKE_LIGER = """
import torch.nn.functional as F

def liger(*, x, w1):
    pre = F.linear(x, w1)
    return {"postact": F.silu(pre[:, 0::2]) * pre[:, 1::2]}
"""
SMALL = {"M": 64, "K": 32, "I": 48}


@pytest.fixture
def liger_installed(monkeypatch):
    """Make ``import liger_kernel`` succeed (an empty module: nothing here calls into it)."""
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))


@pytest.fixture
def liger_missing(monkeypatch):
    """Make ``import liger_kernel`` fail as it does where it is not installed."""
    monkeypatch.setitem(sys.modules, "liger_kernel", None)


def _spec_copy(tmp_path: Path, name: str, liger_src: str | None) -> Path:
    """kernel_specs/<name> copied under tmp_path, its liger.py replaced by liger_src (None: removed)."""
    d = tmp_path / "kernel_specs" / name
    shutil.copytree(SPECS / name, d, ignore=shutil.ignore_patterns("__pycache__", LIGER_FILE))
    if liger_src is not None:
        (d / LIGER_FILE).write_text(liger_src)
    return d


def _worker(tmp_path: Path, spec_dir: Path, baselines: list[str]) -> RefWorker:
    folder = tmp_path / "ref"
    folder.mkdir()
    plan = Plan(spec_dir=str(spec_dir), runs=[], bench=True, device="cpu", baselines=baselines)
    (folder / PLAN_FILE).write_text(plan.to_json())
    return RefWorker(folder)


# -- the reference worker ------------------------------------------------------------------


def test_worker_resolves_liger_from_liger_py(tmp_path, liger_installed):
    d = _spec_copy(tmp_path, "swiglu_fwd", FAKE_LIGER)
    w = _worker(tmp_path, d, ["torch_eager", "liger"])
    fns = w.baseline_fns()
    assert callable(fns["liger"]) and fns["liger"].__name__ == "liger"
    assert fns["liger"].__module__ == "coda_liger_swiglu_fwd"
    # timed like any other baseline (under no_grad, rotated inputs)
    out = w.bench_shape("tiny", SMALL, fns)
    assert out["baselines"]["liger"]["ms"] > 0 and out["baselines"]["torch_eager"]["ms"] > 0


def test_worker_without_liger_py_records_no_equivalent(tmp_path, liger_installed):
    d = _spec_copy(tmp_path, "swiglu_fwd", None)
    w = _worker(tmp_path, d, ["torch_eager", "liger"])
    fns = w.baseline_fns()
    assert fns["liger"] == NO_LIGER
    out = w.bench_shape("tiny", SMALL, fns)
    assert out["baselines"]["liger"] == {"error": NO_LIGER}
    assert "ms" in out["baselines"]["torch_eager"]  # the others still run


def test_worker_without_liger_kernel_records_not_installed(tmp_path, liger_missing):
    d = _spec_copy(tmp_path, "swiglu_fwd", FAKE_LIGER)
    w = _worker(tmp_path, d, ["liger", "torch_eager"])
    fns = w.baseline_fns()
    assert fns["liger"] == LIGER_MISSING == "liger-kernel is not installed (pip install coda-agent[bench])"
    out = w.bench_shape("tiny", SMALL, fns)
    assert out["baselines"]["liger"] == {"error": LIGER_MISSING} and "ms" in out["baselines"]["torch_eager"]


def test_no_liger_py_wins_over_missing_install(tmp_path, liger_missing):
    """No adapter: "no equivalent" is the answer whether liger-kernel is installed or not."""
    d = _spec_copy(tmp_path, "swiglu_fwd", None)
    assert _worker(tmp_path, d, ["liger"]).baseline_fns()["liger"] == NO_LIGER


def test_broken_liger_py_is_that_baselines_error(tmp_path, liger_installed):
    d = _spec_copy(tmp_path, "swiglu_fwd", "raise RuntimeError('adapter broke')\n")
    fns = _worker(tmp_path, d, ["liger", "torch_eager"]).baseline_fns()
    assert fns["liger"].startswith("liger.py does not import: RuntimeError: adapter broke")
    assert callable(fns["torch_eager"])
    d2 = _spec_copy(tmp_path / "b", "swiglu_fwd", "def not_liger(): pass\n")
    assert _worker(tmp_path / "b", d2, ["liger"]).baseline_fns()["liger"] == "liger.py defines no function 'liger'"


def test_reference_liger_wins_over_liger_py(tmp_path, liger_installed):
    """A reference.py that defines liger itself (cross_entropy_bwd) keeps it."""
    ref = (SPECS / "cross_entropy_bwd" / "reference.py").read_text()
    if "\ndef liger(" not in ref:
        pytest.skip("cross_entropy_bwd's reference no longer defines liger")
    d = _spec_copy(tmp_path, "cross_entropy_bwd", "def liger(**kw):\n    raise AssertionError('not this one')\n")
    f = _worker(tmp_path, d, ["liger"]).baseline_fns()["liger"]
    assert callable(f) and f.__module__ == "coda_reference_cross_entropy_bwd"


def test_liger_py_is_not_hashed(tmp_path):
    d = _spec_copy(tmp_path, "swiglu_fwd", None)
    before = spec_hash(d)
    (d / LIGER_FILE).write_text(FAKE_LIGER)
    assert spec_hash(d) == before
    assert load_spec(d).has_liger


# -- coda-agent bench ----------------------------------------------------------------------


def _workspace(tmp_path: Path, names_with: list[str], names_without: list[str]) -> Path:
    for n in names_with:
        _spec_copy(tmp_path, n, FAKE_LIGER)
    for n in names_without:
        _spec_copy(tmp_path, n, None)
    for n in names_with + names_without:
        k = tmp_path / "generated_kernels" / n
        k.mkdir(parents=True)
        (k / "kernel.py").write_text("# stand-in\n")
        (k / "manifest.json").write_text("{}\n")
    return tmp_path


def test_bench_times_liger_exactly_when_liger_py_exists(tmp_path):
    root = _workspace(tmp_path, ["swiglu_fwd"], ["gemm_rmsnorm"])
    calls = {}

    def fake_verify(loaded, candidate, **kw):
        calls[loaded.name] = kw
        return Verdict(spec=loaded.name, spec_hash=loaded.spec_hash, candidate_hash="c", stages=[])

    rep = bench_kernels(root, None, verify_fn=fake_verify, out_dir=tmp_path / "out")
    assert set(calls) == {"swiglu_fwd", "gemm_rmsnorm"} and rep.markdown_path is None  # nothing measured
    with_l = load_spec(root / "kernel_specs" / "swiglu_fwd")
    # (+ quack_gemm, the floor every bench adds beside bare_gemm: test_gemm_floor.py)
    assert calls["swiglu_fwd"]["baselines"] == list(with_l.spec.bench.baselines) + ["liger", "quack_gemm"]
    without = load_spec(root / "kernel_specs" / "gemm_rmsnorm")
    assert calls["gemm_rmsnorm"]["baselines"] == list(without.spec.bench.baselines) + ["quack_gemm"]
    assert "liger" not in calls["gemm_rmsnorm"]["baselines"]


def test_bench_baselines_never_duplicate_liger(tmp_path):
    """A spec that already lists liger (cross_entropy_bwd) gets it once."""
    d = _spec_copy(tmp_path, "cross_entropy_bwd", FAKE_LIGER)
    loaded = load_spec(d)
    if "liger" not in loaded.spec.bench.baselines:
        pytest.skip("cross_entropy_bwd no longer lists liger")
    assert bench_baselines(loaded).count("liger") == 1


def test_results_page_shows_unavailable_liger_as_na():
    def row(ms, flops):
        return {
            "fused_ms": ms,
            "tflops": 700.0,
            "flops": flops,
            "baselines": {
                "bare_gemm": {"ms": ms * 1.1, "ratio": 1 / 1.1},
                "liger": {"error": LIGER_MISSING},
                "torch_compile": {"error": "boom"},
            },
        }

    metrics = {"shapes": {"a/M8192": row(0.5, 5e11), "b/M8192": row(2.0, 2e12)}}
    stages = [
        StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "correctness", "gradients")
    ]
    stages.append(StageResult(stage="bench", status="pass", summary="ok", metrics=metrics))
    v = Verdict(spec="swiglu_fwd", spec_hash="h", candidate_hash="c", stages=stages)
    text = results_markdown({"swiglu_fwd": v}, "2026-12-01")
    # columns sorted: bare_gemm, liger, sol_bound (the bare GEMM here: no bytes recorded), torch_compile
    assert "| a/M8192 | 0.5000 | - | 700 | 0.5500 | 0.909 | n/a | - | 0.5500 | 0.909 | error | - |" in text
    assert f"- liger did not run (all shapes): {LIGER_MISSING}" in text
    assert "- torch_compile did not run (all shapes): boom" in text


def test_plot_skips_errored_baselines(tmp_path):
    pytest.importorskip("matplotlib")
    from coda_agent.verifier.library.bench import plot_speedups

    m = {"fused_ms": 1.0, "baselines": {"bare_gemm": {"ms": 1.1, "ratio": 0.9}, "liger": {"error": NO_LIGER}}}
    v = Verdict(
        spec="x",
        spec_hash="h",
        candidate_hash="c",
        stages=[StageResult(stage="bench", status="pass", summary="ok", metrics={"shapes": {"s": m}})],
    )
    assert plot_speedups({"x": v}, tmp_path / "p.png") and (tmp_path / "p.png").stat().st_size > 1000


# -- the adapters ------------------------------------------------------------------------------


def test_the_expected_adapters_exist():
    assert {"swiglu_fwd", "gemm_residual_partial_rms", "gemm_cross_entropy", "gemm_rope"} <= set(WITH_LIGER_PY)


@pytest.mark.parametrize("name", WITH_LIGER_PY)
def test_adapter_imports_and_matches_the_spec_signature(name, liger_missing):
    """Each liger.py imports without liger-kernel and defines liger(*, <inputs>, <constants>)."""
    loaded = load_spec(SPECS / name)
    mod = loaded.load_liger()
    assert mod is not None and callable(getattr(mod, "liger", None))
    params = inspect.signature(mod.liger).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values()), params
    want = [t.name for t in loaded.spec.entry.inputs] + list(loaded.spec.entry.constants)
    assert list(params) == want
    assert "not part of the spec hash" in " ".join((mod.__doc__ or "").lower().split())


def test_every_spec_with_a_liger_baseline_has_an_adapter():
    """A spec listing liger in bench.baselines defines it in reference.py or liger.py."""
    for loaded in find_specs(ROOT):
        if "liger" in loaded.spec.bench.baselines:
            ref = loaded.reference_path.read_text()
            assert "\ndef liger(" in ref or loaded.has_liger, loaded.name

"""`coda-agent regress`: tampering, spec changes, broken compiles and slowdowns are caught.

CPU tests accept the good corpus kernel into a temporary workspace through the real
``accept()`` (with a synthetic GPU verdict: acceptance itself is tested in
test_accept.py), then break it one way at a time. The slowdown test runs on the H200.
"""

import json
import shutil
from pathlib import Path

import pytest

from coda_agent.verifier.library.accept import accept
from coda_agent.verifier.library.regress import compare_ratios, regress
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.verdict import Environment, StageResult, Verdict
from coda_agent.verifier.workspace import sha256_file

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "verifier" / "corpus"


def _bench(ratio_bare=1.01):
    return {
        "gpu": "NVIDIA H200",
        "shapes": {
            "llama3-8b/M8192": {
                "fused_ms": 1.0,
                "tflops": 600.0,
                "gbps": 900.0,
                "sol_ms": 0.6,
                "wall_ms": 1.1,
                "baselines": {
                    "bare_gemm": {"ms": 1.0 / ratio_bare, "ratio": ratio_bare},
                    "torch_compile": {"ms": 1.3, "ratio": 1.0 / 1.3},
                },
            }
        },
    }


def _synthetic_verdict(loaded, cand: Path, bench_metrics) -> Verdict:
    stages = [
        StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "correctness", "gradients")
    ]
    stages.append(StageResult(stage="bench", status="pass", summary="ok", metrics=bench_metrics))
    return Verdict(
        spec=loaded.name,
        spec_hash=loaded.spec_hash,
        candidate_hash=sha256_file(cand),
        stages=stages,
        environment=Environment(gpu="NVIDIA H200", compute_capability="9.0", worker_sandbox="landlock ABI 7 (test)"),
    )


@pytest.fixture
def workspace(tmp_path):
    """A workspace with swiglu_fwd accepted (the good corpus kernel)."""
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    loaded = load_spec(tmp_path / "kernel_specs" / "swiglu_fwd")
    cand = tmp_path / "candidate.py"
    shutil.copy(CORPUS / "good_swiglu_fwd.py", cand)
    accept(loaded, cand, _synthetic_verdict(loaded, cand, _bench()), root=tmp_path, provenance={"backend": "test"})
    return tmp_path


def _rehash(ws: Path, name="swiglu_fwd"):
    """Simulate a kernel whose file is consistent with its manifest (e.g. a dependency broke it)."""
    kdir = ws / "generated_kernels" / name
    man = json.loads((kdir / "manifest.json").read_text())
    man["kernel_sha256"] = sha256_file(kdir / "kernel.py")
    (kdir / "manifest.json").write_text(json.dumps(man))


def test_tampered_kernel_is_caught(workspace):
    k = workspace / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    k.write_text(k.read_text().replace("tuned=False", "tuned=False  # tweak"))
    rep = regress(workspace, cpu_only=True)
    (row,) = rep.rows
    assert not rep.ok and row.status == "fail" and row.stage == "integrity"
    assert "modified after verification" in row.message and "--force" in row.message


def test_manifest_without_a_gpu_verification_fails_integrity(workspace):
    """accept() never writes such a manifest, and regress --cpu-only checks for it too."""
    m = workspace / "generated_kernels" / "swiglu_fwd" / "manifest.json"
    man = json.loads(m.read_text())
    assert man["gpu_verified"] is True
    man["gpu_verified"] = False
    m.write_text(json.dumps(man))
    (row,) = regress(workspace, cpu_only=True).rows
    assert row.status == "fail" and row.stage == "integrity" and "does not record a GPU verification" in row.message


def test_changed_spec_needs_reverification_naming_fields(workspace):
    p = workspace / "kernel_specs" / "swiglu_fwd" / "spec.toml"
    p.write_text(p.read_text().replace("factor = 2.0", "factor = 1.5").replace("max_launches = 1", "max_launches = 2"))
    rep = regress(workspace, cpu_only=True)
    (row,) = rep.rows
    assert row.status == "needs-reverify" and row.stage == "spec" and not rep.ok
    assert "entry.max_launches" in row.message and "tolerance.factor" in row.message


def test_changed_reference_needs_reverification(workspace):
    p = workspace / "kernel_specs" / "swiglu_fwd" / "reference.py"
    p.write_text(p.read_text() + "\n# changed\n")
    (row,) = regress(workspace, cpu_only=True).rows
    assert row.status == "needs-reverify" and "reference.py" in row.message


def test_unknown_kernel_name(workspace):
    with pytest.raises(ValueError, match=r"not accepted kernels: \['nope'\]"):
        regress(workspace, ["nope"], cpu_only=True)


def _two_shapes(r1, r2):
    a = _bench(r1)["shapes"]["llama3-8b/M8192"]
    b = _bench(r2)["shapes"]["llama3-8b/M8192"]
    return {"llama3-8b/M8192": a, "llama3-70b/M8192": b}


def test_compare_ratios():
    acc = _two_shapes(1.00, 1.00)
    same = compare_ratios(acc, _two_shapes(1.05, 1.05), 0.10)
    assert same["regressed"] == [] and same["worst"] == pytest.approx(1.05)
    # uniformly 25 % slower relative to the bare GEMM: the geometric mean trips
    slow = compare_ratios(acc, _two_shapes(1.25, 1.25), 0.10)
    assert "geomean/bare_gemm" in slow["regressed"]
    assert slow["geomean"]["bare_gemm"] == pytest.approx(1.25)
    # one shape 15 % off (a timing outlier), the other unchanged: geomean 1.07, pair < 20 %
    outlier = compare_ratios(acc, _two_shapes(1.15, 1.00), 0.10)
    assert outlier["regressed"] == [] and outlier["worst_at"] == "llama3-8b/M8192/bare_gemm"
    # a regression confined to one shape still fails through the per-shape guard
    one = compare_ratios(acc, _two_shapes(1.40, 1.00), 0.10)
    assert "llama3-8b/M8192/bare_gemm" in one["regressed"]
    assert compare_ratios(acc, {}, 0.1)["worst"] is None


def test_gpu_ratio_regression_logic_with_injected_verdict(workspace):
    """The perf comparison path with a verify_fn standing in for the GPU (logic only)."""
    loaded = load_spec(workspace / "kernel_specs" / "swiglu_fwd")

    def fake_verify(ld, kernel, bench_shapes=None):
        return _synthetic_verdict(ld, kernel, _bench(1.30))

    rep = regress(workspace, cpu_only=False, verify_fn=fake_verify, tolerance=0.10)
    (row,) = rep.rows
    assert row.status == "fail" and row.stage == "bench"
    assert "slower relative to its baselines" in row.message and "fused/bare_gemm is 1.29x" in row.message
    assert loaded.name == row.kernel


def test_only_bare_gemm_gates_other_baselines_inform():
    """Numbers from the H200 (gemm_rmsnorm_rope, 1B/M8192): the fused kernel got faster
    (0.2053 -> 0.1773 ms), quack's library baseline much faster (0.3144 -> 0.2064 ms):
    fused/quack_library 0.653 -> 0.859, a 1.32x "change" that is the baseline's, not the kernel's."""

    def shape(fused, bare, quack):
        return {
            "s/M8192": {
                "fused_ms": fused,
                "baselines": {
                    "bare_gemm": {"ms": bare, "ratio": fused / bare},
                    "quack_library": {"ms": quack, "ratio": fused / quack},
                },
            }
        }

    acc, now = shape(0.2053, 0.1489, 0.3144), shape(0.1773, 0.1459, 0.2064)
    every = compare_ratios(acc, now, 0.10)
    assert "s/M8192/quack_library" in every["regressed"]  # the old rule: a false regression
    gated = compare_ratios(acc, now, 0.10, gate={"bare_gemm"})
    assert gated["regressed"] == [] and gated["worst_at"] == "s/M8192/bare_gemm"
    assert gated["worst"] == pytest.approx((0.1773 / 0.1459) / (0.2053 / 0.1489))
    assert gated["info_worst_at"] == "s/M8192/quack_library" and gated["info_worst"] == pytest.approx(1.315, abs=1e-3)
    # the kernel itself 30 % slower (bare GEMM unchanged): the gate trips
    slow = compare_ratios(acc, shape(0.2053 * 1.3, 0.1489, 0.3144), 0.10, gate={"bare_gemm"})
    assert "geomean/bare_gemm" in slow["regressed"] and "s/M8192/bare_gemm" in slow["regressed"]


def test_host_bound_shapes_do_not_gate():
    """Numbers from the H200 (gemm_rope, 1B/M8192, two live benches the same day): the same
    kernel timed 0.165 ms, then 0.40 ms with 0.48 ms of host time per call (host-bound),
    while the bare GEMM stayed at 0.145 ms: a 2.4x "regression" of Python, not of the kernel."""

    def shapes(fused_1b, host_1b, fused_8b):
        return {
            "1b/M8192": {
                "fused_ms": fused_1b,
                "host_ms": host_1b,
                "baselines": {"bare_gemm": {"ratio": fused_1b / 0.145}},
            },
            "8b/M8192": {"fused_ms": fused_8b, "host_ms": 0.2, "baselines": {"bare_gemm": {"ratio": fused_8b / 0.59}}},
        }

    acc = shapes(0.165, 0.10, 0.597)
    now = compare_ratios(acc, shapes(0.40, 0.48, 0.63), 0.10, gate={"bare_gemm"})
    assert now["host_bound"] == ["1b/M8192"] and now["regressed"] == []
    assert now["worst_at"] == "8b/M8192/bare_gemm" and now["info_worst_at"] == "1b/M8192/bare_gemm"
    # the geometric mean is over the shapes that are not host-bound only
    assert now["geomean"]["bare_gemm"] == pytest.approx(0.63 / 0.597)
    # a real slowdown where the kernel is device-bound still fails
    slow = compare_ratios(acc, shapes(0.40, 0.48, 0.597 * 1.3), 0.10, gate={"bare_gemm"})
    assert "8b/M8192/bare_gemm" in slow["regressed"]
    # host-bound at acceptance counts too: the accepted number was not the kernel's either
    acc_hb = shapes(0.30, 0.29, 0.597)
    assert compare_ratios(acc_hb, shapes(0.165, 0.10, 0.597), 0.10, gate={"bare_gemm"})["host_bound"] == ["1b/M8192"]


def test_regress_row_reports_non_gating_baselines(workspace, tmp_path_factory):
    loaded = load_spec(workspace / "kernel_specs" / "swiglu_fwd")
    kernel = workspace / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    m = _bench(1.01)
    m["shapes"]["llama3-8b/M8192"]["baselines"]["torch_compile"]["ratio"] = 1.0  # was 1/1.3: 1.3x "worse"
    vdir = tmp_path_factory.mktemp("verdicts")
    (vdir / "swiglu_fwd.json").write_text(_synthetic_verdict(loaded, kernel, m).to_json())
    (row,) = regress(workspace, cpu_only=False, verdicts=vdir).rows
    assert row.status == "pass" and "not gating" in row.message and "1.30x" in row.message


@pytest.mark.slow
@pytest.mark.compile
def test_untouched_library_passes_cpu(workspace):
    rep = regress(workspace, cpu_only=True)
    assert rep.ok, rep.rows
    assert rep.rows[0].stage == "compile" and "sm_90a compile ok" in rep.rows[0].message


@pytest.mark.slow
@pytest.mark.compile
def test_kernel_that_no_longer_compiles_is_caught(workspace):
    k = workspace / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    k.write_text(k.read_text().replace("unpack(acc)", "unpack(acc, acc)"))
    _rehash(workspace)
    (row,) = regress(workspace, cpu_only=True).rows
    assert row.status == "fail" and row.stage == "compile"
    assert "no longer compiles for sm_90a" in row.message


SLOW_EPILOGUE = """
    # deliberately slower, numerically identical: a 48-deep chain of sigmoids added as 0 * t
    t = gate
    for _ in range(48):
        t = sigmoid(t + up)
"""


@pytest.mark.gpu
def test_kernel_made_slower_is_caught_on_gpu(tmp_path):
    """Accept the good dSwiGLU kernel for real (1 shape), slow it down, regress catches it."""
    from coda_agent.verifier.pipeline import verify

    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    loaded = load_spec(tmp_path / "kernel_specs" / "swiglu_bwd")
    cand = tmp_path / "candidate.py"
    shutil.copy(CORPUS / "good_swiglu_bwd.py", cand)
    shapes = ["llama3-1b/M8192"]
    verdict = verify(loaded, cand, bench_shapes=shapes)
    assert verdict.gpu_verified, verdict.failed_stage
    accept(loaded, cand, verdict, root=tmp_path, provenance={"backend": "test"})
    assert regress(tmp_path, cpu_only=False, bench_shapes=shapes).ok

    k = tmp_path / "generated_kernels" / "swiglu_bwd" / "kernel.py"
    src = k.read_text()
    anchor = "    dgate, dup, postact = dswiglu(gate, up, acc)\n"
    assert anchor in src
    src = src.replace(anchor, anchor + SLOW_EPILOGUE + "    postact = postact + 0.0 * t\n")
    src = src.replace("from quack.activation import dswiglu", "from quack.activation import dswiglu, sigmoid")
    k.write_text(src)
    _rehash(tmp_path, "swiglu_bwd")
    rep = regress(tmp_path, cpu_only=False, bench_shapes=shapes)
    (row,) = rep.rows
    assert row.status == "fail" and row.stage == "bench", row
    assert "slower relative to its baselines" in row.message


# -- regress --verdicts: judge what `coda-agent bench` kept, without measuring again ------------


def test_kept_bench_verdict_is_judged_without_measuring(workspace, tmp_path_factory):
    loaded = load_spec(workspace / "kernel_specs" / "swiglu_fwd")
    kernel = workspace / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    vdir = tmp_path_factory.mktemp("verdicts")

    def never(*a, **kw):
        raise AssertionError("--verdicts must not run the verifier")

    # slower relative to the bare GEMM than at acceptance (1.01 -> 1.30): a regression
    (vdir / "swiglu_fwd.json").write_text(_synthetic_verdict(loaded, kernel, _bench(1.30)).to_json())
    (row,) = regress(workspace, cpu_only=False, verify_fn=never, verdicts=vdir).rows
    assert row.status == "fail" and row.stage == "bench" and "fused/bare_gemm is 1.29x" in row.message
    # the same ratios as at acceptance: pass, ratio change 1.0
    (vdir / "swiglu_fwd.json").write_text(_synthetic_verdict(loaded, kernel, _bench(1.01)).to_json())
    (row,) = regress(workspace, cpu_only=False, verify_fn=never, verdicts=vdir).rows
    assert row.status == "pass" and row.worst_ratio_change == pytest.approx(1.0)


def test_kept_verdict_of_another_kernel_or_missing_fails(workspace, tmp_path_factory):
    loaded = load_spec(workspace / "kernel_specs" / "swiglu_fwd")
    vdir = tmp_path_factory.mktemp("verdicts")
    (row,) = regress(workspace, cpu_only=False, verdicts=vdir).rows
    assert row.status == "fail" and f"not measured in {vdir} (no swiglu_fwd.json)" in row.message
    assert "Error" not in row.message  # not the exception's name
    other = workspace / "other.py"
    other.write_text("# a different kernel.py\n")
    (vdir / "swiglu_fwd.json").write_text(_synthetic_verdict(loaded, other, _bench(1.01)).to_json())
    (row,) = regress(workspace, cpu_only=False, verdicts=vdir).rows
    assert row.status == "fail" and "hash differs" in row.message
    damaged = json.loads(
        _synthetic_verdict(loaded, workspace / "generated_kernels" / "swiglu_fwd" / "kernel.py", _bench(1.01)).to_json()
    )
    del damaged["stages"]  # a named failure, not read as "no GPU benchmark ran"
    (vdir / "swiglu_fwd.json").write_text(json.dumps(damaged))
    (row,) = regress(workspace, cpu_only=False, verdicts=vdir).rows
    assert row.status == "fail" and "records no stages" in row.message and "swiglu_fwd.json" in row.message
    with pytest.raises(ValueError, match="not a folder"):
        regress(workspace, cpu_only=False, verdicts=vdir / "nope")


def test_failing_static_in_gpu_verdict_gets_the_static_row(workspace):
    """GPU mode takes static/compile from the verdict (no second compile): same rows as CPU mode."""
    loaded = load_spec(workspace / "kernel_specs" / "swiglu_fwd")

    def fake_verify(ld, kernel, bench_shapes=None):
        v = _synthetic_verdict(ld, kernel, _bench())
        v.stages = [StageResult(stage="static", status="fail", summary="1 violation(s)")]
        return v

    (row,) = regress(workspace, cpu_only=False, verify_fn=fake_verify).rows
    assert row.status == "fail" and row.stage == "static" and row.message == "1 violation(s)"
    assert loaded.name == row.kernel

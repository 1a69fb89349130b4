"""coda-agent bench: the results page (markdown + optional PNG) from verdicts or manifests."""

import importlib.util
import shutil
from pathlib import Path

import pytest

from coda_agent.verifier.library.accept import accept, verdict_from_manifest
from coda_agent.verifier.library.bench import bench_kernels, page_from_kept, results_markdown
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.verdict import Environment, StageResult, Verdict
from coda_agent.verifier.workspace import sha256_file

ROOT = Path(__file__).resolve().parents[2]


def _metrics():
    def row(ms, flops):
        return {
            "fused_ms": ms,
            "tflops": 700.0,
            "flops": flops,
            "baselines": {"bare_gemm": {"ms": ms * 1.1, "ratio": 1 / 1.1}, "torch_compile": {"error": "boom"}},
        }

    return {"gpu": "NVIDIA H200", "shapes": {"llama3-8b/M8192": row(2.0, 2e12), "llama3-1b/M8192": row(0.5, 5e11)}}


def test_results_from_manifests(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    loaded = load_spec(tmp_path / "kernel_specs" / "swiglu_fwd")
    cand = tmp_path / "k.py"
    shutil.copy(ROOT / "tests" / "verifier" / "corpus" / "good_swiglu_fwd.py", cand)
    stages = [
        StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "correctness", "gradients")
    ]
    stages.append(StageResult(stage="bench", status="pass", summary="ok", metrics=_metrics()))
    v = Verdict(
        spec=loaded.name,
        spec_hash=loaded.spec_hash,
        candidate_hash=sha256_file(cand),
        stages=stages,
        environment=Environment(
            gpu="NVIDIA H200", compute_capability="9.0", torch="2.11.0", worker_sandbox="landlock ABI 7 (test)"
        ),
    )
    accept(loaded, cand, v, root=tmp_path, provenance={"backend": "test"})

    rep = bench_kernels(tmp_path, None, from_manifests=True, out_dir=tmp_path / "out")
    assert rep.verdicts["swiglu_fwd"].gpu_verified
    text = rep.markdown_path.read_text()
    assert rep.markdown_path.name.endswith("-nvidia-h200-manifests.md")  # never the measured page's name
    assert "not re-measured" in text and "## swiglu_fwd: verified" in text
    # smallest problem first, the failed baseline shown as an error, ratios printed
    section = text[text.index("## swiglu_fwd") :]
    assert section.index("llama3-1b/M8192") < section.index("llama3-8b/M8192")
    # (the sol_bound column: no bytes recorded here, so the bound is the bare GEMM's time)
    assert "| llama3-1b/M8192 | 0.5000 | - | 700 | 0.5500 | 0.909 | 0.5500 | 0.909 | error | - |" in text
    if importlib.util.find_spec("matplotlib"):
        assert rep.plot_path is not None and rep.plot_path.stat().st_size > 1000


def test_unverified_kernel_is_labelled():
    v = Verdict(
        spec="x",
        spec_hash="h",
        candidate_hash="c",
        stages=[StageResult(stage="static", status="fail", summary="1 violation(s)")],
    )
    text = results_markdown({"x": v}, "2026-11-30")
    assert "## x: NOT verified: 1 violation(s)" in text


def test_verdict_roundtrip_through_manifest():
    import json

    man = json.loads((ROOT / "generated_kernels" / "swiglu_bwd" / "manifest.json").read_text())
    v = verdict_from_manifest(man)
    assert v.gpu_verified and v.environment.gpu == "NVIDIA H200"
    assert v.stage("bench").metrics["shapes"]["llama3-8b/M8192"]["fused_ms"] > 0
    # pipeline order, not the manifest's sorted keys
    assert [s.stage for s in v.stages] == ["static", "compile", "correctness", "gradients", "bench"]


def test_bar_lines_report_met_and_missed_bars():
    from coda_agent.verifier.library.bench import _bar_lines

    lines = _bar_lines(
        {
            "bare_gemm": {"limit": 1.05, "met": False, "met_shapes": 2, "shapes": 6},
            "quack_library": {"limit": 1.03, "met": True, "met_shapes": 6, "shapes": 6},
            "liger": {"limit": 1.0, "met": None, "met_shapes": 0, "shapes": 0},
        }
    )
    assert lines[0] == "Bar fused/bare_gemm <= 1.05: MISSED (met at 2 of 6 shapes)."
    assert lines[1] == "Bar fused/quack_library <= 1.03: met (met at 6 of 6 shapes)."
    assert len(lines) == 3 and "not enforced" in lines[2]
    assert _bar_lines(None) == [] and _bar_lines({}) == []


# -- live bench: verdicts kept per kernel, one page per day and GPU -------------------------------


def _accepted(root: Path, name: str, corpus_file: str) -> Path:
    loaded = load_spec(root / "kernel_specs" / name)
    cand = root / f"{name}.py"
    shutil.copy(ROOT / "tests" / "verifier" / "corpus" / corpus_file, cand)
    stages = [
        StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "correctness", "gradients")
    ]
    stages.append(StageResult(stage="bench", status="pass", summary="ok", metrics=_metrics()))
    v = Verdict(
        spec=name,
        spec_hash=loaded.spec_hash,
        candidate_hash=sha256_file(cand),
        stages=stages,
        environment=Environment(gpu="NVIDIA H200", compute_capability="9.0", worker_sandbox="landlock ABI 7 (test)"),
    )
    accept(loaded, cand, v, root=root, provenance={"backend": "test"})
    return root / "generated_kernels" / name / "kernel.py"


def _gpu_verify(fused_ms: float):
    def fake(loaded, kernel, **kw):
        m = _metrics()
        for row in m["shapes"].values():
            row["fused_ms"] = fused_ms
        stages = [
            StageResult(stage=s, status="pass", summary="ok") for s in ("static", "compile", "correctness", "gradients")
        ]
        stages.append(StageResult(stage="bench", status="pass", summary="ok", metrics=m))
        return Verdict(
            spec=loaded.name,
            spec_hash=loaded.spec_hash,
            candidate_hash=sha256_file(kernel),
            stages=stages,
            environment=Environment(
                gpu="NVIDIA H200", compute_capability="9.0", worker_sandbox="landlock ABI 7 (test)"
            ),
        )

    return fake


def test_split_bench_calls_land_on_one_page(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    _accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py")
    bwd = _accepted(tmp_path, "swiglu_bwd", "good_swiglu_bwd.py")
    out = tmp_path / "out"

    first = bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=_gpu_verify(0.25), out_dir=out)
    vdir = next(p for p in out.iterdir() if p.is_dir())
    assert vdir.name.endswith("-nvidia-h200") and [p.name for p in vdir.iterdir()] == ["swiglu_fwd.json"]
    assert "## swiglu_bwd" not in first.markdown_path.read_text()

    second = bench_kernels(tmp_path, ["swiglu_bwd"], verify_fn=_gpu_verify(0.75), out_dir=out)
    assert second.markdown_path == first.markdown_path
    text = second.markdown_path.read_text()
    # both kernels on the page, each with the fused time of its own run
    assert "## swiglu_fwd: verified" in text and "## swiglu_bwd: verified" in text
    assert "| llama3-1b/M8192 | 0.2500 |" in text and "| llama3-1b/M8192 | 0.7500 |" in text
    assert set(second.page_verdicts) == {"swiglu_fwd", "swiglu_bwd"} and set(second.verdicts) == {"swiglu_bwd"}

    # a kernel replaced since it was measured is left off the page, and the page says so
    bwd.write_text(bwd.read_text() + "\n# replaced\n")
    third = bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=_gpu_verify(0.25), out_dir=out)
    text = third.markdown_path.read_text()
    assert (
        "## swiglu_bwd" not in text and "swiglu_bwd: measured for a kernel that is no longer the accepted one" in text
    )

    # the old kernel put back: re-rendering the kept verdicts (nothing measured) brings it back
    bwd.write_text(bwd.read_text().replace("\n# replaced\n", ""))
    again = page_from_kept(tmp_path, vdir)
    assert again.markdown_path == first.markdown_path and set(again.page_verdicts) == {"swiglu_fwd", "swiglu_bwd"}
    assert "| llama3-1b/M8192 | 0.7500 |" in again.markdown_path.read_text()
    with pytest.raises(ValueError, match="not a folder"):
        page_from_kept(tmp_path, tmp_path / "nope")


def test_cpu_only_verdicts_are_not_kept(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    _accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py")

    def no_gpu(loaded, kernel, **kw):
        stages = [
            StageResult(stage="static", status="pass", summary="ok"),
            StageResult(stage="compile", status="pass", summary="ok"),
            StageResult(stage="correctness", status="skip", summary="no CUDA GPU: not verified"),
        ]
        return Verdict(spec=loaded.name, spec_hash=loaded.spec_hash, candidate_hash=sha256_file(kernel), stages=stages)

    rep = bench_kernels(tmp_path, None, verify_fn=no_gpu, out_dir=tmp_path / "out")
    assert rep.markdown_path is None and not (tmp_path / "out").exists()


def test_targets_table_reports_worst_shapes():
    from coda_agent.verifier.library.bench import targets_table

    def verdict(name, rows):
        # fused 1.0 ms everywhere, so a baseline's ms is 1 / its ratio
        shapes = {
            s: {"fused_ms": 1.0, "baselines": {b: {"ratio": r, "ms": 1.0 / r} for b, r in bs.items()}}
            for s, bs in rows.items()
        }
        st = [StageResult(stage="bench", status="pass", summary="ok", metrics={"shapes": shapes})]
        return Verdict(spec=name, spec_hash="h", candidate_hash="c", stages=st)

    fwd = verdict(
        "x_fwd",
        {
            "llama3-1b/M8192": {"bare_gemm": 1.08, "quack_library": 0.99, "torch_compile": 0.9, "quack_gemm": 1.0},
            "llama3-8b/M8192": {"bare_gemm": 1.01, "quack_library": 1.02, "torch_compile": 0.8, "quack_gemm": 1.02},
        },
    )
    bwd = verdict(
        "x_bwd",
        {
            "llama3-8b/M8192": {"bare_gemm": 1.1, "torch_compile": 0.7},
            "llama3-8b/M16384": {"bare_gemm": 1.1, "torch_compile": 0.75},
        },
    )
    text = "\n".join(targets_table({"x_fwd": fwd, "x_bwd": bwd}))
    # quack_gemm: worst fused/quack_gemm 1.02 at 8B; at the worst bare shape (1B) quack's GEMM
    # takes 1/1.0 ms against cuBLAS's 1/1.08 ms -> 1.080: the miss is the mainloop's
    # without bytes moved, the speed-of-light bound is the bare GEMM's time
    assert (
        "| x_fwd | forward | 1.080 (llama3-1b/M8192) | 1.020 (llama3-8b/M8192) | 1.080 (llama3-1b/M8192) "
        "| 1.250x (llama3-8b/M8192) | 1.020 (llama3-8b/M8192) | 1.080 | no: bare_gemm, speed_of_light "
        "| no host-bound shape |"
    ) in text
    # backward: the bare-GEMM column does not gate, the speed-of-light bound does; the
    # speedup over torch.compile (1/0.75 = 1.33x) is information, not a target
    assert (
        "| x_bwd | backward | 1.100 (llama3-8b/M8192) | - | 1.100 (llama3-8b/M8192) | 1.333x (llama3-8b/M16384) "
        "| - | - | no: speed_of_light | no host-bound shape |"
    ) in text
    # 1.2998x is shown as such (speedups round down), and judges nothing
    near = verdict("y_bwd", {"llama3-8b/M8192": {"torch_compile": 1 / 1.2998}})
    assert "| y_bwd | backward | - | - | - | 1.299x (llama3-8b/M8192) | - | - | - |" in "\n".join(
        targets_table({"y_bwd": near})
    )
    # the spec's pattern decides the direction, not the name (swiglu_bwd_rms is a backward kernel)
    chained = verdict("x_bwd_rms", {"llama3-8b/M8192": {"bare_gemm": 1.1, "torch_compile": 0.7}})
    assert "| x_bwd_rms | backward | 1.100 (llama3-8b/M8192) |" in "\n".join(
        targets_table({"x_bwd_rms": chained}, patterns={"x_bwd_rms": "backward"})
    )
    assert "| x_bwd_rms | forward |" in "\n".join(targets_table({"x_bwd_rms": chained}))
    # and a ratio just over a bar is shown over it (1.0501 -> 1.051, not 1.050)
    over = verdict("y_fwd", {"llama3-8b/M8192": {"bare_gemm": 1.0501}})
    assert "| y_fwd | forward | 1.051 (llama3-8b/M8192) |" in "\n".join(targets_table({"y_fwd": over}))


def test_targets_table_without_host_bound_shapes_and_borderline_repeats():
    from coda_agent.verifier.library.bench import targets_table

    shapes = {
        # host-bound (host 0.5 ms >= 0.8 x 0.4 ms): misses the bare-GEMM target
        "llama3-1b/M8192": {"fused_ms": 0.40, "host_ms": 0.50, "baselines": {"bare_gemm": {"ratio": 2.7, "ms": 0.148}}},
        # device-bound: its repeat runs straddle 1.05 although the median (1.031) meets it
        "llama3-70b/M16384": {
            "fused_ms": 4.0,
            "host_ms": 0.1,
            "baselines": {"bare_gemm": {"ratio": 1.031, "ms": 3.88}},
            "runs": {"ratios": {"bare_gemm": [1.028, 1.031, 1.065]}, "fused_ms": [4.0, 4.0, 4.1]},
        },
    }
    st = [StageResult(stage="bench", status="pass", summary="ok", metrics={"shapes": shapes})]
    v = Verdict(spec="z_fwd", spec_hash="h", candidate_hash="c", stages=st)
    row = next(line for line in targets_table({"z_fwd": v}) if line.startswith("| z_fwd"))
    assert row.endswith(
        "| 2.700 (llama3-1b/M8192, host-bound) | - | 1.031 (llama3-70b/M16384) | - | - | - "
        "| no: bare_gemm (borderline: runs straddle bare_gemm at llama3-70b/M16384 (1.028-1.065)) "
        "| yes |"
    ), row


def test_page_shows_host_time_and_flags_host_bound_shapes():
    from coda_agent.verifier.library.bench import results_markdown

    shapes = {
        # host 0.48 ms for a 0.40 ms call: host-bound (>= 0.8 x)
        "llama3-1b/M8192": {
            "fused_ms": 0.40,
            "host_ms": 0.48,
            "guard_host_ms": 0.004,
            "tflops": 300,
            "flops": 1.0,
            "baselines": {"bare_gemm": {"ms": 0.145, "ratio": 0.40 / 0.145}},
        },
        # host 0.3 ms for a 1.2 ms call: not
        "llama3-8b/M8192": {
            "fused_ms": 1.20,
            "host_ms": 0.30,
            "guard_host_ms": 0.006,
            "tflops": 600,
            "flops": 2.0,
            "baselines": {"bare_gemm": {"ms": 1.17, "ratio": 1.20 / 1.17}},
        },
    }
    st = [StageResult(stage="bench", status="pass", summary="ok", metrics={"shapes": shapes})]
    text = results_markdown(
        {"gemm_rope": Verdict(spec="gemm_rope", spec_hash="h", candidate_hash="c", stages=st)}, "2026-12-01"
    )
    assert "| llama3-1b/M8192 | 0.4000 | 0.4800 | 300 | 0.1450 | 2.759 |" in text
    assert "- host-bound (host ms >= 0.8 x fused ms): llama3-1b/M8192." in text
    # the Targets cell from that shape says so; the kernel says when and how it was measured
    assert "| gemm_rope | forward | 2.759 (llama3-1b/M8192, host-bound) |" in text
    assert "Measured at an unrecorded time; candidate worker: confinement not recorded." in text
    # the guard's median over the shapes (the upper of two), in microseconds
    assert "adds 6 us of host time to each timed fused call" in text


def test_speed_of_light_bound_is_the_bare_gemm_or_the_memory_floor():
    from coda_agent.verifier.library.bench import SOL, page_shapes, sol_bound_ms, targets_table

    peak = 4.8e12  # bytes/s
    gemm_bound = {"fused_ms": 1.0, "bytes": 4.8e8, "baselines": {"bare_gemm": {"ms": 0.98, "ratio": 1 / 0.98}}}
    assert sol_bound_ms(gemm_bound, peak) == (0.98, 0.1)  # floor 4.8e8 B / 4.8e12 B/s = 0.1 ms
    memory_bound = {"fused_ms": 0.5, "bytes": 1.92e9, "baselines": {"bare_gemm": {"ms": 0.2, "ratio": 2.5}}}
    assert sol_bound_ms(memory_bound, peak) == (0.4, 0.4)
    assert sol_bound_ms({"fused_ms": 1.0, "bytes": 1e9, "baselines": {}}, None) is None
    # the page: the bound as one more column; a memory-bound kernel 1.25x over its floor misses
    st = [
        StageResult(
            stage="bench",
            status="pass",
            summary="ok",
            metrics={"peak_bw": peak, "shapes": {"llama3-8b/M8192": memory_bound}},
        )
    ]
    v = Verdict(spec="m_bwd", spec_hash="h", candidate_hash="c", stages=st)
    m = page_shapes(v)["llama3-8b/M8192"]
    assert m["baselines"][SOL] == {"ms": 0.4, "ratio": 1.25, "floor_ms": 0.4}
    assert "bytes" in m and SOL not in memory_bound["baselines"]  # the verdict is not changed
    row = next(line for line in targets_table({"m_bwd": v}) if line.startswith("| m_bwd"))
    assert "| 1.250 (llama3-8b/M8192) |" in row and "no: speed_of_light" in row, row

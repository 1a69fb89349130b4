"""verifier/library/accept.py: only GPU-verified verdicts, atomic writes, no silent overwrite, history."""

import json
from pathlib import Path

import pytest

import coda_agent.verifier.library.accept as acc
from coda_agent.verifier.library.accept import AcceptError, accept
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.verdict import Environment, StageResult, Verdict
from coda_agent.verifier.workspace import sha256_file

ROOT = Path(__file__).resolve().parents[2]
LOADED = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")
PROV = {"backend": "scripted", "model": "test-model", "prompt_sha256": "ab" * 32, "attempts": 2, "run_dir": "runs/x"}


def _bench_metrics():
    return {
        "gpu": "NVIDIA H200",
        "shapes": {
            "llama3-1b/M8192": {
                "fused_ms": 0.81,
                "tflops": 679.0,
                "gbps": 1200.0,
                "sol_ms": 0.56,
                "wall_ms": 0.9,
                "baselines": {"bare_gemm": {"ms": 0.88, "ratio": 0.92}, "quack_library": {"error": "x"}},
            }
        },
        "bar": {"bare_gemm": {"limit": 1.03, "met": True, "met_shapes": 1, "shapes": 1}},
    }


CONFINED = "landlock ABI 7: writes only beneath 8 path(s); TCP denied"


def _verdict(cand: Path, *, cpu_only=False, fail=None, bench="pass", sandbox=CONFINED) -> Verdict:
    stages = [StageResult(stage=s, status="pass", summary=f"{s} ok") for s in ("static", "compile")]
    stages.append(
        StageResult(
            stage="correctness",
            status="fail" if fail == "correctness" else "pass",
            summary="c",
            metrics={
                "worst": {"preact": {"max_err": 0.01, "allowed": 0.03, "ratio": 0.33, "trial": "c0-aligned-s0"}},
                "launches": 1,
                "max_launches": 1,
                "kernels": ["gemm_kernel"],
            },
        )
    )
    stages.append(StageResult(stage="gradients", status="skip", summary="none"))
    stages.append(StageResult(stage="bench", status=bench, summary="b", metrics=_bench_metrics()))
    return Verdict(
        spec=LOADED.name,
        spec_hash=LOADED.spec_hash,
        candidate_hash=sha256_file(cand),
        stages=stages,
        environment=Environment(gpu="NVIDIA H200", compute_capability="9.0", torch="2.11", worker_sandbox=sandbox),
        cpu_only=cpu_only,
    )


@pytest.fixture(autouse=True)
def _library_specs(tmp_path):
    """accept() takes specs only from <root>/kernel_specs/: the temporary root links the repo's."""
    (tmp_path / "kernel_specs").symlink_to(ROOT / "kernel_specs")


@pytest.fixture
def cand(tmp_path):
    p = tmp_path / "candidate.py"
    p.write_text("def swiglu_fwd(x, w1):\n    return x, w1\n")
    return p


def test_refuses_without_gpu_verification(tmp_path, cand):
    with pytest.raises(AcceptError, match="not GPU-verified: it comes from a CPU-only run"):
        accept(LOADED, cand, _verdict(cand, cpu_only=True), root=tmp_path, provenance=PROV)
    with pytest.raises(AcceptError, match="stage 'correctness' did not pass"):
        accept(LOADED, cand, _verdict(cand, fail="correctness"), root=tmp_path, provenance=PROV)
    with pytest.raises(AcceptError, match="not GPU-verified"):
        accept(LOADED, cand, _verdict(cand, bench="skip"), root=tmp_path, provenance=PROV)
    assert not (tmp_path / "generated_kernels" / "swiglu_fwd").exists()


def test_refuses_other_bytes_or_spec(tmp_path, cand):
    v = _verdict(cand)
    cand.write_text(cand.read_text() + "# edited after verification\n")
    with pytest.raises(AcceptError, match="changed since it was verified"):
        accept(LOADED, cand, v, root=tmp_path, provenance=PROV)
    v = _verdict(cand)
    v.spec_hash = "0" * 64
    with pytest.raises(AcceptError, match="spec hash differs"):
        accept(LOADED, cand, v, root=tmp_path, provenance=PROV)


def test_refuses_a_spec_loaded_from_outside_the_library(tmp_path, cand):
    """A copy of a spec folder elsewhere (same name, e.g. with a weakened
    reference or tolerance) verifies only itself; it never accepts into generated_kernels/."""
    import shutil

    copy = tmp_path / "elsewhere" / "swiglu_fwd"
    shutil.copytree(ROOT / "kernel_specs" / "swiglu_fwd", copy)
    other = load_spec(copy)
    assert other.spec_hash == LOADED.spec_hash  # same bytes: only the folder tells them apart
    with pytest.raises(AcceptError, match="only the library's own specs"):
        accept(other, cand, _verdict(cand), root=tmp_path, provenance=PROV)
    assert not (tmp_path / "generated_kernels" / "swiglu_fwd").exists()
    assert accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV).is_dir()


@pytest.mark.parametrize("sandbox", [None, "off (CODA_FS_SANDBOX=off)", "unavailable: no landlock in this kernel"])
def test_refuses_an_unconfined_verdict_unless_allowed(tmp_path, cand, sandbox):
    v = _verdict(cand, sandbox=sandbox)
    with pytest.raises(AcceptError, match="ran unconfined") as e:
        accept(LOADED, cand, v, root=tmp_path, provenance=PROV)
    assert f"GPU candidate worker: {sandbox or 'not recorded'}" in str(e.value) and "--allow-unconfined" in str(e.value)
    assert not (tmp_path / "generated_kernels").exists() or not any((tmp_path / "generated_kernels").iterdir())
    dest = accept(LOADED, cand, v, root=tmp_path, provenance=PROV, allow_unconfined=True)
    man = json.loads((dest / "manifest.json").read_text())
    assert man["accepted_unconfined"] is True and man["environment"]["worker_sandbox"] == sandbox
    # a confined verdict's manifest carries no such flag
    again = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV, force=True)
    assert "accepted_unconfined" not in json.loads((again / "manifest.json").read_text())


def test_refuses_when_the_compile_worker_ran_unconfined(tmp_path, cand):
    v = _verdict(cand)
    v.stage("compile").metrics = {"sandbox": "off (CODA_FS_SANDBOX=off)"}
    with pytest.raises(AcceptError, match=r"compile worker: off \(CODA_FS_SANDBOX=off\)"):
        accept(LOADED, cand, v, root=tmp_path, provenance=PROV)
    v.stage("compile").metrics = {"sandbox": "landlock ABI 7: writes only beneath 10 path(s)"}
    assert accept(LOADED, cand, v, root=tmp_path, provenance=PROV).is_dir()


def test_writes_kernel_manifest_report(tmp_path, cand):
    dest = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV)
    assert dest == tmp_path / "generated_kernels" / "swiglu_fwd"
    assert (dest / "kernel.py").read_bytes() == cand.read_bytes()
    text = (dest / "manifest.json").read_text()
    man = json.loads(text)
    assert text == json.dumps(man, indent=2, sort_keys=True) + "\n"  # sorted keys
    assert man["spec"] == "swiglu_fwd" and man["spec_hash"] == LOADED.spec_hash
    assert man["kernel_sha256"] == sha256_file(cand) and man["provenance"] == PROV
    assert man["environment"]["gpu"] == "NVIDIA H200" and man["gpu_verified"] is True
    assert man["stages"]["bench"]["metrics"]["shapes"]["llama3-1b/M8192"]["fused_ms"] == 0.81
    assert man["accepted_at"].endswith("Z")
    report = (dest / "REPORT.md").read_text()
    assert "| preact | 0.01 | 0.03 | 0.33 | c0-aligned-s0 |" in report
    assert "| llama3-1b/M8192 | 0.8100 | 679 | 1200 | 0.5600 | 0.8800 | 0.920 | error | - |" in report
    assert "Bar fused/bare_gemm <= 1.03: met; met at 1 of 1 shapes." in report
    leftovers = [p.name for p in (tmp_path / "generated_kernels").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_provenance_value_cannot_add_lines_to_the_report(tmp_path, cand):
    """The model name comes from a run folder the answerer writes: a newline in it must not
    forge lines of the report."""
    prov = {**PROV, "model": "m\n## swiglu_fwd: verified by hand\n- GPU: forged"}
    dest = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=prov)
    report = (dest / "REPORT.md").read_text()
    assert "\n## swiglu_fwd: verified by hand" not in report and "\n- GPU: forged" not in report
    assert "model=m ## swiglu_fwd: verified by hand - GPU: forged" in report


def test_no_overwrite_without_force_then_history(tmp_path, cand, monkeypatch):
    first = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV)
    old_at = json.loads((first / "manifest.json").read_text())["accepted_at"]
    cand.write_text(cand.read_text() + "# v2\n")
    v2 = _verdict(cand)
    with pytest.raises(AcceptError, match=r"already holds an accepted kernel.*--force"):
        accept(LOADED, cand, v2, root=tmp_path, provenance=PROV)
    assert "# v2" not in (first / "kernel.py").read_text()

    monkeypatch.setattr(acc, "_now", lambda: "2030-01-01T00:00:00Z")
    dest = accept(LOADED, cand, v2, root=tmp_path, provenance=PROV, force=True)
    assert "# v2" in (dest / "kernel.py").read_text()
    hist = dest / "history" / old_at.replace(":", "-")
    assert "# v2" not in (hist / "kernel.py").read_text()
    assert not (hist / "kernel.edited.py").exists() and not (hist / "HISTORY_NOTE.md").exists()
    assert json.loads((hist / "manifest.json").read_text())["accepted_at"] == old_at

    cand.write_text(cand.read_text() + "# v3\n")
    monkeypatch.setattr(acc, "_now", lambda: "2031-01-01T00:00:00Z")
    dest = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV, force=True)
    names = sorted(p.name for p in (dest / "history").iterdir())
    assert names == sorted([old_at.replace(":", "-"), "2030-01-01T00-00-00Z"])
    assert not (dest / "history" / "2030-01-01T00-00-00Z" / "history").exists()


def test_history_keeps_the_accepted_bytes_of_a_kernel_edited_in_place(tmp_path, cand, monkeypatch):
    """kernel.py edited in place, then re-accepted with --force (what regress recommends),
    must not leave a history entry pairing the old manifest with the edited bytes. The edited file is kept as kernel.edited.py, kernel.py is the accepted version
    when git HEAD has it (sha256 checked), and a note says which."""
    import subprocess

    first = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV)
    old = json.loads((first / "manifest.json").read_text())
    accepted_bytes = (first / "kernel.py").read_bytes()
    edited = accepted_bytes + b"# edited in place\n"
    (first / "kernel.py").write_bytes(edited)
    monkeypatch.setattr(acc, "_now", lambda: "2030-01-01T00:00:00Z")
    dest = accept(
        LOADED, first / "kernel.py", _verdict(first / "kernel.py"), root=tmp_path, provenance=PROV, force=True
    )
    hist = dest / "history" / old["accepted_at"].replace(":", "-")
    assert (hist / "kernel.edited.py").read_bytes() == edited and not (hist / "kernel.py").exists()
    note = (hist / "HISTORY_NOTE.md").read_text()
    assert old["kernel_sha256"] in note and "not found" in note
    # with the accepted bytes in git HEAD, the entry holds them
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (dest / "kernel.py").write_bytes(b"# v2\n")
    v2 = _verdict(dest / "kernel.py")
    monkeypatch.setattr(acc, "_now", lambda: "2031-01-01T00:00:00Z")
    dest = accept(LOADED, dest / "kernel.py", v2, root=tmp_path, provenance=PROV, force=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "v2"], check=True)
    (dest / "kernel.py").write_bytes(b"# v2 edited\n")
    monkeypatch.setattr(acc, "_now", lambda: "2032-01-01T00:00:00Z")
    dest = accept(LOADED, dest / "kernel.py", _verdict(dest / "kernel.py"), root=tmp_path, provenance=PROV, force=True)
    hist = dest / "history" / "2031-01-01T00-00-00Z"
    assert (hist / "kernel.py").read_bytes() == b"# v2\n"
    assert (hist / "kernel.edited.py").read_bytes() == b"# v2 edited\n"
    assert "restored from git HEAD" in (hist / "HISTORY_NOTE.md").read_text()
    # a kernel.py removed after acceptance: restored from git HEAD too
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "v3"], check=True)
    accepted_v3 = (dest / "kernel.py").read_bytes()
    (dest / "kernel.py").unlink()
    monkeypatch.setattr(acc, "_now", lambda: "2033-01-01T00:00:00Z")
    dest = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV, force=True)
    hist = dest / "history" / "2032-01-01T00-00-00Z"
    assert (hist / "kernel.py").read_bytes() == accepted_v3 and not (hist / "kernel.edited.py").exists()
    assert "held no kernel.py" in (hist / "HISTORY_NOTE.md").read_text()


def test_interrupted_write_leaves_old_version(tmp_path, cand, monkeypatch):
    first = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV)
    before = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    cand.write_text(cand.read_text() + "# v2\n")

    def boom(manifest):
        raise OSError("disk full")

    monkeypatch.setattr(acc, "render_report", boom)
    with pytest.raises(OSError, match="disk full"):
        accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV, force=True)
    after = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    assert after == before
    assert [p.name for p in (tmp_path / "generated_kernels").iterdir()] == ["swiglu_fwd"]


def test_reaccepting_the_same_bytes_keeps_the_authors_provenance(tmp_path, cand, monkeypatch):
    """A spec change (or a new verifier check) means re-verifying the very kernel.py a model
    wrote: `verify K generated_kernels/K/kernel.py --accept --force` must not turn the
    manifest's author into "human". New bytes take the new provenance."""
    monkeypatch.setattr(acc, "_now", lambda: "2030-01-01T00:00:00Z")
    first = accept(LOADED, cand, _verdict(cand), root=tmp_path, provenance=PROV)
    old = json.loads((first / "manifest.json").read_text())
    human = {"backend": "human", "source": "generated_kernels/swiglu_fwd/kernel.py"}
    monkeypatch.setattr(acc, "_now", lambda: "2031-01-01T00:00:00Z")
    again = accept(
        LOADED, first / "kernel.py", _verdict(first / "kernel.py"), root=tmp_path, provenance=human, force=True
    )
    prov = json.loads((again / "manifest.json").read_text())["provenance"]
    assert {k: prov[k] for k in PROV} == PROV
    assert prov["reverified"] == [
        {
            "at": "2031-01-01T00:00:00Z",
            "previous_accepted_at": old["accepted_at"],
            "previous_spec_hash": old["spec_hash"],
            **human,
        }
    ]
    assert "provenance: attempts=2" in (again / "REPORT.md").read_text()
    # changed bytes: the new provenance, no carried authorship
    cand2 = tmp_path / "v2.py"
    cand2.write_text(cand.read_text() + "# v2\n")
    v3 = accept(LOADED, cand2, _verdict(cand2), root=tmp_path, provenance=human, force=True)
    assert json.loads((v3 / "manifest.json").read_text())["provenance"] == human

"""The coda-agent CLI: commands, exit codes (0 ok, 1 check failed, 2 usage/input error)."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_helpers import gone

from coda_agent.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A copy of the workspace (specs, docs, tricks, accepted kernels) as CODA_ROOT."""
    for d in ("kernel_specs", "primitives_docs", "generated_kernels"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tricks_log.md", tmp_path / "tricks_log.md")
    monkeypatch.setenv("CODA_ROOT", str(tmp_path))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return tmp_path


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("generate", "prompt", "verify", "bench", "regress", "list", "tricks", "review"):
        assert cmd in out


def test_list_shows_specs_and_accepted_kernels(ws, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "swiglu_fwd" in out and "swiglu_bwd" in out
    assert "NVIDIA H200" in out  # both accepted kernels were verified on the H200


def test_list_flags_invalid_spec(ws, capsys):
    shutil.copytree(ws / "kernel_specs" / "swiglu_fwd", ws / "kernel_specs" / "broken")
    p = ws / "kernel_specs" / "broken" / "spec.toml"
    p.write_text(
        p.read_text().replace('name = "swiglu_fwd"', 'name = "broken"').replace('pattern = "forward"', 'pattern = "up"')
    )
    assert main(["list"]) == 2
    cap = capsys.readouterr()
    assert "invalid" in cap.out
    err = " ".join(cap.err.split())  # the whole error on stderr, naming the file and the field
    assert err.startswith("error: ") and "broken/spec.toml" in err and "pattern" in err
    # printed as text: no rich markup or emoji codes from the spec's content
    p.write_text(p.read_text().replace('pattern = "up"', 'pattern = "forward"\n"x:smile:[bold]y" = 1'))
    assert main(["list"]) == 2
    assert "x:smile:[bold]y" in capsys.readouterr().err


def test_prompt_prints_spec_docs_and_tricks(ws, capsys):
    assert main(["prompt", "swiglu_bwd"]) == 0
    cap = capsys.readouterr()
    assert "# Task: write the fused kernel `swiglu_bwd`" in cap.out
    assert "packed_cd_b16x2" in cap.out and "Tricks log" in cap.out
    assert "tokens" in cap.err


def test_usage_errors_exit_2(ws, capsys, monkeypatch):
    assert main(["verify", "nope", "x.py"]) == 2
    assert "unknown spec 'nope'" in capsys.readouterr().err
    assert main(["verify", "swiglu_fwd", str(ws / "missing.py")]) == 2
    assert "candidate file not found" in capsys.readouterr().err
    assert main(["generate", "swiglu_bwd"]) == 2
    err = capsys.readouterr().err
    assert "ANTHROPIC_API_KEY" in err and "--llm manual" in err and "--llm command" in err
    assert main(["generate", "swiglu_bwd", "--llm", "commmand"]) == 2
    assert main(["generate", "swiglu_bwd", "--llm", "command"]) == 2
    assert "--cmd" in capsys.readouterr().err
    # already accepted: refused up front on a GPU machine instead of spending LLM calls
    from coda_agent.commands import common

    monkeypatch.setattr(common, "has_gpu", lambda: True)
    assert main(["generate", "swiglu_bwd", "--llm", "manual"]) == 2
    assert "already accepted" in capsys.readouterr().err
    # --accept on a machine that cannot verify is refused before anything runs
    monkeypatch.setattr(common, "has_gpu", lambda: False)
    good = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    assert main(["verify", "swiglu_fwd", str(good), "--accept"]) == 2
    assert "nothing would be accepted, so nothing was run" in capsys.readouterr().err
    assert main(["verify", "swiglu_fwd", str(good), "--force"]) == 2
    assert "--force only applies with --accept" in capsys.readouterr().err
    assert main(["verify", "swiglu_fwd", str(good.parent)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["prompt", "swiglu_bwd", "--out", str(ws / "no" / "such" / "dir.md")]) == 2
    assert main(["regress", "--tolerance", "-5", "--cpu-only"]) == 2
    assert main(["bench"]) == 2
    assert main(["bench", "--merge-from", str(ws)]) == 2
    assert "needs --from-verdicts" in capsys.readouterr().err
    assert main(["bench", "--all", "--force"]) == 2
    assert "--force only applies with --from-verdicts DIR or --from-manifests" in capsys.readouterr().err
    assert main(["bench", "--from-verdicts", str(ws / "nope"), "--merge-from", str(ws)]) == 2
    assert "nope: not a folder of kept verdicts" in capsys.readouterr().err
    assert main(["regress", "nope", "--cpu-only"]) == 2
    assert main(["frobnicate"]) == 2
    capsys.readouterr()
    # checked before any work (a missing folder raised a traceback after the whole run)
    assert main(["verify", "swiglu_fwd", str(good), "--cpu-only", "--json", str(ws / "no" / "v.json")]) == 2
    assert "does not exist" in " ".join(capsys.readouterr().err.split())
    assert main(["regress", "--cpu-only", "--json", str(ws)]) == 2
    assert "is a folder; give a file name" in capsys.readouterr().err
    assert main(["regress", "--cpu-only", "--verdicts", str(ws)]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert main(["--root", str(ws / "nowhere"), "list"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["regress", "swiglu_fwdd"]) == 2  # named before "no GPU", as bench does
    assert "did you mean 'swiglu_fwd'" in " ".join(capsys.readouterr().err.split())
    assert main(["bench", "swiglu_fwdd"]) == 2  # named before "no GPU"
    assert "not accepted kernels: ['swiglu_fwdd'] (did you mean 'swiglu_fwd' for 'swiglu_fwdd'?)" in " ".join(
        capsys.readouterr().err.split()
    )


def test_generate_manual_writes_prompt_and_waits(ws, capsys, monkeypatch):
    assert main(["generate", "--llm", "manual", "swiglu_fwd", "--no-accept"]) == 0
    out = capsys.readouterr().out
    assert "waiting-for-answer" in out
    (run,) = (ws / "runs").iterdir()
    assert (run / "attempt-1" / "prompt.md").read_text().startswith("=== SYSTEM ===")
    # --resume takes the run's name under runs/ as well as its path, from any folder
    monkeypatch.chdir(ws / "generated_kernels")
    assert main(["generate", "swiglu_fwd", "--resume", run.name]) == 0
    assert "waiting-for-answer" in capsys.readouterr().out
    # a folder named like the spec in the current folder does not shadow the spec
    assert main(["prompt", "swiglu_fwd", "--out", str(ws / "p.md")]) == 0
    # without a GPU nothing can be accepted, so an accepted spec needs no --force/--no-accept
    from coda_agent.commands import common

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    assert main(["generate", "--llm", "manual", "swiglu_fwd"]) == 0


def test_review_shows_status_provenance_and_numbers(ws, capsys):
    assert main(["review", "swiglu_bwd"]) == 0
    out = capsys.readouterr().out
    assert "kernel.py matches the verified hash: yes" in out
    assert "spec unchanged since acceptance" in out
    assert "backend: manual" in out and "NVIDIA H200" in out
    assert "fused/quack_library" in out
    # swiglu_bwd's accepted kernel was verified confined on the H200
    assert "candidate confinement during verification: landlock ABI 7" in out


def test_review_reports_edits_and_spec_changes(ws, capsys):
    k = ws / "generated_kernels" / "swiglu_bwd" / "kernel.py"
    k.write_text(k.read_text() + "\n# edited\n")
    p = ws / "kernel_specs" / "swiglu_bwd" / "spec.toml"
    p.write_text(p.read_text().replace("factor = 2.0", "factor = 3.0"))
    assert main(["review", "swiglu_bwd"]) == 0
    out = capsys.readouterr().out
    assert "NO -- edited after verification" in out
    assert "SPEC CHANGED since acceptance (tolerance.factor)" in out


def test_tricks_add_appends_dated_entry(ws, capsys):
    before = (ws / "tricks_log.md").read_text()
    assert main(["tricks", "add", "pin tile_n=128 for the rotary table op", "--kernel", "swiglu_fwd"]) == 0
    after = (ws / "tricks_log.md").read_text()
    assert after.startswith(before) and "pin tile_n=128 for the rotary table op" in after[len(before) :]
    assert main(["tricks", "add"]) == 2
    assert main(["tricks", "add", "x\n## 2099-01-01 — general", "--kernel", "swiglu_fwd"]) == 2
    assert main(["tricks", "add", "some lesson", "--kernel", "doesnotexist"]) == 2
    assert main(["tricks", "add", "pin tile_n=128 for the rotary table op", "--kernel", "swiglu_fwd"]) == 2  # duplicate


def test_tricks_add_from_run_takes_a_run_name(ws, capsys, monkeypatch, tmp_path):
    """--from-run takes a run's name under runs/, as --resume does, not only a path."""
    import json

    run = ws / "runs" / "20260101T000000Z-swiglu_fwd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(
        json.dumps({"spec": "swiglu_fwd", "status": "accepted", "lesson": {"status": "proposed"}})
    )
    (run / "proposed_trick.md").write_text("Name the run, not its path.\n")
    monkeypatch.chdir(tmp_path.parent)  # outside the workspace: the name resolves through CODA_ROOT
    assert main(["tricks", "add", "--from-run", run.name]) == 2  # no accepted kernel vouches for this run
    assert "nothing outside the run folder vouches" in " ".join(capsys.readouterr().err.split())
    assert main(["tricks", "add", "Some text", "--unverified"]) == 2
    assert "--unverified only applies with --from-run" in capsys.readouterr().err
    assert main(["tricks", "add", "--from-run", run.name, "--unverified"]) == 0
    assert "Name the run, not its path." in (ws / "tricks_log.md").read_text()
    assert main(["tricks", "add", "--from-run", "20990101T000000Z-nope"]) == 2
    assert "no such run folder (a path, or a name under" in capsys.readouterr().err
    # a name too long for the file system: a usage error, not an OSError traceback
    assert main(["tricks", "add", "--from-run", "x" * 300]) == 2
    assert main(["generate", "swiglu_fwd", "--llm", "manual", "--cpu-only", "--resume", "x" * 300]) == 2
    assert "no run there" in capsys.readouterr().err


def test_review_of_a_spec_without_accepted_kernel_is_a_clean_usage_error(ws, capsys):
    """`review` on a spec that has no accepted kernel: one error line, exit 2, no traceback."""
    import shutil

    shutil.rmtree(ws / "generated_kernels" / "rms_bwd", ignore_errors=True)
    assert main(["review", "rms_bwd"]) == 2
    captured = capsys.readouterr()
    assert "no accepted kernel" in captured.out + captured.err


def test_atomic_writes_get_the_usual_file_mode(tmp_path):
    import os

    from coda_agent.verifier.workspace import atomic_write_text

    p = tmp_path / "page.md"
    atomic_write_text(p, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert (p.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_gpu_commands_stop_early_without_a_gpu(ws, capsys, monkeypatch):
    """Without a CUDA GPU, bench and regress refuse before compiling anything, and generate
    refuses to spend API tokens on answers that could never be accepted (manual and
    command authors only get a warning: their answers are checked as with --cpu-only)."""
    from coda_agent.verifier.gpu import environment

    monkeypatch.setattr(environment, "cuda_available", lambda: False)
    assert main(["bench", "swiglu_fwd"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert main(["regress"]) == 2
    assert "use --cpu-only" in capsys.readouterr().err
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-never-sent")
    assert main(["generate", "swiglu_fwd", "--no-accept"]) == 2
    assert "spends API tokens" in capsys.readouterr().err
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    # no key and no GPU: the missing key is named first (not one round-trip each)
    assert main(["generate", "--llm", "anthropic", "swiglu_fwd", "--no-accept"]) == 2
    assert "ANTHROPIC_API_KEY is not set" in capsys.readouterr().err
    assert main(["generate", "--llm", "manual", "swiglu_fwd", "--no-accept"]) == 0
    cap = capsys.readouterr()
    assert "cannot be accepted" in cap.err and "waiting-for-answer" in cap.out


def test_a_refused_page_rewrite_changes_nothing_in_the_kept_folder(ws, capsys):
    """--merge-from into a folder whose page is hand-written is refused before any verdict
    there changes (not verdicts rewritten, then the refusal)."""
    res = ws / "results"
    for name in ("2026-11-30-nvidia-h200-resample", "2026-11-30-nvidia-h200-repeat"):
        shutil.copytree(ROOT / "benchmarks" / "results" / name, res / name)
    shutil.copy(ROOT / "benchmarks" / "results" / "2026-11-30-nvidia-h200-resample.md", res)
    dst = res / "2026-11-30-nvidia-h200-resample"
    before = {f.name: f.read_bytes() for f in dst.iterdir()}
    assert main(["bench", "--from-verdicts", str(dst), "--merge-from", str(res / "2026-11-30-nvidia-h200-repeat")]) == 2
    assert "nothing was changed" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in dst.iterdir()} == before


def test_a_resumed_run_on_an_accepted_spec_is_refused_before_the_gpu_stages(ws, capsys, monkeypatch):
    """A run started without a GPU and without --force on an accepted spec is refused up
    front on resume (not resumed on the GPU, verified and benchmarked, and only then refused
    at accept) unless the run (or the resume) says --force or --no-accept; a resumed --llm
    command run is told to give its command again."""
    from coda_agent.commands import common

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    assert main(["generate", "--llm", "manual", "swiglu_fwd"]) == 0
    run = next((ws / "runs").iterdir()).name
    capsys.readouterr()
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    assert main(["generate", "swiglu_fwd", "--resume", run]) == 2
    assert "already accepted" in capsys.readouterr().err
    assert main(["generate", "swiglu_fwd", "--resume", run, "--llm", "command"]) == 2
    assert "give the resumed run its command again" in capsys.readouterr().err


def test_force_is_never_read_from_the_run_folder(ws, capsys, monkeypatch):
    """run.json is the answerer's to write in --llm manual mode; a run.json saying
    "force": true must not replace an accepted kernel on a resume without --force."""
    import json

    from coda_agent.commands import common

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    assert main(["generate", "--llm", "manual", "swiglu_fwd", "--force"]) == 0
    run = next((ws / "runs").iterdir())
    assert json.loads((run / "run.json").read_text())["force"] is True
    assert f"--resume {run.name} --force" in capsys.readouterr().out  # the hint says it again
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    assert main(["generate", "swiglu_fwd", "--resume", run.name]) == 2
    err = capsys.readouterr().err
    assert "already accepted" in err and "never read from the run folder" in err


def test_a_spec_outside_the_library_cannot_start_an_accepting_run(ws, tmp_path, capsys, monkeypatch):
    """A spec folder elsewhere (e.g. a weakened copy of one of ours) is refused before any
    verification when the run would accept; --no-accept runs may use it."""
    import shutil

    from coda_agent.commands import common

    monkeypatch.setattr(common, "has_gpu", lambda: True)
    copy = tmp_path / "elsewhere" / "swiglu_fwd"
    shutil.copytree(ws / "kernel_specs" / "swiglu_fwd", copy)
    assert main(["generate", "--llm", "manual", str(copy), "--force"]) == 2
    assert "is not this workspace's kernel_specs/swiglu_fwd/" in capsys.readouterr().err
    assert not (ws / "runs").exists() or not any((ws / "runs").iterdir())
    assert main(["generate", "--llm", "manual", str(copy), "--no-accept"]) == 0


def test_a_broken_manifest_is_named_not_a_traceback(ws, capsys):
    """A malformed manifest.json is named by `list` and `review`, not a JSONDecodeError;
    `list` also flags a kernel.py edited after acceptance."""
    (ws / "generated_kernels" / "rope_bwd" / "manifest.json").write_text("{bad")
    k = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    k.write_text(k.read_text() + "# edited\n")
    assert main(["list"]) == 2
    out = capsys.readouterr().out
    assert "unreadable manifest" in out and "yes (kernel.py): re-verify" in out
    assert main(["review", "rope_bwd"]) == 2
    err = capsys.readouterr().err
    assert "rope_bwd/manifest.json: unreadable manifest (JSONDecodeError" in err
    assert main(["bench", "--all", "--from-manifests"]) == 2
    assert "manifest.json: unreadable manifest" in capsys.readouterr().err


def test_flags_that_would_be_ignored_are_refused(ws, capsys):
    """`regress --cpu-only --shape foo` and `verify --allow-unconfined` without --accept
    are refused, not silently ignored."""
    assert main(["regress", "--cpu-only", "--shape", "foo"]) == 2
    assert "--cpu-only measures none" in capsys.readouterr().err
    good = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    assert main(["verify", "swiglu_fwd", str(good), "--cpu-only", "--allow-unconfined"]) == 2
    assert "--allow-unconfined only applies with --accept" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_no_bench_without_a_gpu_is_not_verified(ws, capsys):
    """--no-bench skips the benchmark, not the GPU: without a GPU the correctness stage is
    skipped, so nothing was verified and the exit status is 1 (not 0 with passed: true in
    the JSON)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the correctness stage runs")
    good = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    assert main(["verify", "swiglu_fwd", str(good), "--no-bench"]) == 1
    assert "not verified: the GPU stages did not run" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_prints_notes_of_a_passing_stage(ws, capsys):
    """A mod called without tuned=False passes compile with a tuned-default note: it is
    printed, not only in the JSON."""
    src = (ws / "generated_kernels" / "swiglu_fwd" / "kernel.py").read_text()
    assert "tuned=False" in src
    cand = ws / "untuned.py"
    cand.write_text(src.replace("tuned=False, ", "").replace(", tuned=False", "").replace("tuned=False", ""))
    assert main(["verify", "swiglu_fwd", str(cand), "--cpu-only"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "compile note [tuned-default]" in out and "tuned=False" in out


def test_a_committed_run_record_is_not_resumed(ws, capsys, monkeypatch):
    """A run under benchmarks/results/runs/ is a record: resuming it would rewrite its
    tracked run.json and name the other checkout's path as the accepted kernel."""
    rec = sorted((ROOT / "benchmarks" / "results" / "runs").glob("*-swiglu_fwd"))[-1]
    dest = ws / "benchmarks" / "results" / "runs" / rec.name
    shutil.copytree(rec, dest)
    before = (dest / "run.json").read_bytes()
    monkeypatch.chdir(ws)
    for ref in (str(dest), str(dest.relative_to(ws))):
        assert (
            main(["--root", str(ws), "generate", "swiglu_fwd", "--resume", ref, "--llm", "manual", "--cpu-only"]) == 2
        )
        assert "is a committed run record" in capsys.readouterr().err
    assert (dest / "run.json").read_bytes() == before and not (dest / ".lock").exists()
    # the suggested copy works in a checkout without runs/ (it is git-ignored)
    assert main(["--root", str(ws), "generate", "swiglu_fwd", "--resume", str(dest), "--llm", "manual"]) == 2
    msg = " ".join(capsys.readouterr().err.split())
    cmd = msg.split("copy it into runs/ first: ", 1)[1].strip()
    assert cmd == f"mkdir -p {ws / 'runs'} && cp -r {dest.resolve()} {ws / 'runs' / rec.name}"
    import subprocess

    assert not (ws / "runs").exists()
    subprocess.run(cmd, shell=True, check=True)
    assert (ws / "runs" / rec.name / "run.json").read_bytes() == before


def test_resuming_a_run_of_another_spec_is_refused_before_any_warning(ws, capsys, monkeypatch):
    """The usage error comes first, without the unrelated no-GPU warning."""
    from coda_agent.verifier.gpu import environment

    monkeypatch.setattr(environment, "cuda_available", lambda: False)
    assert main(["generate", "swiglu_fwd", "--llm", "manual", "--no-accept"]) == 0
    run = next((ws / "runs").iterdir())
    capsys.readouterr()
    assert main(["generate", "swiglu_bwd", "--resume", run.name]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(f"error: --resume {run.name}: a run of spec 'swiglu_fwd', not 'swiglu_bwd'")
    assert "no CUDA GPU" not in err


def test_a_workspace_under_a_folder_named_like_the_records_can_resume(tmp_path, monkeypatch, capsys):
    """Only a run folder directly in benchmarks/results/runs/ is a record: a checkout that
    itself lives below such a path resumes as any other."""
    ws = tmp_path / "benchmarks" / "results" / "runs" / "ws"
    for d in ("kernel_specs", "primitives_docs", "generated_kernels"):
        shutil.copytree(ROOT / d, ws / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tricks_log.md", ws / "tricks_log.md")
    monkeypatch.chdir(ws)
    assert main(["--root", str(ws), "generate", "swiglu_fwd", "--llm", "manual", "--cpu-only", "--no-accept"]) == 0
    run = next((ws / "runs").iterdir())
    assert (
        main(
            [
                "--root",
                str(ws),
                "generate",
                "swiglu_fwd",
                "--resume",
                run.name,
                "--llm",
                "manual",
                "--cpu-only",
                "--no-accept",
            ]
        )
        == 0
    )
    assert "committed run record" not in capsys.readouterr().err


def test_a_library_the_verifier_cannot_import_is_a_verifier_error_not_the_candidates(ws, monkeypatch, capsys):
    """quack.activation needs triton; without it the accepted swiglu_fwd kernel must not fail
    the static stage as `unknown-name` (exit 1, and in `generate` a spent attempt with that
    feedback for the model): it is a verifier error naming the module and the fix, exit 2."""
    from coda_agent.verifier.static import surface

    real = surface._import.__wrapped__
    monkeypatch.setattr(
        surface,
        "_import",
        lambda name: (
            (None, "ModuleNotFoundError: No module named 'triton'") if name == "quack.activation" else real(name)
        ),
    )
    surface.judge.cache_clear()
    try:
        rc = main(["verify", "swiglu_fwd", str(ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"), "--cpu-only"])
    finally:
        surface.judge.cache_clear()
    out = capsys.readouterr()
    assert rc == 2
    text = " ".join((out.out + out.err).split())
    assert "verifier error in the static stage" in text and "not the candidate" in text
    assert "quack.activation" in text and "No module named 'triton'" in text and "cpu-compile" in text
    # the message is the fix: no traceback, said once
    assert "Traceback" not in text and text.count("cannot be imported in the verifier") <= 2


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("coda-agent ")


def test_verify_with_swapped_arguments_says_so(ws, capsys):
    cand = str(ws / "generated_kernels" / "swiglu_fwd" / "kernel.py")
    assert main(["verify", cand, "swiglu_fwd"]) == 2
    assert "arguments swapped?" in " ".join(capsys.readouterr().err.split())


def test_a_syntax_error_names_the_users_file_not_the_verifiers_copy(ws, tmp_path, capsys):
    bad = tmp_path / "syn.py"
    bad.write_text("import torch\ndef f(:\n")
    assert main(["verify", "swiglu_fwd", str(bad), "--cpu-only"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "syn.py:2: syntax error" in out and "coda-candidate-" not in out


def test_bench_from_manifests_renders_the_whole_page_and_refuses_ignored_flags(ws, capsys):
    """`bench swiglu_fwd --from-manifests` would replace the day's 12-section manifests page
    with 2 sections, and --shape/--repeat would be ignored: both are refused."""
    assert main(["bench", "swiglu_fwd", "--from-manifests"]) == 2
    assert "use --all" in capsys.readouterr().err
    for extra in (["--shape", "llama3-8b/M8192"], ["--repeat", "3"], ["--jobs", "2"]):
        assert main(["bench", "--all", "--from-manifests", *extra]) == 2
        assert f"so {extra[0]} would be ignored" in " ".join(capsys.readouterr().err.split())


def test_list_shows_an_accepted_kernel_whose_spec_is_gone(ws, capsys):
    shutil.rmtree(ws / "kernel_specs" / "rope_bwd")
    assert main(["list"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "rope_bwd" in out and "spec missing" in out


def test_generate_checks_its_flags_before_anything_else(ws, capsys):
    """--max-attempts 0 is reported before (and without) the no-GPU warning, and --force
    with --no-accept is refused."""
    assert main(["generate", "swiglu_bwd", "--llm", "manual", "--max-attempts", "0"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--max-attempts 0: expected an integer >= 1" in err and "no CUDA GPU" not in err
    assert main(["generate", "swiglu_bwd", "--llm", "manual", "--force", "--no-accept"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_an_unconfined_run_is_announced(ws, monkeypatch, capsys):
    monkeypatch.setenv("CODA_FS_SANDBOX", "off")
    assert main(["verify", "nope", "x.py"]) == 2
    assert "CODA_FS_SANDBOX=off: candidate code runs unconfined" in " ".join(capsys.readouterr().err.split())
    assert main(["list"]) == 0
    assert "unconfined" not in capsys.readouterr().err


def test_output_flags_never_write_into_the_library_or_specs(ws, capsys):
    """`prompt --out generated_kernels/swiglu_bwd/kernel.py`, `verify --json <manifest>` and
    `regress --json <kernel.py>` would replace accepted files, and `verify --json CANDIDATE`
    the candidate itself. Each is refused before any work."""
    kdir = ws / "generated_kernels" / "swiglu_bwd"
    before = {p.name: p.read_bytes() for p in kdir.iterdir() if p.is_file()}
    good = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    cand = ws / "cand.py"
    cand.write_bytes(good.read_bytes())
    for argv in (
        ["prompt", "swiglu_bwd", "--out", str(kdir / "kernel.py")],
        ["verify", "swiglu_fwd", str(cand), "--cpu-only", "--json", str(kdir / "manifest.json")],
        ["regress", "--cpu-only", "swiglu_bwd", "--json", str(kdir / "kernel.py")],
        ["prompt", "swiglu_bwd", "--out", str(ws / "kernel_specs" / "swiglu_bwd" / "spec.toml")],
        ["bench", "--all", "--from-manifests", "--out", str(kdir / "pages")],
    ):
        assert main(argv) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert "which output flags never write" in err, (argv, err)
    assert main(["verify", "swiglu_fwd", str(cand), "--cpu-only", "--json", str(cand)]) == 2
    assert "is the candidate itself" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in kdir.iterdir() if p.is_file()} == before
    assert cand.read_bytes() == good.read_bytes() and not (kdir / "pages").exists()
    # bench --from-verdicts DIR inside the library: --merge-from would copy into it, and the page goes beside it
    assert main(["bench", "--from-verdicts", str(kdir), "--merge-from", str(ws)]) == 2
    assert "which output flags never write" in " ".join(capsys.readouterr().err.split())
    # a symlink loop is a usage error, not a traceback
    (ws / "loopy").symlink_to(ws / "loopy")
    assert main(["prompt", "swiglu_bwd", "--out", str(ws / "loopy")]) == 2
    assert "cannot resolve the path" in capsys.readouterr().err
    # bench --out: a folder whose parent is missing is a typo, not created
    assert main(["bench", "--all", "--from-manifests", "--out", str(ws / "no" / "such")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (ws / "no").exists()


def test_a_usage_error_is_one_line_however_long(ws, capsys):
    """rich wraps at 160 columns when stderr is not a terminal, which would split 'does not
    exist' after a long temporary path over two lines (and a script grepping the message
    would miss it). Errors are soft-wrapped: one line."""
    deep = ws / ("d" * 150) / "no" / "such"
    deep.parent.parent.mkdir()
    assert main(["bench", "--all", "--from-manifests", "--out", str(deep)]) == 2
    err = capsys.readouterr().err
    assert len(err) > 200 and err.count("\n") == 1 and "does not exist" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("sig,rc", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_generate_kills_its_llm_command(ws, tmp_path, sig, rc):
    """Ctrl-C or SIGTERM of `generate --llm command` kills the command (its own session: no
    terminal signal reaches it), which would otherwise run on with nobody reading its answer
    and, for a paid LLM tool, still spending; SIGTERM also runs every cleanup (run.json does
    not stay 'running')."""
    pidfile = tmp_path / "cmd.pid"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 120\n")
    script.chmod(0o755)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coda_agent.cli",
            "generate",
            "swiglu_bwd",
            "--llm",
            "command",
            "--cmd",
            str(script),
            "--no-accept",
            "--cpu-only",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ws,
    )
    deadline = time.monotonic() + 120
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    child = int(pidfile.read_text())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, err.decode()
    deadline = time.monotonic() + 10
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(child), "the --llm command outlived coda-agent"
    (run,) = (ws / "runs").iterdir()
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"


def test_bench_refuses_flags_it_would_ignore(ws, capsys):
    """`bench --from-verdicts DIR swiglu_bwd` would rewrite every kernel's page, and
    --shape/--repeat/--jobs would be ignored with exit 0: each is refused."""
    kept = ws / "kept"
    kept.mkdir()
    for extra, named in (
        (["swiglu_bwd"], "SPEC names"),
        (["--shape", "x"], "--shape"),
        (["--repeat", "3"], "--repeat"),
        (["--jobs", "2"], "--jobs"),
        (["--from-manifests"], "--from-manifests"),
        (["--all"], "--all"),
    ):
        assert main(["bench", "--from-verdicts", str(kept), *extra]) == 2, extra
        assert f"so {named} would be ignored" in " ".join(capsys.readouterr().err.split())
    assert main(["bench", "swiglu_bwd", "--repeat", "0"]) == 2
    assert "--repeat 0: expected an integer >= 1" in capsys.readouterr().err


def test_generate_exits_2_when_the_verifier_fails(ws, capsys, monkeypatch):
    """A run ending 'verifier-error' exits 2, as `verify` does for the same machine failure,
    not 1, the status of a rejected candidate."""
    import coda_agent.agent.loop as loop
    from coda_agent.verifier.verdict import StageResult, Verdict

    broken = Verdict(
        spec="swiglu_fwd",
        spec_hash="h",
        candidate_hash="c",
        cpu_only=True,
        stages=[StageResult(stage="static", status="error", summary="[cpu-compile] extra is missing")],
    )
    monkeypatch.setattr(loop, "default_verifier", lambda **kw: lambda loaded, cand, workdir: broken)
    answer = ws / "answer.sh"
    good = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    answer.write_text(f"#!/bin/sh\necho '```python'\ncat '{good}'\necho '```'\n")
    answer.chmod(0o755)
    rc = main(["generate", "swiglu_fwd", "--llm", "command", "--cmd", str(answer), "--cpu-only"])
    out = capsys.readouterr()
    assert rc == 2, out
    assert "[cpu-compile] extra is missing" in out.out + out.err


def test_list_shows_a_spec_folder_without_its_spec_file(ws, capsys):
    """A kernel_specs/ folder whose file is misnamed (spec.tml) is listed, with the reason."""
    (ws / "kernel_specs" / "my_op").mkdir()
    (ws / "kernel_specs" / "my_op" / "spec.tml").write_text("name = 'my_op'\n")
    assert main(["list"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "my_op" in out and "no spec.toml" in out and "spec.tml" in out


def test_generate_names_runs_and_flags_it_cannot_use(ws, capsys):
    """A run's name given as the spec is named as a run, not "unknown spec"; `--resume
    nosuchrun` names the path once; --model with --llm manual is refused, not ignored."""
    run = ws / "runs" / "20301212T000000Z-swiglu_fwd"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    assert main(["generate", run.name, "--llm", "manual"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is a run, not a spec" in err and f"--resume {run.name}" in err and "e.g. swiglu_fwd" in err
    assert main(["generate", "swiglu_fwd", "--resume", "nosuchrun", "--llm", "manual"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--resume nosuchrun: no run there" in err and err.count("nosuchrun: nosuchrun") == 0
    assert main(["generate", "swiglu_fwd", "--llm", "manual", "--model", "foo", "--cpu-only"]) == 2
    assert "--model is for --llm anthropic" in capsys.readouterr().err


def test_output_flags_protect_the_installed_library_whatever_the_root(tmp_path, monkeypatch, capsys):
    """With CODA_ROOT naming another workspace, the installed package's folders stay
    protected too: `prompt --out <package>/generated_kernels/swiglu_fwd/kernel.py` must not
    replace the kernel `import coda_agent.kernels` loads."""
    import coda_agent.kernels as K

    other = tmp_path / "other"
    shutil.copytree(ROOT / "kernel_specs", other / "kernel_specs")
    shutil.copytree(ROOT / "primitives_docs", other / "primitives_docs")
    (other / "generated_kernels").mkdir()
    monkeypatch.setenv("CODA_ROOT", str(other))
    target = Path(K.__path__[0]) / "swiglu_fwd" / "kernel.py"
    before = target.read_bytes()
    assert main(["prompt", "swiglu_fwd", "--out", str(target)]) == 2
    assert "which output flags never write" in " ".join(capsys.readouterr().err.split())
    assert target.read_bytes() == before


@pytest.mark.slow
def test_bench_from_manifests_never_replaces_a_page_it_did_not_write(ws, capsys, tmp_path):
    """A hand-written page of the manifests page's name is not overwritten (the README
    promises such pages need --force)."""
    out = tmp_path / "pages"
    out.mkdir()
    assert main(["bench", "--all", "--from-manifests", "--out", str(out)]) == 0
    [page] = out.glob("*-manifests.md")
    assert page.read_text().rstrip().endswith("so edits here are lost -->")
    assert main(["bench", "--all", "--from-manifests", "--out", str(out)]) == 0  # its own page: rewritten
    page.write_text("hand-written record\n")
    capsys.readouterr()
    assert main(["bench", "--all", "--from-manifests", "--out", str(out)]) == 2
    assert "was not written by `coda-agent bench --from-manifests`" in " ".join(capsys.readouterr().err.split())
    assert page.read_text() == "hand-written record\n"
    assert main(["bench", "--all", "--from-manifests", "--out", str(out), "--force"]) == 0
    assert page.read_text().startswith("# coda-agent benchmark")


def test_an_output_flag_replaces_only_its_own_earlier_output(ws, capsys):
    """`verify --json tricks_log.md` and `prompt --out tricks_log.md` would replace the
    lessons every prompt carries, and `regress --json` a kept GPU verdict. An existing file
    is replaced only when it is that flag's earlier output."""
    log = ws / "tricks_log.md"
    before = log.read_bytes()
    good = ws / "generated_kernels" / "swiglu_fwd" / "kernel.py"
    kept = ws / "kept-verdict.json"
    kept.write_text('{"spec": "swiglu_fwd", "stages": []}')  # a kept verdict: no outcome fields
    for argv in (
        ["verify", "swiglu_fwd", str(good), "--cpu-only", "--json", str(log)],
        ["prompt", "swiglu_fwd", "--out", str(log)],
        ["regress", "--cpu-only", "swiglu_fwd", "--json", str(kept)],
    ):
        assert main(argv) == 2, argv
        assert "exists and is not" in " ".join(capsys.readouterr().err.split()), argv
    assert log.read_bytes() == before and kept.read_text() == '{"spec": "swiglu_fwd", "stages": []}'
    # its own earlier output is replaced
    out = ws / "prompt.md"
    assert main(["prompt", "swiglu_fwd", "--out", str(out)]) == 0
    assert main(["prompt", "swiglu_fwd", "--out", str(out)]) == 0
    assert out.read_text().startswith("=== SYSTEM ===")


def test_generate_exits_2_when_the_llm_command_fails(ws, capsys):
    """A --cmd that exits non-zero (or prints nothing) is a machine failure, exit 2, not a
    'failed' run with exit 1, the status of a rejected candidate."""
    for cmd in ("echo boom >&2; exit 4", "true"):
        rc = main(["generate", "swiglu_fwd", "--llm", "command", "--cmd", cmd, "--cpu-only"])
        out = capsys.readouterr()
        assert rc == 2, (cmd, out)
        assert "--llm command" in out.out + out.err


def test_bench_names_the_page_its_plot_or_why_there_is_none(tmp_path):
    from types import SimpleNamespace

    from coda_agent.commands.bench import _wrote

    page = tmp_path / "page.md"
    plotted = SimpleNamespace(markdown_path=page, plot_path=tmp_path / "page.png")
    assert _wrote(plotted, note_stale_plot=True) == f"wrote {page} and {tmp_path / 'page.png'}"
    bare = SimpleNamespace(markdown_path=page, plot_path=None)
    why = " (no plot: matplotlib is not installed; pip install -e '.[bench]')"
    assert _wrote(bare, note_stale_plot=True) == f"wrote {page}{why}"
    (tmp_path / "page.png").write_bytes(b"")  # a plot left from an earlier rendering
    assert _wrote(bare, note_stale_plot=True) == (
        f"wrote {page} (no plot: matplotlib is not installed; pip install -e '.[bench]'; "
        "page.png beside the page is from an earlier rendering)"
    )
    assert _wrote(bare, note_stale_plot=False) == f"wrote {page}{why}"

"""The generate loop: repair on feedback, lessons, acceptance, and resumability."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from agent_helpers import BAD_MODULE, FAIL_MESSAGE, GOOD_MODULE, FakeVerifier, reply

from coda_agent.agent.llm.base import LLMError, LLMResponse, Usage
from coda_agent.agent.llm.manual import ManualBackend
from coda_agent.agent.llm.scripted import ScriptedBackend
from coda_agent.agent.loop import RunError, generate, load_run
from coda_agent.verifier.spec import load_spec

LESSON = "Write every column of the ragged last N tile: poisoned NaN memory shows any tile you skip."


class Acceptor:
    def __init__(self, fail: Exception | None = None):
        self.calls: list[dict] = []
        self.fail = fail

    def __call__(self, loaded, candidate, verdict, *, root, provenance, force):
        self.calls.append(
            dict(
                loaded=loaded,
                candidate=Path(candidate),
                verdict=verdict,
                root=root,
                provenance=provenance,
                force=force,
                source=Path(candidate).read_text(),
            )
        )
        if self.fail:
            raise self.fail
        from coda_agent.verifier.library.accept import build_manifest

        dest = Path(root) / "generated_kernels" / loaded.name  # the manifest accept() writes (the loop reads it back)
        dest.mkdir(parents=True, exist_ok=True)
        man = build_manifest(loaded, Path(candidate).read_bytes(), verdict, provenance, "2030-01-01T00:00:00Z")
        (dest / "manifest.json").write_text(json.dumps(man))
        return dest


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_fail_feedback_pass_lesson_accept(workspace, fwd_spec, fake_verifier):
    backend = ScriptedBackend(
        [
            LLMResponse(
                text=reply(BAD_MODULE),
                model="m-1",
                usage=Usage(input_tokens=9000, output_tokens=800, cache_creation_input_tokens=8000),
            ),
            LLMResponse(
                text=reply(GOOD_MODULE),
                model="m-1",
                usage=Usage(input_tokens=1500, output_tokens=900, cache_read_input_tokens=8000),
            ),
            LLMResponse(
                text=f"{LESSON}\n",
                model="m-1",
                usage=Usage(input_tokens=700, output_tokens=40, cache_read_input_tokens=8000),
            ),
        ]
    )
    acc = Acceptor()
    run_dir = workspace / "runs" / "r1"
    s = generate(
        fwd_spec, root=workspace, backend=backend, verifier=fake_verifier, run_dir=run_dir, accept_fn=acc, force=True
    )
    assert s.status == "accepted"
    assert [a.stage_reached for a in s.attempts] == ["correctness", "bench"]
    assert [a.passed for a in s.attempts] == [False, True]
    assert [a.kind for a in s.attempts] == ["task", "repair"]
    assert len(fake_verifier.calls) == 2
    assert fake_verifier.calls[1][1] == run_dir / "attempt-2" / "candidate.py"
    assert fake_verifier.calls[1][2] == run_dir / "attempt-2" / "verify"

    # the repair prompt carries the verifier feedback and the previous candidate
    repair = backend.prompts[1]
    assert repair.kind == "repair"
    last = repair.messages[-1]["content"]
    assert FAIL_MESSAGE in last
    assert "# attempt one" in last  # the previous candidate
    assert repair.system_blocks == backend.prompts[0].system_blocks  # cache prefix unchanged
    fb = (run_dir / "attempt-1" / "feedback.md").read_text()
    assert FAIL_MESSAGE in fb

    # files of each attempt
    for k in (1, 2):
        d = run_dir / f"attempt-{k}"
        for f in ("prompt.md", "prompt.json", "response.md", "response.json", "candidate.py", "verdict.json"):
            assert (d / f).is_file(), (k, f)
    assert (run_dir / "attempt-2" / "prompt.md").read_text() == repair.as_text()
    assert (run_dir / "attempt-2" / "candidate.py").read_text() == GOOD_MODULE
    v = json.loads((run_dir / "attempt-1" / "verdict.json").read_text())
    assert v["stages"][2]["findings"][0]["message"] == FAIL_MESSAGE

    # accept_fn got the candidate, the verdict and the provenance
    assert len(acc.calls) == 1
    call = acc.calls[0]
    assert call["source"] == GOOD_MODULE and call["force"] is True and call["root"] == workspace
    assert call["verdict"].gpu_verified
    prov = call["provenance"]
    assert prov == {
        "backend": "scripted",
        "model": "m-1",
        "prompt_sha256": hashlib.sha256((run_dir / "attempt-2" / "prompt.md").read_bytes()).hexdigest(),
        "attempts": 2,
        "run_dir": str(run_dir),
        "answer_received_here": True,  # this process called the backend for attempt 2
    }
    assert s.state.accepted_path == str(workspace / "generated_kernels" / "swiglu_fwd")

    # the lesson: asked with the failure feedback and the diff, saved, NOT appended
    lesson_prompt = backend.prompts[2]
    assert lesson_prompt.kind == "lesson"
    assert FAIL_MESSAGE in lesson_prompt.messages[0]["content"]
    assert "+# FIXED: write the ragged tile" in lesson_prompt.messages[0]["content"]
    assert (run_dir / "proposed_trick.md").read_text() == LESSON + "\n"
    assert s.state.lesson.status == "proposed" and s.state.lesson.text == LESSON
    assert LESSON not in (workspace / "tricks_log.md").read_text()

    # totals and the summary
    assert s.usage.input_tokens == 11200 and s.usage.output_tokens == 1740
    assert s.usage.cache_read_input_tokens == 16000 and s.cache_hits == 2
    rj = run_json(run_dir)
    assert rj["status"] == "accepted" and rj["spec"] == "swiglu_fwd" and rj["spec_hash"] == fwd_spec.spec_hash
    assert rj["backend"] == "scripted"
    assert rj["attempts"][0]["usage"]["cache_creation_input_tokens"] == 8000
    text = s.render()
    assert "accepted" in text and "cache hits 2" in text and "coda-agent tricks add --from-run" in text


def test_run_json_written_after_every_step(workspace, fwd_spec):
    seen = []

    def verifier(loaded, candidate, workdir):
        rj = run_json(candidate.parent.parent)
        seen.append((rj["status"], rj["attempts"][-1]["step"], (candidate.parent / "response.md").is_file()))
        return FakeVerifier()(loaded, candidate, workdir)

    generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=verifier,
        run_dir=workspace / "runs" / "r",
    )
    assert seen == [("running", "responded", True)]


def test_out_of_attempts(workspace, fwd_spec, fake_verifier):
    backend = ScriptedBackend([reply(BAD_MODULE)] * 3)
    acc = Acceptor()
    s = generate(
        fwd_spec,
        root=workspace,
        backend=backend,
        verifier=fake_verifier,
        max_attempts=3,
        run_dir=workspace / "runs" / "r",
        accept_fn=acc,
    )
    assert s.status == "out-of-attempts"
    assert len(s.attempts) == 3 and len(fake_verifier.calls) == 3 and backend.calls == 3
    assert acc.calls == [] and s.proposed_trick is None
    assert "attempt 3 of 3" in backend.prompts[2].messages[-1]["content"]
    # no "next attempt" when there is none: the summary says how to allow one
    text = s.render()
    assert "the feedback the next attempt gets" not in text
    assert "generate swiglu_fwd --resume r --max-attempts 4)" in text and "to try again: coda-agent" in text
    # resuming with a higher limit continues from attempt 4 without redoing 1..3
    backend2 = ScriptedBackend([reply(GOOD_MODULE), LESSON])
    s2 = generate(
        fwd_spec,
        root=workspace,
        backend=backend2,
        verifier=fake_verifier,
        max_attempts=4,
        resume=s.run_dir,
        accept_fn=acc,
    )
    assert s2.status == "accepted" and len(s2.attempts) == 4
    assert backend2.calls == 2 and len(fake_verifier.calls) == 4


def test_a_resume_keeps_the_runs_max_attempts(workspace, fwd_spec, fake_verifier):
    """With --llm manual every step is a resume: a run started with max_attempts=1 must not
    go on to attempt 2 (or record 5) when the resume does not repeat the flag. None keeps
    the run's own limit; a number given on resume replaces it."""
    run_dir = workspace / "runs" / "m1"
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, run_dir=run_dir, max_attempts=1
    )
    assert s.status == "waiting-for-answer" and s.state.max_attempts == 1
    (run_dir / "attempt-1" / "response.md").write_text(reply(BAD_MODULE))
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=run_dir)
    assert s.status == "out-of-attempts" and s.state.max_attempts == 1 and len(s.attempts) == 1
    assert run_json(run_dir)["max_attempts"] == 1
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=run_dir, max_attempts=2
    )
    assert s.status == "waiting-for-answer" and s.state.answer_path.endswith("attempt-2/response.md")
    new = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, run_dir=workspace / "runs" / "m2"
    )
    assert new.state.max_attempts == 5


def test_a_resume_refuses_a_limit_below_the_attempts_made(workspace, fwd_spec, fake_verifier):
    """A 3-attempt run resumed with --max-attempts 1 would end "out-of-attempts" (the replay
    stops at attempt 1) and keep the limit: refused, naming the count, and the run is left
    as it was."""
    backend = ScriptedBackend([reply(BAD_MODULE)] * 3)
    s = generate(
        fwd_spec,
        root=workspace,
        backend=backend,
        verifier=fake_verifier,
        max_attempts=3,
        run_dir=workspace / "runs" / "r",
    )
    assert s.status == "out-of-attempts" and len(s.attempts) == 3
    before = run_json(s.run_dir)
    with pytest.raises(RunError, match=r"has made 3 attempt\(s\); --max-attempts must be at least 3 \(got 2\)"):
        generate(
            fwd_spec,
            root=workspace,
            backend=ScriptedBackend([]),
            verifier=fake_verifier,
            max_attempts=2,
            resume=s.run_dir,
        )
    assert run_json(s.run_dir) == before
    again = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=fake_verifier, max_attempts=3, resume=s.run_dir
    )
    assert again.status == "out-of-attempts" and len(again.attempts) == 3


def test_extraction_error_is_fed_back(workspace, fwd_spec, fake_verifier):
    backend = ScriptedBackend(["I would use acc_pair mode here, no code yet.", reply(GOOD_MODULE)])
    s = generate(
        fwd_spec,
        root=workspace,
        backend=backend,
        verifier=fake_verifier,
        run_dir=workspace / "runs" / "r",
        accept_fn=Acceptor(),
    )
    assert s.status == "accepted"
    a1 = s.attempts[0]
    assert a1.stage_reached == "extract" and a1.passed is False and "no ```python code block" in a1.extract_error
    assert len(fake_verifier.calls) == 1  # nothing to verify in attempt 1
    assert not (s.run_dir / "attempt-1" / "candidate.py").exists()
    repair = backend.prompts[1].messages[-1]["content"]
    assert "no ```python code block" in repair and "No module could be extracted" in repair
    assert backend.prompts[1].messages[1]["content"] == "I would use acc_pair mode here, no code yet."
    # no lesson from an extraction failure (nothing to diff)
    assert s.state.lesson.status == "skipped" and backend.calls == 2


def test_manual_backend_stops_and_resumes(workspace, fwd_spec, fake_verifier):
    acc = Acceptor()
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ManualBackend(),
        verifier=fake_verifier,
        run_dir=workspace / "runs" / "m",
        accept_fn=acc,
    )
    a1 = s.run_dir / "attempt-1"
    assert s.status == "waiting-for-answer"
    assert s.state.answer_path == str(a1 / "response.md")
    assert (a1 / "prompt.md").read_text().startswith("=== SYSTEM ===")
    assert "waiting for the answer" in s.render() and str(a1 / "response.md") in s.render()
    assert run_json(s.run_dir)["status"] == "waiting-for-answer"
    # resume without an answer: still waiting, nothing verified
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, accept_fn=acc
    )
    assert s.status == "waiting-for-answer" and fake_verifier.calls == []
    # an empty (or blank) response.md is no answer either: no attempt is spent on it
    (a1 / "response.md").write_text("\n  \n")
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, accept_fn=acc
    )
    assert s.status == "waiting-for-answer" and s.state.answer_path.endswith("attempt-1/response.md")
    assert s.attempts[0].extract_error is None and fake_verifier.calls == []

    (a1 / "response.md").write_text(reply(BAD_MODULE))
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, accept_fn=acc
    )
    assert s.status == "waiting-for-answer" and s.state.answer_path.endswith("attempt-2/response.md")
    assert FAIL_MESSAGE in (s.run_dir / "attempt-2" / "prompt.md").read_text()
    # the summary says why attempt 1 failed and where its feedback is
    assert "attempt 1: failed the " in s.render() and str(a1 / "feedback.md") in s.render()

    (s.run_dir / "attempt-2" / "response.md").write_text(reply(GOOD_MODULE))
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, accept_fn=acc
    )
    assert s.status == "accepted" and len(acc.calls) == 1
    assert s.state.lesson.status == "waiting-for-answer"
    lesson_dir = s.run_dir / "lesson"
    assert s.state.lesson.answer_path == str(lesson_dir / "response.md")
    assert "ONE sentence" in (lesson_dir / "prompt.md").read_text()

    (lesson_dir / "response.md").write_text(f"- {LESSON}\n")
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, accept_fn=acc
    )
    assert s.status == "accepted" and len(acc.calls) == 1  # not accepted twice
    assert (s.run_dir / "proposed_trick.md").read_text() == LESSON + "\n"
    assert len(fake_verifier.calls) == 2


def test_resume_after_interrupt_in_verifier(workspace, fwd_spec):
    verifier = FakeVerifier(raise_on_call={1: KeyboardInterrupt()})
    backend = ScriptedBackend([reply(GOOD_MODULE)])
    run_dir = workspace / "runs" / "i"
    with pytest.raises(KeyboardInterrupt):
        generate(fwd_spec, root=workspace, backend=backend, verifier=verifier, run_dir=run_dir)
    rj = run_json(run_dir)
    assert rj["status"] == "interrupted" and rj["attempts"][0]["step"] == "responded"
    assert (run_dir / "attempt-1" / "response.md").is_file()
    assert not (run_dir / "attempt-1" / "verdict.json").exists()

    fresh = ScriptedBackend([])  # any LLM call would fail the run
    s = generate(fwd_spec, root=workspace, backend=fresh, verifier=verifier, resume=run_dir, accept_fn=Acceptor())
    assert s.status == "accepted" and fresh.calls == 0
    assert len(verifier.calls) == 2 and (run_dir / "attempt-1" / "verdict.json").is_file()


def test_resume_after_interrupt_in_llm_call(workspace, fwd_spec, fake_verifier):
    backend = ScriptedBackend([reply(BAD_MODULE), KeyboardInterrupt()])
    run_dir = workspace / "runs" / "j"
    with pytest.raises(KeyboardInterrupt):
        generate(fwd_spec, root=workspace, backend=backend, verifier=fake_verifier, run_dir=run_dir)
    assert run_json(run_dir)["status"] == "interrupted"
    assert (run_dir / "attempt-2" / "prompt.json").is_file() and not (run_dir / "attempt-2" / "response.md").exists()
    prompt2 = (run_dir / "attempt-2" / "prompt.md").read_text()

    backend2 = ScriptedBackend([reply(GOOD_MODULE), LESSON])
    s = generate(
        fwd_spec, root=workspace, backend=backend2, verifier=fake_verifier, resume=run_dir, accept_fn=Acceptor()
    )
    assert s.status == "accepted"
    assert backend2.calls == 2  # attempt 2 + lesson; attempt 1 not asked again
    assert backend2.prompts[0].as_text() == prompt2  # the saved prompt is reused verbatim
    assert len(fake_verifier.calls) == 2  # attempt 1 not verified again
    assert (run_dir / "proposed_trick.md").is_file()


def test_llm_error_fails_run_and_resume_continues(workspace, fwd_spec, fake_verifier):
    backend = ScriptedBackend([LLMError("ANTHROPIC_API_KEY rejected by the Anthropic API (HTTP 401)")])
    run_dir = workspace / "runs" / "e"
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=fake_verifier, run_dir=run_dir)
    assert s.status == "failed" and "rejected" in s.state.error
    assert "error: ANTHROPIC_API_KEY rejected" in s.render()
    # the summary names the command that continues it (the backend's message cannot know it)
    assert "to continue once the cause is fixed: coda-agent " in s.render()
    assert s.render().rstrip().endswith("generate swiglu_fwd --resume e")
    s = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([reply(GOOD_MODULE)]), verifier=fake_verifier, resume=run_dir
    )
    assert s.status == "passed" and s.state.error is None  # verified, no accept_fn given


def test_cpu_only_pass_is_not_accepted(workspace, fwd_spec):
    acc = Acceptor()
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=FakeVerifier(cpu_only=True),
        run_dir=workspace / "runs" / "c",
        accept_fn=acc,
        cpu_only=True,
    )
    assert s.status == "passed-cpu-only" and acc.calls == []
    # skipped GPU stages do not count as reached: a CPU-only pass stops at compile
    assert s.attempts[0].stage_reached == "compile"


def test_accept_refusal_is_reported(workspace, fwd_spec, fake_verifier):
    acc = Acceptor(fail=RuntimeError("kernel already accepted; use --force"))
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=fake_verifier,
        run_dir=workspace / "runs" / "a",
        accept_fn=acc,
    )
    assert s.status == "failed" and "accept refused" in s.state.error and "--force" in s.state.error


def test_resume_refuses_changed_spec_and_existing_run(workspace, fwd_spec, fake_verifier):
    run_dir = workspace / "runs" / "h"
    generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([reply(GOOD_MODULE)]), verifier=fake_verifier, run_dir=run_dir
    )
    with pytest.raises(RunError, match="already holds a run"):
        generate(fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=fake_verifier, run_dir=run_dir)
    toml = workspace / "kernel_specs" / "swiglu_fwd" / "spec.toml"
    toml.write_text(toml.read_text().replace("hints = [", 'hints = [\n    "an extra hint",'))
    changed = load_spec(toml.parent)
    with pytest.raises(RunError, match="changed since the run started"):
        generate(changed, root=workspace, backend=ScriptedBackend([]), verifier=fake_verifier, resume=run_dir)
    bwd = load_spec(workspace / "kernel_specs" / "swiglu_bwd")
    with pytest.raises(RunError, match="not 'swiglu_bwd'"):
        generate(bwd, root=workspace, backend=ScriptedBackend([]), verifier=fake_verifier, resume=run_dir)


def test_default_run_dir_and_load_run(workspace, fwd_spec, fake_verifier):
    s = generate(fwd_spec, root=workspace, backend=ScriptedBackend([reply(GOOD_MODULE)]), verifier=fake_verifier)
    assert s.run_dir.parent == workspace / "runs"
    assert s.run_dir.name.endswith("-swiglu_fwd") and s.run_dir.name[8] == "T"
    again = load_run(s.run_dir)
    assert again.status == "passed" and again.attempts[0].stage_reached == "bench"


def test_verifier_crash_marks_failed_and_propagates(workspace, fwd_spec):
    verifier = FakeVerifier(raise_on_call={1: ValueError("pipeline bug")})
    with pytest.raises(ValueError):
        generate(
            fwd_spec,
            root=workspace,
            backend=ScriptedBackend([reply(GOOD_MODULE)]),
            verifier=verifier,
            run_dir=workspace / "runs" / "v",
        )
    rj = run_json(workspace / "runs" / "v")
    assert rj["status"] == "failed" and rj["error"] == "ValueError: pipeline bug"


def test_with_real_accept_kernel_becomes_example_for_others_only(workspace, fwd_spec, fake_verifier):
    accept_mod = pytest.importorskip("coda_agent.verifier.library.accept")
    from coda_agent.agent.render import render_prompt

    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=fake_verifier,
        run_dir=workspace / "runs" / "real",
        accept_fn=accept_mod.accept,
        force=True,
    )
    assert s.status == "accepted", s.state.error
    dest = workspace / "generated_kernels" / "swiglu_fwd"
    assert (dest / "kernel.py").read_text() == GOOD_MODULE
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["provenance"]["backend"] == "scripted" and manifest["provenance"]["attempts"] == 1
    bwd = load_spec(workspace / "kernel_specs" / "swiglu_bwd")
    assert "# FIXED: write the ragged tile" in render_prompt(bwd, workspace).as_text()
    assert "# FIXED: write the ragged tile" not in render_prompt(fwd_spec, workspace, max_examples=10).as_text()


def test_run_json_records_per_attempt_accounting(workspace, fwd_spec, fake_verifier):
    backend = ScriptedBackend(
        [
            LLMResponse(text=reply(BAD_MODULE), model="m", usage=Usage(input_tokens=10, output_tokens=5)),
            LLMResponse(
                text=reply(GOOD_MODULE),
                model="m",
                usage=Usage(input_tokens=3, output_tokens=6, cache_read_input_tokens=99),
            ),
            "A lesson.",
        ]
    )
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=fake_verifier, run_dir=workspace / "runs" / "acc")
    rj = run_json(s.run_dir)
    a1, a2 = rj["attempts"]
    assert (a1["cache_hit"], a2["cache_hit"]) == (False, True)
    assert a1["stage_reached"] == "correctness" and a1["failed_stage"] == "correctness"
    assert a2["usage"] == {
        "input_tokens": 3,
        "output_tokens": 6,
        "cache_read_input_tokens": 99,
        "cache_creation_input_tokens": 0,
    }
    assert (
        a1["wall_s"] >= 0
        and a1["prompt_sha256"] == hashlib.sha256((s.run_dir / "attempt-1" / "prompt.md").read_bytes()).hexdigest()
    )
    assert rj["lesson"]["status"] == "proposed" and rj["lesson"]["text"] == "A lesson."
    assert load_run(s.run_dir).state.attempts[1].cache_hit is True


@pytest.mark.parametrize(
    "raw, want",
    [
        ("**Lesson:** Write every column.\n", "Write every column."),
        ("**Lesson**: Write every column.", "Write every column."),
        ("\n- Trick: round once at the store\n", "round once at the store"),
        ('"Quoted sentence."', "Quoted sentence."),
        ("Trickle-down stores need masks.", "Trickle-down stores need masks."),
    ],
)
def test_lesson_sentence_cleaning(raw, want):
    from coda_agent.agent.lesson import lesson_sentence as _lesson_sentence

    assert _lesson_sentence(raw) == want


def test_verifier_error_spends_no_attempt_and_resume_reverifies(workspace, fwd_spec):
    """A stage with status "error" is the verifier's fault: no feedback, no attempt spent."""
    from agent_helpers import make_verdict

    from coda_agent.verifier.verdict import StageResult

    class BrokenOnce(FakeVerifier):
        def __call__(self, loaded, candidate, workdir):
            v = super().__call__(loaded, candidate, workdir)
            if len(self.calls) == 1:
                v = make_verdict(loaded, Path(candidate), passed=True)
                v.stages = v.stages[:2] + [
                    StageResult(
                        stage="correctness",
                        status="error",
                        summary="candidate worker failed during setup (verifier problem)",
                    )
                ]
            return v

    verifier = BrokenOnce()
    backend = ScriptedBackend([reply(GOOD_MODULE)])
    run_dir = workspace / "runs" / "verr"
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=verifier, run_dir=run_dir)
    assert s.status == "verifier-error" and "not counted" in s.state.error
    a1 = run_dir / "attempt-1"
    assert (a1 / "verdict-error-1.json").is_file()
    assert not (a1 / "verdict.json").exists() and not (a1 / "feedback.md").exists()
    assert not (run_dir / "attempt-2").exists()

    s = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=verifier, resume=run_dir, accept_fn=Acceptor()
    )
    assert s.status == "accepted" and len(verifier.calls) == 2
    assert len(s.state.attempts) == 1


def test_cpu_only_pass_after_a_repair_proposes_no_lesson(workspace, fwd_spec):
    """A repaired candidate that passed only the CPU stages is not verified: the loop asks
    for no lesson until a GPU run has passed it too."""
    backend = ScriptedBackend(["I cannot write code today.", reply(GOOD_MODULE)])
    run_dir = workspace / "runs" / "cl"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=backend,
        verifier=FakeVerifier(cpu_only=True),
        run_dir=run_dir,
        accept_fn=Acceptor(),
        cpu_only=True,
    )
    assert s.status == "passed-cpu-only"
    assert [a.passed for a in s.attempts] == [False, True]
    assert len(backend.prompts) == 2  # task + repair; no lesson prompt
    assert s.state.lesson is None  # the lesson step was not even considered
    assert not (run_dir / "lesson").exists() and not (run_dir / "proposed_trick.md").exists()


def test_cpu_stage_pass_is_verified_again_on_a_gpu_resume(workspace, fwd_spec):
    """Answer checked on a laptop (CPU stages only), then resumed on a GPU machine: the kept
    CPU-only verdict is not reused as a verification; the GPU stages run and it is accepted."""
    run_dir = workspace / "runs" / "cg"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=FakeVerifier(cpu_only=True),
        run_dir=run_dir,
        accept_fn=Acceptor(),
        cpu_only=True,
    )
    assert s.status == "passed-cpu-only"
    gpu, acc = FakeVerifier(), Acceptor()
    s = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=gpu, resume=run_dir, accept_fn=acc, force=True
    )
    assert s.status == "accepted" and len(gpu.calls) == 1 and len(acc.calls) == 1
    assert (run_dir / "attempt-1" / "verdict-cpu-1.json").is_file()
    # resuming the CPU-only way again keeps a CPU verdict as it is (nothing new to learn)
    cpu = FakeVerifier(cpu_only=True)
    run2 = workspace / "runs" / "cg2"
    generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=cpu,
        run_dir=run2,
        cpu_only=True,
    )
    generate(fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=cpu, resume=run2, cpu_only=True)
    assert len(cpu.calls) == 1


def test_no_accept_is_recorded_and_sticky_over_resumes(workspace, fwd_spec):
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=FakeVerifier(cpu_only=True),
        run_dir=workspace / "runs" / "n",
        cpu_only=True,
        no_accept=True,
    )
    assert s.status == "passed-cpu-only" and run_json(s.run_dir)["no_accept"] is True
    text = s.render()
    assert f"generate swiglu_fwd --resume {s.run_dir.name} --no-accept" in text and "never accepts" in text
    # a GPU resume that would accept is refused: the run was started not to
    with pytest.raises(RunError, match="started with --no-accept"):
        generate(
            fwd_spec,
            root=workspace,
            backend=ScriptedBackend([]),
            verifier=FakeVerifier(),
            resume=s.run_dir,
            accept_fn=Acceptor(),
        )
    s = generate(fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=FakeVerifier(), resume=s.run_dir)
    assert s.status == "passed" and s.state.no_accept is True


def test_cpu_only_summary_names_the_resume_command_by_run_name(tmp_path, monkeypatch):
    """The resume hint names the run as `runs/<name>` resolves it (the GPU machine's
    checkout lives elsewhere), names the workspace with --root when it is run from outside
    it, and, for the command backend, asks for the command again (run.json does not keep it)."""
    from coda_agent.agent.loop import RunState, RunSummary

    monkeypatch.delenv("CODA_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    st = RunState(
        spec="swiglu_fwd",
        spec_hash="x",
        spec_dir="d",
        root=str(tmp_path),
        backend="command",
        model="m",
        status="passed-cpu-only",
        max_attempts=3,
        created_at="t",
    )
    text = RunSummary(run_dir=tmp_path / "runs" / "20301212T000000Z-swiglu_fwd", state=st).render()
    assert 'coda-agent generate swiglu_fwd --resume 20301212T000000Z-swiglu_fwd --cmd "CMD"' in text
    st.backend, st.force = "manual", True
    text = RunSummary(run_dir=tmp_path / "runs" / "20301212T000000Z-swiglu_fwd", state=st).render()
    assert "--resume 20301212T000000Z-swiglu_fwd --force" in text and "--cmd" not in text
    # an answer awaited under --cpu-only is checked as the call that asked for it was; a
    # passed-cpu-only run's hint (resume on a GPU to verify) goes without it
    st.cpu_only = True
    assert "--cpu-only" not in RunSummary(run_dir=tmp_path / "runs" / "r", state=st).render()
    st.status, st.answer_path = "waiting-for-answer", str(tmp_path / "runs" / "r" / "attempt-1" / "response.md")
    assert "--resume r --force --cpu-only" in RunSummary(run_dir=tmp_path / "runs" / "r", state=st).render()
    st.status, st.answer_path, st.cpu_only = "passed-cpu-only", None, False
    # a spec that already has an accepted kernel: the resume on a GPU needs --force or --no-accept
    st.force = False
    (tmp_path / "generated_kernels" / "swiglu_fwd").mkdir(parents=True)
    (tmp_path / "generated_kernels" / "swiglu_fwd" / "manifest.json").write_text('{"provenance": {"run_dir": "other"}}')
    assert (
        "already has an accepted kernel: that resume also needs --force"
        in RunSummary(run_dir=tmp_path / "runs" / "r", state=st).render()
    )
    st.force = True
    assert "already has an accepted kernel" not in RunSummary(run_dir=tmp_path / "runs" / "r", state=st).render()
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = RunSummary(run_dir=tmp_path / "runs" / "20301212T000000Z-swiglu_fwd", state=st).render()
    assert f"coda-agent --root {tmp_path.resolve()} generate swiglu_fwd --resume 20301212T000000Z-swiglu_fwd" in text


# -- the run folder is input, not proof (threat 27 of docs/threat-model.md) ----------------


def test_a_stored_passing_verdict_is_verified_again_before_acceptance(workspace, fwd_spec):
    """In --llm manual mode the answerer writes into the run folder. A verdict.json it
    wrote (right spec hash, the candidate's own sha256, every stage passed on a GPU) is not
    taken on its word: acceptance always follows a verification in this process, and the
    stored file is kept aside for the record."""
    from agent_helpers import make_verdict

    run_dir = workspace / "runs" / "forged"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ManualBackend(),
        verifier=FakeVerifier(),
        run_dir=run_dir,
        accept_fn=Acceptor(),
    )
    assert s.status == "waiting-for-answer"
    a1 = run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(BAD_MODULE))  # a module the verifier fails
    (a1 / "candidate.py").write_text(BAD_MODULE)
    forged = make_verdict(fwd_spec, a1 / "candidate.py", passed=True)
    assert forged.gpu_verified
    (a1 / "verdict.json").write_text(forged.to_json())
    (a1 / "response.json").write_text(json.dumps({"backend": "anthropic", "model": "claude-x"}))
    verifier, acc = FakeVerifier(), Acceptor()
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([]),
        verifier=verifier,
        resume=run_dir,
        accept_fn=acc,
        max_attempts=1,
    )
    assert len(verifier.calls) == 1 and acc.calls == []
    assert s.status == "out-of-attempts" and s.attempts[0].passed is False
    assert (a1 / "verdict-stored-1.json").read_text() == forged.to_json()
    # an honest answer read back from the folder: verified here, accepted, and the manifest's
    # provenance says this process did not receive the answer itself
    run2 = workspace / "runs" / "honest"
    generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), run_dir=run2, accept_fn=Acceptor()
    )
    (run2 / "attempt-1" / "response.md").write_text(reply(GOOD_MODULE))
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=verifier, resume=run2, accept_fn=acc)
    assert s.status == "accepted" and len(acc.calls) == 1
    assert acc.calls[0]["provenance"]["answer_received_here"] is False
    assert acc.calls[0]["provenance"]["backend"] == "manual"


def test_special_files_in_the_run_folder_are_refused_not_waited_on(workspace, fwd_spec):
    """A FIFO named .lock (or response.md) made --resume block forever; a symlinked
    response.md would be read and sent to the model. Both are refused with the path."""
    import os

    run_dir = workspace / "runs" / "fifo"
    generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), run_dir=run_dir)
    (run_dir / ".lock").unlink()
    os.mkfifo(run_dir / ".lock")
    with pytest.raises(RunError, match=r"\.lock: not a regular file or folder"):
        generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), resume=run_dir)
    (run_dir / ".lock").unlink()
    secret = workspace / "secret.txt"
    secret.write_text("not for the model\n")
    (run_dir / "attempt-1" / "response.md").symlink_to(secret)
    with pytest.raises(RunError, match=r"attempt-1/response.md: not a regular file"):
        generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), resume=run_dir)
    with pytest.raises(RunError, match="not a regular file"):
        load_run(run_dir)


def test_a_forged_accepted_path_is_not_believed(workspace, fwd_spec):
    """run.json's accepted_path turns off re-verification and acceptance on a resume; it is
    believed only when the library's manifest names this run."""
    from agent_helpers import make_verdict

    run_dir = workspace / "runs" / "claims-accepted"
    generate(
        fwd_spec,
        root=workspace,
        backend=ManualBackend(),
        verifier=FakeVerifier(),
        run_dir=run_dir,
        accept_fn=Acceptor(),
    )
    a1 = run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(BAD_MODULE))
    (a1 / "candidate.py").write_text(BAD_MODULE)
    (a1 / "verdict.json").write_text(make_verdict(fwd_spec, a1 / "candidate.py", passed=True).to_json())
    rj = run_json(run_dir)
    rj["accepted_path"] = str(workspace / "generated_kernels" / "swiglu_fwd")
    (run_dir / "run.json").write_text(json.dumps(rj))
    verifier, acc = FakeVerifier(), Acceptor()
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([]),
        verifier=verifier,
        resume=run_dir,
        accept_fn=acc,
        max_attempts=1,
    )
    assert len(verifier.calls) == 1 and s.status == "out-of-attempts" and s.state.accepted_path is None


def test_a_no_accept_resume_verifies_a_stored_pass_again(workspace, fwd_spec):
    """With --no-accept too a stored passing verdict.json is not reused as it is: a forged
    one would make the run "passed" and, after a failed attempt, draw a lesson proposal.
    Every stored GPU pass is verified again unless the library's manifest vouches for it."""
    from agent_helpers import make_verdict

    run_dir = workspace / "runs" / "forged-no-accept"
    generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), run_dir=run_dir, no_accept=True
    )
    a1 = run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(BAD_MODULE))  # the verifier fails it
    (a1 / "candidate.py").write_text(BAD_MODULE)
    forged = make_verdict(fwd_spec, a1 / "candidate.py", passed=True)
    assert forged.gpu_verified
    (a1 / "verdict.json").write_text(forged.to_json())
    verifier = FakeVerifier()
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([]),
        verifier=verifier,
        resume=run_dir,
        no_accept=True,
        max_attempts=1,
    )
    assert len(verifier.calls) == 1 and s.status == "out-of-attempts" and s.attempts[0].passed is False
    assert (a1 / "verdict-stored-1.json").read_text() == forged.to_json()
    assert s.state.lesson is None and not (run_dir / "lesson").exists()
    # the same run, given an honest second answer: verified, passed, and only then a lesson
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE), LESSON]),
        verifier=verifier,
        resume=run_dir,
        no_accept=True,
        max_attempts=2,
    )
    assert s.status == "passed" and len(verifier.calls) == 2 and s.state.lesson.status == "proposed"
    # resuming a passed --no-accept run verifies its pass again (nothing outside the folder vouches for it)
    s = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=verifier, resume=run_dir, no_accept=True
    )
    assert s.status == "passed" and len(verifier.calls) == 3
    assert (run_dir / "attempt-2" / "verdict-stored-1.json").is_file()


def test_a_run_folder_named_like_the_accepted_run_is_not_believed(workspace, fwd_spec):
    """The manifest names its run only by folder name (public in manifest.json); a new
    folder of that name claiming acceptance (run.json) with another candidate is not the
    accepted run: its stored pass is verified again, and a same-name folder holding the
    accepted kernel byte for byte is (the library vouches for that kernel, not the folder)."""
    from coda_agent.agent.run_folder import accepted_by, library_verdict

    run_dir = workspace / "runs" / "20300101T000000Z-swiglu_fwd"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=FakeVerifier(),
        run_dir=run_dir,
        accept_fn=Acceptor(),
    )
    assert s.status == "accepted" and accepted_by(workspace, "swiglu_fwd", run_dir)
    assert library_verdict(workspace, "swiglu_fwd", run_dir, 1).gpu_verified
    assert library_verdict(workspace, "swiglu_fwd", run_dir, 2) is None
    # the same name elsewhere, another candidate in attempt-1: not the accepted run
    other = workspace / "elsewhere" / run_dir.name
    other.mkdir(parents=True)
    (other / "attempt-1").mkdir()
    (other / "attempt-1" / "candidate.py").write_text(GOOD_MODULE + "# changed\n")
    assert not accepted_by(workspace, "swiglu_fwd", other)
    (other / "attempt-1" / "candidate.py").write_text(GOOD_MODULE)
    assert accepted_by(workspace, "swiglu_fwd", other)
    # a tampered candidate in the accepted run itself: no longer vouched for
    (run_dir / "attempt-1" / "candidate.py").write_text(GOOD_MODULE + "# changed\n")
    assert not accepted_by(workspace, "swiglu_fwd", run_dir)
    man = workspace / "generated_kernels" / "swiglu_fwd" / "manifest.json"
    man.write_text("{not json")
    assert library_verdict(workspace, "swiglu_fwd", run_dir) is None


def test_an_accepted_run_from_another_checkout_shows_this_workspaces_kernel(workspace, fwd_spec):
    """A run record copied from another checkout keeps that checkout's accepted_path; when
    this library's manifest names the run, the path shown is this workspace's, not one in
    the other checkout."""
    run_dir = workspace / "runs" / "copied"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE), LESSON]),
        verifier=FakeVerifier(),
        run_dir=run_dir,
        accept_fn=Acceptor(),
    )
    assert s.status == "accepted"
    rj = run_json(run_dir)
    rj["accepted_path"] = "/elsewhere/checkout/generated_kernels/swiglu_fwd"
    rj["root"] = "/elsewhere/checkout"
    (run_dir / "run.json").write_text(json.dumps(rj))
    acc = Acceptor()
    s = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=FakeVerifier(), resume=run_dir, accept_fn=acc
    )
    assert s.status == "accepted" and acc.calls == []
    assert s.state.accepted_path == str(workspace / "generated_kernels" / "swiglu_fwd")
    assert run_json(run_dir)["root"] == str(workspace)
    assert "/elsewhere" not in s.render()


def test_a_planted_pycache_is_refused_and_verify_is_emptied_first(workspace, fwd_spec):
    """A ``__pycache__/`` beside candidate.py can hold bytecode that an import would run in
    the candidate's place, and symlinks planted in ``attempt-k/verify/logs`` would have the
    verifier truncate the files they name. An attempt folder holds no folder but verify/,
    and verify/ is emptied before every verification."""
    run_dir = workspace / "runs" / "planted"
    generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), run_dir=run_dir)
    a1 = run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(GOOD_MODULE))
    (a1 / "__pycache__").mkdir()
    with pytest.raises(RunError, match=r"attempt-1/__pycache__: a folder the loop never writes"):
        generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), resume=run_dir)
    (a1 / "__pycache__").rmdir()
    (run_dir / "proposed_trick.md").mkdir()  # would make the lesson write fail after acceptance
    with pytest.raises(RunError, match=r"proposed_trick.md: a folder the loop never writes"):
        generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), resume=run_dir)
    (run_dir / "proposed_trick.md").rmdir()
    victim = workspace / "victim.txt"
    victim.write_text("accepted work\n")
    before = victim.read_bytes()
    (a1 / "verify" / "logs").mkdir(parents=True)
    (a1 / "verify" / "logs" / "worker_candidate.stderr").symlink_to(victim)
    seen = []

    def verifier(loaded, candidate, workdir):
        seen.append(sorted(p.name for p in Path(workdir).rglob("*")) if Path(workdir).exists() else None)
        return FakeVerifier()(loaded, candidate, workdir)

    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=verifier, resume=run_dir)
    assert seen == [None]  # the planted folder was gone before the verifier ran
    assert victim.read_bytes() == before and s.attempts[0].passed


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("response.md", b"\xff\xfe not utf-8", "not UTF-8 text"),
        ("response.json", b'{"usage": 5}', "response.json: not what the loop wrote there"),
        ("response.json", b'{"wall_s": "abc"}', "response.json: not what the loop wrote there"),
        ("verdict.json", b"{}", "verdict.json: not what the loop wrote there"),
        ("prompt.json", b"{}", "prompt.json: not what the loop wrote there"),
    ],
)
def test_malformed_run_files_are_run_errors_naming_the_file(workspace, fwd_spec, name, content, needle):
    """The run folder is the answerer's to write: files the loop cannot read are a RunError
    naming the file, never a traceback."""
    run_dir = workspace / "runs" / "malformed"
    generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), run_dir=run_dir)
    a1 = run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(GOOD_MODULE))
    (a1 / name).write_bytes(content)
    with pytest.raises(RunError, match=needle):
        generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=FakeVerifier(), resume=run_dir)


def test_a_blank_answer_is_kept_as_an_answer_not_asked_again(workspace, fwd_spec):
    """A blank API answer (thinking used every output token) is still an answer: written
    blank, a resume would take it for "no answer yet" and pay for the call again."""
    blank = LLMResponse(text="", model="m", stop_reason="max_tokens", usage=Usage(output_tokens=16000))
    run_dir = workspace / "runs" / "blank"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([blank]),
        verifier=FakeVerifier(),
        run_dir=run_dir,
        max_attempts=1,
    )
    assert s.status == "out-of-attempts"
    assert (
        run_dir / "attempt-1" / "response.md"
    ).read_text() == "(the model returned no text; stop_reason=max_tokens)\n"
    backend = ScriptedBackend([])  # would raise if called
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=FakeVerifier(), resume=run_dir, max_attempts=1)
    assert s.state.attempts[0].usage.output_tokens == 16000


@pytest.mark.parametrize("stop_reason", ["max_tokens", "model_context_window_exceeded"])
def test_a_response_cut_inside_a_docstring_is_fed_back_as_cut_off(workspace, fwd_spec, stop_reason):
    """A token-limit stop + a block closed by a docstring's snippet fence: the attempt
    fails at extraction with the cut-off message (no verification), not as a syntax error."""
    cut = '```python\n"""Epilogue.\n\nExample:\n```python\nout = f(x)\n```\nThe row scale'
    resp = LLMResponse(text=cut, model="m", stop_reason=stop_reason, usage=Usage(output_tokens=16000))
    run_dir = workspace / "runs" / "cut"
    verifier = FakeVerifier()
    s = generate(
        fwd_spec, root=workspace, backend=ScriptedBackend([resp]), verifier=verifier, run_dir=run_dir, max_attempts=1
    )
    a = s.state.attempts[0]
    assert s.status == "out-of-attempts" and a.failed_stage == "extract"
    assert "stopped at the output token limit" in a.extract_error and "(Your response stopped" not in a.extract_error
    assert "output token limit" in (run_dir / "attempt-1" / "feedback.md").read_text()
    assert not (run_dir / "attempt-1" / "candidate.py").exists() and verifier.calls == []


def test_an_answer_edited_after_its_verdict_is_verified_again(workspace, fwd_spec):
    """A CPU-passed attempt whose response.md was replaced by a broken answer must not keep
    its old verdict on resume (candidate.py is rewritten, the verdict is about other bytes)
    and let the run 'pass' with exit 0."""
    fake_verifier = FakeVerifier(cpu_only=True)
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ManualBackend(),
        verifier=fake_verifier,
        run_dir=workspace / "runs" / "e",
        cpu_only=True,
    )
    a1 = s.run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(GOOD_MODULE))
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, cpu_only=True
    )
    assert s.status == "passed-cpu-only" and len(fake_verifier.calls) == 1
    (a1 / "response.md").write_text(reply(BAD_MODULE))
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir, cpu_only=True
    )
    assert len(fake_verifier.calls) == 2 and (a1 / "verdict-stale-1.json").is_file()
    now = hashlib.sha256((a1 / "candidate.py").read_bytes()).hexdigest()
    assert json.loads((a1 / "verdict.json").read_text())["candidate_hash"] == now
    assert json.loads((a1 / "verdict-stale-1.json").read_text())["candidate_hash"] != now
    assert "# attempt one" in (a1 / "candidate.py").read_text()


def test_an_answer_edited_after_the_next_attempt_was_prompted_is_refused(workspace, fwd_spec, fake_verifier):
    """The attempt-2 prompt quotes attempt 1's old candidate and feedback: verifying an edited
    attempt-1 answer would leave it stale, so the resume says what to do instead."""
    s = generate(
        fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, run_dir=workspace / "runs" / "f"
    )
    a1 = s.run_dir / "attempt-1"
    (a1 / "response.md").write_text(reply(BAD_MODULE))
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir)
    assert s.state.answer_path.endswith("attempt-2/response.md")
    before = (a1 / "verdict.json").read_bytes()
    (a1 / "response.md").write_text(reply(GOOD_MODULE))
    with pytest.raises(RunError, match=r"attempt 1's answer changed after it was verified, and attempt 2 was"):
        generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir)
    assert (a1 / "verdict.json").read_bytes() == before and len(fake_verifier.calls) == 1
    # removing attempt-2 is the way on: attempt 1 is verified again, and passes
    import shutil

    shutil.rmtree(s.run_dir / "attempt-2")
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=fake_verifier, resume=s.run_dir)
    assert len(fake_verifier.calls) == 2 and s.attempts[0].passed is True


def test_resume_hints_are_commands_a_shell_runs(tmp_path, fwd_spec, fake_verifier, monkeypatch):
    """Printed resume hints paste into a shell: a workspace path holding a space is quoted
    (`--root '/tmp/with space/ws'`), and for a `--llm command` run the note on CMD is not
    inside the out-of-attempts command, before `--max-attempts`."""
    import shlex
    import shutil

    ws = tmp_path / "with space" / "ws"
    shutil.copytree(Path(fwd_spec.directory).parents[1] / "kernel_specs", ws / "kernel_specs")
    backend = ScriptedBackend([reply(BAD_MODULE)])
    backend.name = "command"  # as the command backend is named: its CMD is not kept
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CODA_ROOT", raising=False)
    s = generate(fwd_spec, root=ws, backend=backend, verifier=fake_verifier, max_attempts=1, run_dir=ws / "runs" / "r")
    assert s.status == "out-of-attempts"
    line = next(ln for ln in s.render().splitlines() if "to try again: " in ln)
    cmd, note = line.split("to try again: ", 1)[1].rsplit(")", 1)[0].split(" (the command backend's CMD", 1)
    assert shlex.split(cmd) == [
        "coda-agent",
        "--root",
        str(ws.resolve()),
        "generate",
        "swiglu_fwd",
        "--resume",
        "r",
        "--cmd",
        "CMD",
        "--max-attempts",
        "2",
    ]
    assert "is not kept in run.json" in note

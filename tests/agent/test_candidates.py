"""Best-of-N (`generate --candidates N`): N answers per attempt to the same prompt, verified
side by side, the fastest pass taken, the failures fed into the next repair prompt; every
candidate recorded, and a resume never pays for an answer twice (scripted backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import BAD_MODULE, FAIL_MESSAGE, GOOD_MODULE, FakeVerifier, make_verdict, reply
from test_loop import Acceptor, run_json

from coda_agent.agent.candidates import combined_feedback, fastest, fused_ms, replay_choice
from coda_agent.agent.llm.base import LLMError
from coda_agent.agent.llm.manual import ManualBackend
from coda_agent.agent.llm.scripted import ScriptedBackend
from coda_agent.agent.loop import RunError, generate
from coda_agent.agent.run_folder import check_run_files, library_verdict

SLOW = GOOD_MODULE + "# SLOW\n"
FAST = GOOD_MODULE + "# FAST\n"


class SideBySide(FakeVerifier):
    """FakeVerifier with ``many``: records each batch; passing modules get a bench time of
    0.5 ms, 0.2 ms with ``# FAST``."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[Path]] = []

    def __call__(self, loaded, candidate, workdir):
        v = super().__call__(loaded, candidate, workdir)
        if v.passed:
            ms = 0.2 if "# FAST" in Path(candidate).read_text() else 0.5
            v.stage("bench").metrics["rows"] = [{"shape": "a", "fused_ms": ms}, {"shape": "b", "fused_ms": ms * 4}]
        return v

    def many(self, loaded, pairs):
        self.batches.append([c for c, _ in pairs])
        return [self(loaded, c, w) for c, w in pairs]


def test_the_fastest_pass_is_accepted_and_every_candidate_recorded(workspace, fwd_spec):
    backend = ScriptedBackend([reply(BAD_MODULE), reply(SLOW), reply(FAST)])
    ver, acc = SideBySide(), Acceptor()
    run_dir = workspace / "runs" / "bo3"
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=ver, run_dir=run_dir, accept_fn=acc, candidates=3)
    assert s.status == "accepted"
    a1 = run_dir / "attempt-1"
    # the same prompt, three answers, one batch verified side by side
    assert [p.as_text() for p in backend.prompts] == [backend.prompts[0].as_text()] * 3
    assert ver.batches == [[a1 / f"candidate-{j}" / "candidate.py" for j in (1, 2, 3)]]
    for j in (1, 2, 3):
        for f in ("response.md", "response.json", "candidate.py", "verdict.json"):
            assert (a1 / f"candidate-{j}" / f).is_file(), (j, f)
    assert (a1 / "prompt.md").is_file() and not (a1 / "response.md").exists()
    # the fastest passing one, and the library's manifest vouches for exactly that file
    assert acc.calls[0]["candidate"] == a1 / "candidate-3" / "candidate.py"
    assert acc.calls[0]["provenance"]["candidate"] == 3 and acc.calls[0]["provenance"]["attempts"] == 1
    assert library_verdict(workspace, "swiglu_fwd", run_dir, 1, 3) is not None
    assert library_verdict(workspace, "swiglu_fwd", run_dir, 1, 2) is None
    rec = run_json(run_dir)["attempts"][0]
    assert (rec["candidates"], rec["chosen"], rec["passed"]) == (3, 3, True)
    assert [c["passed"] for c in rec["candidate_records"]] == [False, True, True]
    assert rec["candidate_records"][2]["fused_ms"] == pytest.approx(0.4)  # geomean of 0.2 and 0.8
    assert rec["usage"]["output_tokens"] == sum(c["usage"]["output_tokens"] for c in rec["candidate_records"])
    assert "candidates: 1: fail at correctness; 2: pass 1 ms; 3: pass 0.4 ms (chosen)" in s.render()
    check_run_files(run_dir)  # candidate folders are the loop's own


def test_failures_feed_the_next_repair_prompt(workspace, fwd_spec):
    backend = ScriptedBackend(["no code here", reply(BAD_MODULE), reply(FAST), reply(SLOW)])
    ver = SideBySide()
    run_dir = workspace / "runs" / "bo2"
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=ver, run_dir=run_dir, candidates=2)
    assert s.status == "passed"
    rec = run_json(run_dir)["attempts"][0]
    assert (rec["replay"], rec["failed_stage"]) == (2, "correctness")  # the one that got furthest
    fb = (run_dir / "attempt-1" / "feedback.md").read_text()
    assert FAIL_MESSAGE in fb and "answer 1: no usable module" in fb
    repair = backend.prompts[2].messages[-1]["content"]
    assert FAIL_MESSAGE in repair and "# attempt one" in repair and "answer 1: no usable module" in repair
    assert backend.prompts[2].messages[1]["content"].strip() == reply(BAD_MODULE).strip()  # the replayed answer
    assert ver.batches[0] == [run_dir / "attempt-1" / "candidate-2" / "candidate.py"]  # nothing to verify for 1
    assert run_json(run_dir)["attempts"][1]["chosen"] == 1


def test_a_resume_never_asks_an_answered_candidate_again(workspace, fwd_spec):
    backend = ScriptedBackend([reply(BAD_MODULE), LLMError("rate limited"), reply(SLOW)])
    ver = SideBySide()
    run_dir = workspace / "runs" / "bo-resume"
    s = generate(fwd_spec, root=workspace, backend=backend, verifier=ver, run_dir=run_dir, candidates=3)
    assert s.status == "failed" and "rate limited" in s.state.error and ver.calls == []
    a1 = run_dir / "attempt-1"
    assert (a1 / "candidate-1" / "response.md").is_file() and (a1 / "candidate-3" / "response.md").is_file()
    assert not (a1 / "candidate-2" / "response.md").exists()
    again = ScriptedBackend([reply(FAST)])
    s = generate(fwd_spec, root=workspace, backend=again, verifier=ver, resume=run_dir)
    assert s.status == "passed" and again.calls == 1  # only candidate 2 was asked
    assert run_json(run_dir)["attempts"][0]["chosen"] == 2
    assert s.state.candidates == 3  # kept by the run


def test_manual_backend_writes_n_prompts_and_waits_for_n_answers(workspace, fwd_spec):
    ver = SideBySide()
    run_dir = workspace / "runs" / "bo-manual"
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=ver, run_dir=run_dir, candidates=2)
    a1 = run_dir / "attempt-1"
    answers = [str(a1 / f"candidate-{j}" / "response.md") for j in (1, 2)]
    assert s.status == "waiting-for-answer" and s.state.answers_awaited == answers
    assert all((a1 / f"candidate-{j}" / "prompt.md").is_file() for j in (1, 2))
    assert "waiting for 2 answers" in s.render()
    Path(answers[1]).write_text(reply(FAST))
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=ver, resume=run_dir)
    assert s.status == "waiting-for-answer" and s.state.answers_awaited == answers[:1] and ver.calls == []
    Path(answers[0]).write_text(reply(SLOW))
    s = generate(fwd_spec, root=workspace, backend=ManualBackend(), verifier=ver, resume=run_dir)
    assert s.status == "passed" and run_json(run_dir)["attempts"][0]["chosen"] == 2


def test_one_candidate_keeps_the_one_answer_layout(workspace, fwd_spec, fake_verifier):
    run_dir = workspace / "runs" / "one"
    s = generate(
        fwd_spec,
        root=workspace,
        backend=ScriptedBackend([reply(GOOD_MODULE)]),
        verifier=fake_verifier,
        run_dir=run_dir,
        candidates=1,
    )
    assert s.status == "passed" and (run_dir / "attempt-1" / "candidate.py").is_file()
    assert not list((run_dir / "attempt-1").glob("candidate-*"))
    with pytest.raises(RunError, match="candidates must be >= 1"):
        generate(fwd_spec, root=workspace, backend=ScriptedBackend([]), verifier=fake_verifier, candidates=0)


def test_a_planted_folder_in_a_candidate_folder_is_refused(workspace, fwd_spec):
    backend = ScriptedBackend([reply(BAD_MODULE), reply(BAD_MODULE)])
    run_dir = workspace / "runs" / "planted"
    generate(
        fwd_spec, root=workspace, backend=backend, verifier=SideBySide(), run_dir=run_dir, candidates=2, max_attempts=1
    )
    (run_dir / "attempt-1" / "candidate-1" / "__pycache__").mkdir()
    with pytest.raises(RunError, match="__pycache__"):
        check_run_files(run_dir)


def test_choice_helpers(workspace, fwd_spec):
    cand = workspace / "c.py"
    cand.write_text("x")
    timed = make_verdict(fwd_spec, cand, passed=True)
    timed.stage("bench").metrics["rows"] = [{"fused_ms": 1.0}, {"fused_ms": 4.0}]
    untimed = make_verdict(fwd_spec, cand, passed=True)
    assert fused_ms(timed) == pytest.approx(2.0) and fused_ms(untimed) is None
    assert fastest([(0, untimed), (1, timed)]) == 1
    assert replay_choice([(0, "extract", 0), (1, "compile", 3), (2, "correctness", 5), (3, "correctness", 1)]) == 3
    assert combined_feedback(2, "F\n", []) == "F\n"
    assert json.dumps(combined_feedback(2, "F\n", [(1, "x")])) == json.dumps(
        "F\n\nThe 1 other answers to the same prompt failed too:\n- answer 1: x\n"
    )

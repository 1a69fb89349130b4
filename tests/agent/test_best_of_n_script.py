"""benchmarks/best_of_n.py's runs and table with the scripted backend and the fake verifier
(a module passes when it holds ``# FIXED``): the attempt that passed, the answers paid for,
and the per-(spec, N) summary; the two-machine protocol (answers and CPU stages where the
model is, GPU stages where the GPU is) reaching the same record without paying twice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agent_helpers import BAD_MODULE, GOOD_MODULE, FakeVerifier, make_verdict, reply

from coda_agent.agent.llm.manual import ManualBackend
from coda_agent.agent.llm.scripted import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("best_of_n", ROOT / "benchmarks" / "best_of_n.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_and_summary(workspace):
    bon = _script()
    ver = FakeVerifier()
    one = bon.one_run(
        workspace,
        "swiglu_fwd",
        1,
        workspace / "runs" / "n1",
        ScriptedBackend([reply(BAD_MODULE), reply(GOOD_MODULE)]),
        ver,
        5,
    )
    assert (one["status"], one["passed_at_attempt"], one["answers"]) == ("passed", 2, 2)
    four = bon.one_run(
        workspace,
        "swiglu_fwd",
        4,
        workspace / "runs" / "n4",
        ScriptedBackend([reply(BAD_MODULE)] * 3 + [reply(GOOD_MODULE)]),
        ver,
        5,
    )
    assert (four["status"], four["passed_at_attempt"], four["answers"]) == ("passed", 1, 4)
    never = bon.one_run(
        workspace, "swiglu_fwd", 1, workspace / "runs" / "no", ScriptedBackend([reply(BAD_MODULE)] * 2), ver, 2
    )
    assert (never["status"], never["passed_at_attempt"]) == ("out-of-attempts", None)
    text = bon.summarize([one, four, never], cpu_only=False)
    assert "| swiglu_fwd | 1 | 2 | 1 | 2.00 | 2.0 |" in text
    assert "| swiglu_fwd | 4 | 1 | 1 | 1.00 | 4.0 |" in text
    assert "pass every stage on the GPU" in text


def test_two_machines_take_turns_and_no_answer_is_paid_twice(workspace):
    bon = _script()
    run_dir = workspace / "runs" / "turns"

    def cpu_stages(loaded, candidate, workdir):  # what the CPU stages say of either module
        return make_verdict(loaded, Path(candidate), passed=True, cpu_only=True)

    gpu = FakeVerifier()  # the GPU machine: only the fixed module passes

    def turn(backend, cpu_only):
        verifier = cpu_stages if cpu_only else gpu
        return bon.one_run(workspace, "swiglu_fwd", 1, run_dir, backend, verifier, 5, cpu_only)

    model = ScriptedBackend([reply(BAD_MODULE)])
    rec = turn(model, cpu_only=True)
    assert (rec["status"], rec["passed_at_attempt"]) == ("passed-cpu-only", 1)
    rec = turn(ManualBackend(), cpu_only=False)  # attempt 1 fails on the GPU; attempt 2 awaits its answer
    assert (rec["status"], rec["passed_at_attempt"], len(gpu.calls)) == ("waiting-for-answer", None, 1)
    model = ScriptedBackend([reply(GOOD_MODULE)])
    rec = turn(model, cpu_only=True)
    assert (rec["status"], rec["passed_at_attempt"], model.calls) == ("passed-cpu-only", 2, 1)
    rec = turn(ManualBackend(), cpu_only=False)
    assert (rec["status"], rec["passed_at_attempt"], rec["answers"]) == ("passed", 2, 2)
    assert len(gpu.calls) == 2  # attempt 1's failure was not verified again
    again = turn(ManualBackend(), cpu_only=False)  # an ended run is only read
    assert again["status"] == "passed" and len(gpu.calls) == 2

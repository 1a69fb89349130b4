"""The command backend pipes the prompt into a shell command and reads its stdout."""

from __future__ import annotations

import shlex
import sys

import pytest
from agent_helpers import GOOD_MODULE, FakeVerifier

from coda_agent.agent.llm import make_backend
from coda_agent.agent.llm.base import LLMError
from coda_agent.agent.llm.command import CommandBackend
from coda_agent.agent.loop import generate
from coda_agent.agent.render import render_prompt

PY = shlex.quote(sys.executable)


def test_cat_echoes_the_exact_prompt(workspace, fwd_spec):
    prompt = render_prompt(fwd_spec, workspace)
    r = CommandBackend("cat").complete(prompt)
    assert r.text == prompt.as_text()
    assert r.model == "command:cat" and r.usage.input_tokens == 0


def test_python_command_reads_stdin_and_prompt_files(workspace, fwd_spec):
    script = (
        "import sys, os, json; t = sys.stdin.read(); "
        "f = open(os.environ['CODA_PROMPT_FILE']).read(); "
        "j = json.load(open(os.environ['CODA_PROMPT_JSON'])); "
        "print(len(t) == len(f), j['kind'], len(j['system_blocks']), 'swiglu_fwd' in t)"
    )
    r = CommandBackend(f"{PY} -c {shlex.quote(script)}").complete(render_prompt(fwd_spec, workspace))
    assert r.text == "True task 4 True\n"


def test_nonzero_exit_is_a_clear_error(workspace, fwd_spec):
    b = CommandBackend(f"{PY} -c 'import sys; sys.stderr.write(\"quota exceeded\\n\"); sys.exit(3)'")
    with pytest.raises(LLMError) as ei:
        b.complete(render_prompt(fwd_spec, workspace))
    msg = str(ei.value)
    assert "exited with status 3" in msg and "quota exceeded" in msg


def test_timeout_and_empty_output(workspace, fwd_spec):
    with pytest.raises(LLMError, match=r"did not finish within 0.5 s"):
        CommandBackend("sleep 5", timeout_s=0.5).complete(render_prompt(fwd_spec, workspace))
    with pytest.raises(LLMError, match=r"printed nothing on stdout \(exit status 0\) and nothing on stderr"):
        CommandBackend("cat > /dev/null").complete(render_prompt(fwd_spec, workspace))
    # a script whose last command failed exits 0 with the reason on stderr: it is shown
    # (e.g. "python: not found")
    with pytest.raises(
        LLMError, match=r"printed nothing on stdout \(exit status 0\); stderr:\n.*nosuchtool.*not found"
    ):
        CommandBackend("cat > /dev/null; nosuchtool || true").complete(render_prompt(fwd_spec, workspace))
    # ... also after 1.2 MB of warnings: stderr's tail is kept, not its head
    noisy = "cat > /dev/null; head -c 1200000 /dev/zero | tr '\\0' w >&2; echo; nosuchtool || true"
    with pytest.raises(LLMError, match=r"stderr:\n.*nosuchtool.*not found"):
        CommandBackend(noisy).complete(render_prompt(fwd_spec, workspace))


def test_factory_and_loop_with_a_command(workspace, fwd_spec, tmp_path):
    answer = tmp_path / "answer.md"
    answer.write_text(f"```python\n{GOOD_MODULE}```\n")
    b = make_backend("command", command=f"cat > /dev/null; cat {shlex.quote(str(answer))}", model=None)
    assert isinstance(b, CommandBackend)
    s = generate(fwd_spec, root=workspace, backend=b, verifier=FakeVerifier(), run_dir=workspace / "runs" / "cmd")
    assert s.status == "passed" and s.attempts[0].backend == "command"
    assert (s.run_dir / "attempt-1" / "candidate.py").read_text() == GOOD_MODULE
    with pytest.raises(LLMError, match="needs the command line"):
        make_backend("command")
    with pytest.raises(LLMError, match="unknown LLM backend 'openai'"):
        make_backend("openai")
    with pytest.raises(LLMError, match="no LLM backend configured"):
        make_backend(None)


def test_non_utf8_output_is_replaced_not_a_traceback(workspace, fwd_spec):
    """Bytes that are not UTF-8 are replaced, not a UnicodeDecodeError out of the loop."""
    r = CommandBackend("cat >/dev/null; printf 'x = \"\\377\"\\n'").complete(render_prompt(fwd_spec, workspace))
    assert r.text == 'x = "\ufffd"\n'


@pytest.mark.slow
def test_a_background_child_neither_hangs_a_finished_command_nor_outlives_it(workspace, fwd_spec, tmp_path):
    """The command exits at once but a child it left holds stdout: the answer comes back
    within the grace period, not after the whole timeout, and the child's group is killed
    (on a timeout too, not only the shell)."""
    import time
    from pathlib import Path

    pidfile = tmp_path / "child.pid"
    cmd = f"cat >/dev/null; (sleep 300 & echo $! > {pidfile}; wait) & echo 'x = 1'"
    t0 = time.monotonic()
    r = CommandBackend(cmd, timeout_s=60).complete(render_prompt(fwd_spec, workspace))
    assert r.text.strip() == "x = 1" and time.monotonic() - t0 < 15
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # gone, or a zombie
    t0 = time.monotonic()
    with pytest.raises(LLMError, match="did not finish within 1 s"):
        CommandBackend("sleep 300 | cat", timeout_s=1).complete(render_prompt(fwd_spec, workspace))
    assert time.monotonic() - t0 < 10


def test_a_successful_commands_stderr_is_kept_beside_its_answer(workspace, fwd_spec):
    """A wrapper that exits 0 after printing some non-code text and its error on stderr:
    the extraction fails, and the stderr names the real problem, so it is not thrown away:
    it is kept as attempt-<k>/command.stderr."""
    b = CommandBackend("cat > /dev/null; echo 'sorry, no code'; echo 'API quota exceeded' >&2")
    s = generate(
        fwd_spec, root=workspace, backend=b, verifier=FakeVerifier(), run_dir=workspace / "runs" / "e", max_attempts=1
    )
    assert s.status == "out-of-attempts"
    assert (s.run_dir / "attempt-1" / "command.stderr").read_text() == "API quota exceeded\n"
    quiet = generate(
        fwd_spec,
        root=workspace,
        backend=CommandBackend("cat > /dev/null; echo 'no code'"),
        verifier=FakeVerifier(),
        run_dir=workspace / "runs" / "q",
        max_attempts=1,
    )
    assert not (quiet.run_dir / "attempt-1" / "command.stderr").exists()

"""verifier/confine/sandbox.py: workers that finish, raise, segfault, abort, hang or hit a CUDA error."""

import os
import time
from pathlib import Path

import pytest
from proc_helpers import gone

from coda_agent.verifier.confine.sandbox import classify, run_worker, strip_ansi, tail

HERE = Path(__file__).resolve().parent


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(name, tmp_path, *extra, timeout=60):
    results = tmp_path / "results.jsonl"
    return run_worker(
        f"sandbox_fixtures.{name}",
        [str(results), *extra],
        timeout,
        cwd=HERE,
        env=_env(),
        results=results,
        log_dir=tmp_path / "logs",
    )


def test_ok_reads_records_not_stdout(tmp_path):
    out = _run("ok", tmp_path)
    assert out.status == "ok" and out.ok and out.returncode == 0
    assert [r["part"] for r in out.records] == ["begin", "work", "done"]
    assert not any(r.get("forged") for r in out.records)
    assert out.finished and out.died_in is None
    assert (tmp_path / "logs" / "ok.stdout").read_text().startswith('{"part": "done"')


def test_exception_tail_is_ansi_free(tmp_path):
    out = _run("raises", tmp_path)
    assert out.status == "exception" and out.returncode == 1
    assert "ValueError: candidate exploded on purpose" in out.stderr_tail
    assert "\x1b[" not in out.stderr_tail and "colored noise" in out.stderr_tail
    assert out.died_in == "trial c0"
    assert "Python exception during trial c0" in out.message()


def test_segfault_is_a_signal(tmp_path):
    out = _run("segfault", tmp_path)
    assert out.status == "signal" and out.signal_name == "SIGSEGV"
    assert out.died_in == "trial c1"
    assert "killed by SIGSEGV during trial c1" in out.message()
    assert "Fatal Python error" in out.stderr_tail  # faulthandler was on


def test_abort_is_a_signal(tmp_path):
    out = _run("segfault", tmp_path, "abort")
    assert out.status == "signal" and out.signal_name == "SIGABRT"


@pytest.mark.slow
def test_hang_is_killed_with_its_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    t0 = time.monotonic()
    out = _run("hang", tmp_path, str(pidfile), timeout=4)
    assert time.monotonic() - t0 < 30
    assert out.status == "timeout" and out.returncode is None
    assert out.died_in == "bench big"
    assert "hang: no result after 4 s during bench big" in out.message()
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(child), "the worker's child survived the group kill"


def test_kill_live_groups_ends_a_worker_waited_on_in_another_thread(tmp_path):
    """A compile worker waited on in a pool thread never sees the main thread's Ctrl-C and
    would outlive `coda-agent verify`; the CLI's signal handler kills every running worker
    group (kill_live_groups), and run_worker forgets it after."""
    import threading

    from coda_agent.verifier.confine import sandbox

    pidfile = tmp_path / "child.pid"
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", _run("hang", tmp_path, str(pidfile), timeout=120)))
    t0 = time.monotonic()
    t.start()
    while not pidfile.exists() and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    assert pidfile.exists(), "the hang fixture never started"
    assert sandbox.kill_live_groups() == 1
    t.join(timeout=30)
    assert not t.is_alive() and time.monotonic() - t0 < 60
    assert box["out"].status == "signal" and box["out"].signal_name == "SIGKILL"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(child), "the worker's child survived"
    assert sandbox.kill_live_groups() == 0  # nothing is left registered


def test_cuda_error_classified(tmp_path):
    out = _run("cuda_error", tmp_path)
    assert out.status == "cuda-error"
    assert "illegal memory access" in out.stderr_tail


def test_missing_module_is_an_exception(tmp_path):
    out = run_worker("sandbox_fixtures.does_not_exist", [], 30, cwd=HERE, env=_env())
    assert out.status == "exception" and "No module named" in out.stderr_tail


@pytest.mark.parametrize(
    "rc,stderr,timed_out,expected",
    [
        (0, "", False, ("ok", None)),
        (-11, "", False, ("signal", "SIGSEGV")),
        (None, "", True, ("timeout", None)),
        (1, "RuntimeError: CUDA error: misaligned address", False, ("cuda-error", None)),
        (1, "Traceback...\nKeyError: 'x'", False, ("exception", None)),
    ],
)
def test_classify(rc, stderr, timed_out, expected):
    assert classify(rc, stderr, timed_out) == expected


def test_tail_and_strip():
    assert strip_ansi("\x1b[1;31mred\x1b[0m") == "red"
    text = "\n".join(f"line {i}" for i in range(200))
    t = tail(text, max_lines=5)
    assert t.splitlines() == [f"line {i}" for i in range(195, 200)]


def test_worker_gets_no_secrets_and_parent_reads_only_the_stderr_tail(tmp_path, monkeypatch):
    """A candidate may read its environment and flood stderr: neither reaches the parent."""
    from coda_agent.verifier.confine.sandbox import run_worker
    from coda_agent.verifier.pipeline import _worker_env

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-leak")
    env = _worker_env()
    assert "ANTHROPIC_API_KEY" not in env and env["PYTHONSAFEPATH"] == "1"
    mod = tmp_path / "flood_worker.py"
    mod.write_text(
        "import os, sys\n"
        "sys.stderr.write('x' * (8 << 20))\n"
        "sys.stderr.write('\\nKEY=' + os.environ.get('ANTHROPIC_API_KEY', 'absent') + '\\n')\n"
        "sys.exit(1)\n"
    )
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONSAFEPATH")
    out = run_worker("flood_worker", [], 60, cwd=tmp_path, env=env, log_dir=tmp_path / "logs")
    assert out.status == "exception"
    assert "KEY=absent" in out.stderr_tail
    assert len(out.stderr_tail) < 100_000


def test_logs_reach_the_parent_through_capped_pipes(tmp_path):
    # a worker's stdout/stderr are pipes: the parent keeps LOG_HEAD bytes plus the last
    # LOG_TAIL, and the worker cannot truncate or fallocate them (it could a log *file*)
    from coda_agent.verifier.confine.sandbox import LOG_HEAD, LOG_TAIL

    out = _run("flood", tmp_path)
    assert out.ok, out.message()
    log = (tmp_path / "logs" / "flood.stdout").read_bytes()
    assert log.endswith(b"THE END") and b"bytes cut by the verifier" in log
    assert LOG_HEAD + LOG_TAIL < len(log) < LOG_HEAD + LOG_TAIL + 100
    attack = next(r for r in out.records if r["part"] == "attack")
    assert attack == {"part": "attack", "truncate": False, "fallocate": False}


def test_an_escaped_writer_costs_one_grace_period_and_is_reported(tmp_path, monkeypatch):
    import signal

    from coda_agent.verifier.confine import sandbox

    monkeypatch.setattr(sandbox, "DRAIN_GRACE_S", 1.0)
    t0 = time.monotonic()
    out = _run("escape", tmp_path)
    waited = time.monotonic() - t0
    pid = next(r["pid"] for r in out.records if r["part"] == "escaped")
    os.kill(pid, signal.SIGKILL)
    assert out.ok and out.finished
    assert waited < 10, waited  # one shared deadline, not one per pipe, and not the child's 60 s
    assert out.output_problems and all("still held open" in p for p in out.output_problems), out.output_problems
    assert "still held open" in out.message()


def test_confined_worker_records_go_through_a_pipe(tmp_path):
    results = tmp_path / "results.jsonl"
    out = run_worker(
        "sandbox_fixtures.piped",
        [],
        60,
        cwd=HERE,
        env=_env(),
        results=results,
        log_dir=tmp_path / "logs",
        confine=[tmp_path / "scratch"],
    )
    assert out.ok, out.message()
    assert [r["part"] for r in out.records] == ["begin", "attack", "done"]
    assert out.records[1]["truncate"] is False
    # the launcher's description reached the worker: Landlock (or why not), capabilities dropped
    assert out.records[0]["sandbox"].startswith(("landlock ABI", "unavailable: ")), out.records[0]
    assert out.records[0]["sandbox"].endswith("; no capabilities"), out.records[0]


def test_a_results_file_the_parent_cannot_write_is_the_verifiers_problem(tmp_path):
    # the drain keeps reading when its file fails, so the worker never sees a broken pipe
    # (that would read as the candidate's crash); the outcome says what the verifier lost
    results = tmp_path / "results.jsonl"
    results.mkdir()  # not writable as a file
    out = run_worker(
        "sandbox_fixtures.piped",
        [],
        60,
        cwd=HERE,
        env=_env(),
        results=results,
        log_dir=tmp_path / "logs",
        confine=[tmp_path / "scratch"],
    )
    assert out.ok and out.records == []
    assert len(out.output_problems) == 1 and out.output_problems[0].startswith("cannot open results.jsonl")
    assert out.records_lost == out.output_problems[0]


def _children_in_group(pgid: int) -> list[int]:
    kids = []
    for task in Path("/proc/self/task").iterdir():
        try:
            kids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    out = []
    for pid in kids:
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                out.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return out


def test_children_a_worker_made_ours_are_reaped(tmp_path):
    out = _run("orphans", tmp_path)
    rec = next(r for r in out.records if r["part"] == "orphans")
    assert out.ok and rec["made"] == 20  # unconfined here: the filter denies CLONE_PARENT in workers
    assert _children_in_group(rec["pgid"]) == []  # no zombie of the worker's group left with us


def test_a_symlinked_log_file_is_replaced_not_written_through(tmp_path):
    """A symlink where a worker's log goes would make the verifier truncate the file it
    names and stream the worker's output into it. The link is replaced by a log file."""
    victim = tmp_path / "accepted_kernel.py"
    victim.write_text("accepted work\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ok.stdout").symlink_to(victim)
    (logs / "ok.stderr").symlink_to(victim)
    out = _run("ok", tmp_path)
    assert out.ok and victim.read_text() == "accepted work\n"
    assert not (logs / "ok.stdout").is_symlink() and (logs / "ok.stdout").read_text().startswith('{"part": "done"')


def test_read_worker_file_refuses_links_fifos_and_big_files(tmp_path):
    """What a confined worker wrote in its own folder is read without following a symlink,
    waiting on a FIFO or reading past the limit (the compile worker's result.json is
    candidate-writable)."""
    from coda_agent.verifier.confine.sandbox import read_worker_file

    ok = tmp_path / "result.json"
    ok.write_bytes(b'{"phase": "done"}')
    assert read_worker_file(ok) == b'{"phase": "done"}'
    assert read_worker_file(tmp_path / "missing") is None
    link = tmp_path / "link.json"
    link.symlink_to(ok)
    assert read_worker_file(link) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert read_worker_file(fifo) is None
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 101)
    assert read_worker_file(big, limit=100) is None and read_worker_file(big, limit=101) == b"x" * 101

"""Run a verifier worker in its own process group, with a timeout, and classify how it ended.

Why a subprocess: the candidate is untrusted GPU code. It may segfault, hang, hit an
illegal memory access (which poisons the CUDA context for the rest of the process) or
tamper with anything in its interpreter. Running it as ``python -m <worker>`` in a new
session means the parent survives all of that and can kill the whole process group
(workers may spawn compiler subprocesses) when the time is up.

Results never come back through stdout (a candidate could print anything there):
workers append JSON records to a results file (see :mod:`coda_agent.verifier.gpu.protocol`;
a confined worker writes them into a pipe that the parent copies there). stdout/stderr
reach log files through pipes the parent drains with a cap (:class:`_Drain`), and only a
short, ANSI-stripped stderr tail is kept, for the error message. Classification, in order:

* ``timeout`` -- still running at the deadline (a hang); the group is killed;
* ``signal``  -- killed by a signal (segfault, abort, OOM killer);
* ``cuda-error`` -- nonzero exit and stderr mentions a CUDA fault (illegal memory
  access, launch failure, ``CUDA error``);
* ``exception`` -- any other nonzero exit (a Python traceback);
* ``ok`` -- exit status 0.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from .records import last_begun, read_records_checked

OutcomeStatus = Literal["ok", "exception", "signal", "timeout", "cuda-error"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")

CUDA_ERROR_PATTERNS = (
    "illegal memory access",
    "illegal address",
    "misaligned address",
    "unspecified launch failure",
    "cudaErrorIllegalAddress",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA error:",
    "CUDA_ERROR_",
    "device-side assert",
    "an illegal instruction was encountered",
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI colour/cursor escape sequences."""
    return _ANSI.sub("", text)


def tail(text: str, max_chars: int = 4000, max_lines: int = 60) -> str:
    """The last ``max_lines`` lines / ``max_chars`` characters of ``text``, ANSI-stripped."""
    lines = strip_ansi(text).rstrip().splitlines()[-max_lines:]
    out = "\n".join(lines)
    return out[-max_chars:]


@dataclass
class WorkerOutcome:
    """How a worker process ended.

    ``status``: see the module docstring; ``returncode`` (negative = signal number on
    POSIX); ``signal_name`` e.g. ``"SIGSEGV"``; ``stderr_tail`` ANSI-stripped; ``records``
    the JSON records the worker wrote; ``died_in`` the part it had begun and not
    finished; ``duration_s`` wall seconds; ``output_problems`` what the parent could not
    keep of the worker's output (a log or results file it failed to write, or a pipe still
    held open by an escaped process at the deadline): the verifier's problem, said in
    :meth:`message`; ``records_lost`` the one of those that lost records (the results
    file could not be written: nothing can be judged); ``record_anomalies`` what in the results file the worker's own code
    does not write (:func:`~coda_agent.verifier.confine.records.read_records_checked`).
    """

    status: OutcomeStatus
    returncode: int | None
    duration_s: float
    stderr_tail: str = ""
    signal_name: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    died_in: str | None = None
    timeout_s: float | None = None
    output_problems: list[str] = field(default_factory=list)
    records_lost: str | None = None
    record_anomalies: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def finished(self) -> bool:
        """The worker wrote its final ``done`` record (even if teardown then crashed)."""
        return any(r.get("part") == "done" for r in self.records)

    def message(self) -> str:
        """One human-readable paragraph: what happened, where, and the stderr tail."""
        where = f" during {self.died_in}" if self.died_in else ""
        lost = "(verifier: " + "; ".join(self.output_problems) + ")" if self.output_problems else ""
        if self.status == "ok":
            return "worker finished" + (f" {lost}" if lost else "")
        if self.status == "timeout":
            head = f"hang: no result after {self.timeout_s:.0f} s{where}; the process group was killed"
        elif self.status == "signal":
            head = f"crash: killed by {self.signal_name or 'a signal'}{where}"
        elif self.status == "cuda-error":
            head = f"CUDA error{where}"
        else:
            head = f"Python exception{where} (exit status {self.returncode})"
        if lost:
            head += f"\n{lost}"
        return head + (f"\n{self.stderr_tail}" if self.stderr_tail else "")


LAUNCHER = "coda_agent.verifier.confine.launch"
"""The module that confines a worker before it runs (``run_worker(confine=...)``)."""

ENV_KEEP = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_",
    "TZ",
    "TMPDIR",
    "PYTHON",
    "VIRTUAL_ENV",
    "CONDA",
    "LD_LIBRARY_PATH",
    "CUDA_",
    "CUTE_DSL_",
    "QUACK_",
    "TRITON_",
    "NVIDIA_",
    "TORCH",
    "OMP_",
    "MKL_",
    "CC",
    "CXX",
    "CODA_FS_SANDBOX",
    "CODA_SECCOMP",
)
"""Environment variables (exact names or prefixes) a worker gets; everything else (API
keys, tokens, CI secrets) stays in the trusted parent."""


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment filtered through :data:`ENV_KEEP`, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if any(k == p or k.startswith(p) for p in ENV_KEEP)}
    env.update(extra or {})
    return env


def tail_file(path: str | Path, limit: int = 64 * 1024) -> str:
    """The last ``limit`` bytes of a file as text ('' when missing): a candidate may flood
    its stderr, and the parent must not read gigabytes to report a failure."""
    path = Path(path)
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode("utf-8", errors="replace")


def read_worker_file(path: str | Path, limit: int = 16 << 20) -> bytes | None:
    """The bytes of a file a confined worker wrote in its own folder, or None when it is
    missing, not a regular file (a symlink is not followed, a FIFO not waited on) or
    larger than ``limit`` bytes: the parent reads what candidate code could have replaced
    (``result.json`` read whole, through any symlink, would be the candidate's to choose)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


WORKER_FSIZE_LIMIT = 1 << 30
"""Largest file a worker may write (bytes): saved trial tensors are small (benchmark
shapes are saved as samples); this stops floods in its own folder. Its stdout/stderr go
through pipes the parent caps (:data:`LOG_HEAD`; threat 25 of docs/threat-model.md)."""


LOG_HEAD, LOG_TAIL = 4 << 20, 1 << 20
"""Bytes of a worker's stdout/stderr kept: the first ``LOG_HEAD``, then only the last
``LOG_TAIL`` (what a report quotes)."""

RESULTS_CAP = 16 << 20
"""Bytes of records kept from a confined worker's results pipe (a legitimate stream is
well under 1 MiB); beyond it the stream is dropped, so a flood loses the worker's own
``done`` record and reads as an unfinished run. Small on purpose: the parent parses
what it keeps (a 255 MiB record takes it to 6.4 GiB)."""


DRAIN_GRACE_S = 10.0
"""Seconds the parent waits, after the worker's process group is gone, for its pipes to
reach end of file (a writer that escaped the group keeps them open)."""


class _Drain(threading.Thread):
    """Copies the pipe ``rfd`` into ``path`` (appending) until every writer has closed it:
    the first ``head`` bytes as they come, then only the last ``tail`` bytes, written at
    the end after a cut marker (``tail=0``: the rest is dropped). A failure to write the
    file is kept in ``error`` and the pipe is still read to its end, so the worker never
    sees a broken pipe for the verifier's problem.

    Why pipes: a worker that holds a *file* descriptor can seek, truncate, ``fallocate``
    or clear ``O_APPEND`` on it whatever Landlock says (rights are checked at open time),
    and so rewrite earlier records of the results file or hide gigabytes behind 16-byte
    logs (threats 24 and 25 of docs/threat-model.md). A pipe's write end can only append."""

    def __init__(self, rfd: int, path: Path, head: int, tail: int):
        super().__init__(name=f"drain-{path.name}", daemon=True)
        self.rfd, self.path, self.head, self.tail = rfd, path, head, tail
        self.error: str | None = None

    def run(self) -> None:
        kept, cut, ring = 0, 0, bytearray()
        f = None
        try:
            # never through a symlink: the verifier would write wherever it points
            f = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "ab")
        except OSError as e:
            self.error = f"cannot open {self.path.name}: {e}"
        try:
            while chunk := _read(self.rfd):
                if kept < self.head:
                    n = min(len(chunk), self.head - kept)
                    kept, part, chunk = kept + n, chunk[:n], chunk[n:]
                    self._write(f, part)
                if chunk:
                    cut += len(chunk)
                    if self.tail:
                        ring += chunk
                        del ring[: max(0, len(ring) - self.tail)]
            if cut > len(ring):
                self._write(f, b"\n[... %d bytes cut by the verifier ...]\n" % (cut - len(ring)))
            self._write(f, bytes(ring))
        finally:
            os.close(self.rfd)
            if f is not None:
                f.close()

    def _write(self, f: Any, data: bytes) -> None:
        if f is None or self.error is not None or not data:
            return
        try:
            f.write(data)
            f.flush()
        except OSError as e:
            self.error = f"cannot write {self.path.name}: {e}"


def _read(rfd: int) -> bytes:
    try:
        return os.read(rfd, 1 << 16)
    except OSError:
        return b""


def _limit_worker() -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    cap = WORKER_FSIZE_LIMIT if hard == resource.RLIM_INFINITY else min(WORKER_FSIZE_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, hard))


def classify(returncode: int | None, stderr: str, timed_out: bool) -> tuple[OutcomeStatus, str | None]:
    """``(status, signal_name)`` from an exit status and the stderr text (see module doc)."""
    if timed_out:
        return "timeout", None
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "signal", name
    if returncode == 0:
        return "ok", None
    text = strip_ansi(stderr)
    if any(p.lower() in text.lower() for p in CUDA_ERROR_PATTERNS):
        return "cuda-error", None
    return "exception", None


def _reap_group(pgid: int, wait_s: float = 2.0) -> None:
    """Wait for (reap) every child of *this* process still in the worker's group: a child
    made with ``CLONE_PARENT`` is ours, not the worker's, and would stay a zombie (a
    candidate can make thousands). Returns when none is left or after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def kill_group(pgid: int) -> None:
    """SIGTERM the process group, then SIGKILL it half a second later (an empty group: nothing to do)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGTERM:
            time.sleep(0.5)


_LIVE_GROUPS: set[int] = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: the CLI's signal handler may interrupt track_group in the main thread


def track_group(pgid: int, live: bool) -> None:
    """Register (``live=True``) or forget the process group of a running worker or command
    (:func:`kill_live_groups` kills the registered ones)."""
    with _LIVE_LOCK:
        (_LIVE_GROUPS.add if live else _LIVE_GROUPS.discard)(pgid)


_KILL_HOOKS: list[Callable[[], None]] = []


def on_kill(hook: Callable[[], None]) -> None:
    """Have :func:`kill_live_groups` also call ``hook`` (no waiting in it): work running
    elsewhere, such as the Ray tasks of ``verifier/schedule/ray_executor.py``, is stopped with
    the local workers."""
    with _LIVE_LOCK:
        if hook not in _KILL_HOOKS:
            _KILL_HOOKS.append(hook)


def kill_live_groups() -> int:
    """SIGKILL every registered process group; returns how many there were. The CLI calls it
    when it is interrupted (Ctrl-C, SIGTERM): each worker runs in its own session, so no
    terminal signal reaches it, and a compile waited on in a pool thread never sees the
    main thread's KeyboardInterrupt (a hanging candidate's compile worker would outlive
    `coda-agent verify` by minutes). The :func:`on_kill` hooks run too. Safe in a signal
    handler: no waiting."""
    with _LIVE_LOCK:
        groups = list(_LIVE_GROUPS)
        hooks = list(_KILL_HOOKS)
    for hook in hooks:
        try:
            hook()
        except Exception:  # noqa: BLE001 -- stopping what can be stopped comes first
            pass
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(groups)


def _kill_now(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group and reap it: the caller is being interrupted, so no
    grace period (what the group was doing is abandoned either way)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def feed(pipe: Any, data: bytes) -> None:
    """Write ``data`` into a worker's stdin and close it (a worker that exits early or never
    reads only makes the write fail: nothing to report)."""
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def run_worker(
    module: str,
    args: list[str],
    timeout_s: float,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    *,
    results: str | Path | None = None,
    log_dir: str | Path | None = None,
    confine: list[str | Path] | None = None,
    stdin_data: bytes | None = None,
) -> WorkerOutcome:
    """Run ``sys.executable -m <module> <args...>`` in a new session and wait at most ``timeout_s`` s.

    ``env`` replaces the environment (default: :func:`worker_env`, ours without secrets);
    ``PYTHONFAULTHANDLER=1``
    and ``PYTHONUNBUFFERED=1`` are always set so a segfault leaves a Python stack in
    stderr. ``results`` is the worker's results file (read back into
    ``WorkerOutcome.records``); ``log_dir`` keeps ``<module>.stdout/.stderr`` (a temp
    folder otherwise); both reach their files through pipes (:class:`_Drain`, at most
    :data:`LOG_HEAD` + :data:`LOG_TAIL` bytes each). ``confine`` (folders that stay
    writable) starts the worker through :mod:`~coda_agent.verifier.confine.launch`:
    confined before its first import, writing its records into a pipe that the parent
    copies to ``results``. ``stdin_data`` is written into the worker's stdin (then closed):
    how a secret reaches a worker without lying on disk, where a confined worker can still
    read. On timeout the whole process group gets SIGTERM, then SIGKILL.
    Never raises for anything the worker does; raises ``OSError`` only if the
    interpreter cannot be started.
    """
    full_env = dict(worker_env() if env is None else env)
    full_env["PYTHONFAULTHANDLER"] = "1"
    full_env["PYTHONUNBUFFERED"] = "1"
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="coda-worker-")
        log_dir = tmp.name
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    short = module.rsplit(".", 1)[-1]
    out_path, err_path = log_dir / f"{short}.stdout", log_dir / f"{short}.stderr"
    for path in (out_path, err_path):  # a symlink in the log folder is replaced, never followed
        if path.is_symlink():
            path.unlink()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644))
    t0 = time.monotonic()
    timed_out = False
    # (read end, write end, file it drains into, head, tail); ends not yet handed over
    pipes: list[tuple[int, int, Path, int, int]] = []
    drains: list[_Drain] = []
    proc: subprocess.Popen | None = None
    try:
        for path, head, tail_ in ((out_path, LOG_HEAD, LOG_TAIL), (err_path, LOG_HEAD, LOG_TAIL)):
            pipes.append((*os.pipe(), path, head, tail_))
        cmd = [sys.executable, "-m", module, *args]
        if confine is not None:
            launch = [a for d in confine for a in ("--write", str(d))]
            if results is not None:
                pipes.append((*os.pipe(), Path(results), RESULTS_CAP, 0))
                launch += ["--results-fd", str(pipes[2][1])]
            cmd = [sys.executable, "-m", LAUNCHER, *launch, module, "--", *args]
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=str(cwd) if cwd is not None else None,
                env=full_env,
                stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                stdout=pipes[0][1],
                stderr=pipes[1][1],
                pass_fds=tuple(p[1] for p in pipes[2:]),
                start_new_session=True,
                preexec_fn=_limit_worker,
            )
        finally:
            for i, (r, w, path, head, tail_) in enumerate(pipes):  # the worker holds the write ends now
                os.close(w)
                pipes[i] = (r, -1, path, head, tail_)
        track_group(proc.pid, True)
        if stdin_data is not None:  # a thread: the worker may not read before the pipe fills
            threading.Thread(target=feed, args=(proc.stdin, stdin_data), daemon=True).start()
        while pipes:  # each read end belongs to its drain thread from here on
            r, _, path, head, tail_ = pipes.pop(0)
            d = _Drain(r, path, head, tail_)
            try:
                d.start()
            except BaseException:
                os.close(r)
                raise
            drains.append(d)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc.pid)
            proc.wait()
        except BaseException:
            # Ctrl-C, or SIGTERM turned into an exception by the CLI: the worker is in its own
            # session and would run on, unread (compile workers of a hanging candidate would
            # outlive `coda-agent verify` by minutes)
            _kill_now(proc)
            raise
        else:
            # reap anything the worker left behind in its group (compilers, children)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap_group(proc.pid)
        duration = time.monotonic() - t0
        deadline = time.monotonic() + DRAIN_GRACE_S  # one deadline for every pipe
        for d in drains:
            d.join(timeout=max(0.0, deadline - time.monotonic()))
        stderr = tail_file(err_path)
    finally:
        if proc is not None:
            track_group(proc.pid, False)
        for r, w, *_ in pipes:  # only when something failed before their drains started
            for fd in (r, w):
                if fd >= 0:
                    os.close(fd)
        if tmp is not None:
            tmp.cleanup()
    problems = [d.error for d in drains if d.error]
    lost = next((d.error for d in drains if d.error and results is not None and d.path == Path(results)), None)
    problems += [
        f"{d.path.name} still held open by an escaped process after {DRAIN_GRACE_S:.0f} s "
        "(what it held was read so far)"
        for d in drains
        if d.is_alive()
    ]
    assert proc is not None  # started in the try above, which raises otherwise
    rc = None if timed_out else proc.returncode
    status, sig = classify(rc, stderr, timed_out)
    records, anomalies = read_records_checked(results) if results is not None else ([], [])
    return WorkerOutcome(
        status=status,
        returncode=rc,
        duration_s=duration,
        stderr_tail=tail(stderr),
        signal_name=sig,
        records=records,
        died_in=None if status == "ok" else last_begun(records),
        timeout_s=timeout_s,
        output_problems=problems,
        records_lost=lost,
        record_anomalies=anomalies,
    )


T = TypeVar("T")


def in_parallel(fn: Callable[[int], T], n: int, jobs: int) -> list[T]:
    """``[fn(0), ..., fn(n - 1)]``, at most ``jobs`` at a time in threads (each ``fn`` is
    expected to wait on a worker process). An interrupt starts nothing more and kills the
    live worker groups until the threads let go, then re-raises. With ``jobs <= 1`` the
    calls run in this thread, where a Ctrl-C reaches the wait on the worker directly."""
    if jobs <= 1 or n <= 1:
        return [fn(i) for i in range(n)]
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import wait as futures_wait

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(fn, i) for i in range(n)]
    try:
        return [f.result() for f in futures]
    except BaseException:
        # the pool threads never see the interrupt: start no more, and kill the running
        # workers until their threads let go (one may be starting its worker right now)
        pool.shutdown(wait=False, cancel_futures=True)
        while not all(f.done() for f in futures):
            kill_live_groups()
            futures_wait(futures, timeout=0.2)
        raise
    finally:
        pool.shutdown(wait=True)

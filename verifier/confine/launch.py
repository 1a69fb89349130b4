"""Start a worker module already confined, while its process still has a single thread.

Why: Landlock binds the thread that calls ``landlock_restrict_self`` and the threads and
children it starts afterwards, and a dropped capability is dropped for the calling
thread only. Threads that already exist keep full rights. A worker that confined itself
after ``import torch`` (which starts a BLAS thread pool) and after CUDA init (the
driver's threads) would leave 16 threads unconfined and running as root on the H200 host, and native code in the process can run on any of them
(e.g. through a signal handler sent with ``tgkill``; threat 22 of docs/threat-model.md).

How: ``python -m coda_agent.verifier.confine.launch --write DIR ... [--results-fd FD]
MODULE -- ARGS...`` imports nothing but the standard library and
:mod:`~coda_agent.verifier.confine.landlock`, applies
:func:`~coda_agent.verifier.confine.landlock.confine_worker` with ``seccomp=False`` (Landlock
and the capability drop) while the interpreter has exactly one thread, and then runs ``MODULE`` as
``__main__`` in the same process (:func:`runpy.run_module`). Every thread that appears
later (BLAS, CUDA, the profiler, compilers' children) inherits the Landlock domain and the
empty capability sets, so the description carries no "earlier thread(s) not confined"
note. The seccomp filter is the one layer left to the worker: libcuda's init opens a
socket (denied, ``cuInit`` fails with error 304 on the H200), so the worker installs it
with :func:`~coda_agent.verifier.confine.landlock.install_seccomp` once CUDA is up; seccomp's
thread-sync flag puts it on every thread that exists then, so nothing escapes it either.

The worker learns what happened through two attributes of ``landlock``, set before it
runs (a candidate's code runs much later, after the worker's first setup record):
``LAUNCH_SANDBOX`` (the description for the verdict) and ``LAUNCH_RESULTS_FD`` (the write
end of a pipe the parent copies into ``results.jsonl``: records can only be appended; a
file descriptor opened before confinement would let candidate code truncate or rewrite
earlier records: threat 24 of docs/threat-model.md).

``CODA_FS_SANDBOX=off`` switches every layer off (the description says so);
``CODA_SECCOMP=off`` only the filter: the launcher drops capabilities either way.
"""

from __future__ import annotations

import argparse
import os
import runpy
import stat
import sys

from . import landlock


def main(argv: list[str] | None = None) -> None:
    """Confine this process, then run the worker module (never returns normally when the
    worker ends with ``os._exit``). Everything after the first ``--`` is the worker's
    command line, untouched. Raises ``SystemExit(2)`` on a bad command line, including a
    ``--results-fd`` that is not a pipe (nothing was confined then)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    own, args = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(description="run a worker module, confined from its first instruction")
    ap.add_argument(
        "--write",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder that stays writable (repeatable; created when missing)",
    )
    ap.add_argument(
        "--results-fd",
        type=int,
        metavar="FD",
        help="inherited write end of the parent's results pipe (sandbox.run_worker)",
    )
    ap.add_argument("module", help="the worker module to run as __main__ (its arguments follow --)")
    a = ap.parse_args(own)
    if a.results_fd is not None:
        try:
            is_pipe = stat.S_ISFIFO(os.fstat(a.results_fd).st_mode)
        except OSError:
            is_pipe = False
        if not is_pipe:  # a file descriptor could be truncated or rewritten: pipes only
            ap.error(f"--results-fd {a.results_fd} is not an open pipe")
        os.set_inheritable(a.results_fd, False)  # the worker's own children do not get it
        landlock.LAUNCH_RESULTS_FD = a.results_fd
    landlock.LAUNCH_SANDBOX = landlock.confine_worker(a.write, seccomp=False)
    sys.argv = [a.module, *args]
    runpy.run_module(a.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

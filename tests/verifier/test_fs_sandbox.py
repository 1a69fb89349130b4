"""verifier/confine/landlock.py: Landlock confinement, checked in a child process (it is irreversible).

Skipped (never faked) where the kernel has no Landlock."""

import os
import subprocess
import sys
import textwrap

import pytest
from verifier_helpers import run_child

from coda_agent.verifier.confine.landlock import SandboxUnavailable, abi_version, confine_worker, write_rights
from coda_agent.verifier.confine.sandbox import LAUNCHER

try:
    ABI = abi_version()
except SandboxUnavailable:  # pragma: no cover - depends on the kernel
    ABI = None

needs_landlock = pytest.mark.skipif(ABI is None, reason="this kernel has no Landlock")


_child = run_child


@needs_landlock
def test_writes_only_beneath_the_given_folders(tmp_path):
    ok, other = tmp_path / "ok", tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    out = _child(f"""
        import os, subprocess
        from coda_agent.verifier.confine.landlock import confine_worker
        print(confine_worker([{str(ok)!r}]))
        open({str(ok / "a.txt")!r}, "w").write("x"); print("inside ok")
        for what, f in (("create", lambda: open({str(other / "b.txt")!r}, "w")),
                        ("truncate", lambda: os.truncate({str(other / "keep.txt")!r}, 0)),
                        ("remove", lambda: os.remove({str(other / "keep.txt")!r})),
                        ("mkdir", lambda: os.mkdir({str(other / "d")!r}))):
            try:
                f(); print(what, "ALLOWED")
            except PermissionError:
                print(what, "denied")
        r = subprocess.run(["sh", "-c", "echo x > {other / "c.txt"}"], capture_output=True)
        print("child", "denied" if r.returncode else "ALLOWED")
        open("/dev/null", "w").write("x"); print("devnull ok")
        try:
            open("/dev/shm/coda-sandbox-test", "w"); print("shm ALLOWED")
        except PermissionError:
            print("shm denied")
        except FileNotFoundError:
            print("shm denied")  # no /dev/shm on this machine: nothing to write to either
    """)
    assert out[0].startswith(f"landlock ABI {ABI}: writes only beneath 3 path(s)")  # + its /proc/<pid>
    assert out[1:] == [
        "inside ok",
        "create denied",
        "truncate denied",
        "remove denied",
        "mkdir denied",
        "child denied",
        "devnull ok",
        "shm denied",
    ]
    assert (other / "keep.txt").read_text() == "precious" and not (other / "b.txt").exists()


@needs_landlock
def test_signals_to_the_parent_are_denied_where_scoped():
    if ABI < 6:
        pytest.skip(f"Landlock ABI {ABI} has no signal scoping")
    out = _child("""
        import os
        from coda_agent.verifier.confine.landlock import confine_worker
        confine_worker(["/tmp"])
        try:
            os.kill(os.getppid(), 0); print("ALLOWED")
        except PermissionError:
            print("denied")
    """)
    assert out == ["denied"]


def test_off_switch_and_rights(monkeypatch):
    monkeypatch.setenv("CODA_FS_SANDBOX", "off")
    assert confine_worker(["/tmp"]) == "off (CODA_FS_SANDBOX=off)"  # nothing applied in this process
    assert write_rights(1) & (1 << 14) == 0 and write_rights(3) & (1 << 14)  # TRUNCATE from ABI 3


@needs_landlock
def test_description_counts_threads_that_landlock_does_not_bind(tmp_path):
    # Landlock confines the calling thread and what it starts, not threads that exist
    # already (torch's and CUDA's in the candidate worker): the verdict must say so
    out = _child(f"""
        import threading
        from coda_agent.verifier.confine.landlock import restrict_writes
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        print(restrict_writes([{str(tmp_path)!r}]))
        stop.set()
    """)
    assert "; 1 earlier thread(s) not confined" in out[0], out
    alone = _child(f"""
        from coda_agent.verifier.confine.landlock import restrict_writes
        print(restrict_writes([{str(tmp_path)!r}]))
    """)
    assert "earlier thread" not in alone[0], alone


@needs_landlock
def test_launcher_confines_before_any_thread_and_threads_inherit(tmp_path):
    # confine/launch.py confines while the interpreter has one thread, then runs the worker
    # module: threads the worker starts later (numpy's BLAS pool, a Python thread) are bound
    # too; records go into a pipe (no truncating/rewriting them) and the file is read-only
    ok, other = tmp_path / "ok", tmp_path / "other"
    other.mkdir()
    results = tmp_path / "results.jsonl"
    results.write_text("first\n")
    (tmp_path / "launched_probe.py").write_text(
        textwrap.dedent(f"""
        import os, sys, threading
        import numpy  # starts a BLAS thread pool on import
        from coda_agent.verifier.confine import landlock
        print(landlock.LAUNCH_SANDBOX)
        print("argv", sys.argv[1:])
        print("threads", len(os.listdir("/proc/self/task")) > 1)
        def attempt():
            try:
                open({str(other / "from-thread.txt")!r}, "w"); print("thread write ALLOWED")
            except PermissionError:
                print("thread write denied")
        t = threading.Thread(target=attempt); t.start(); t.join()
        fd = landlock.LAUNCH_RESULTS_FD
        os.write(fd, b"record\\n"); print("pipe append ok")
        for what, call in (("truncate", lambda: os.ftruncate(fd, 0)), ("pwrite", lambda: os.pwrite(fd, b"x", 0)),
                           ("fallocate", lambda: os.posix_fallocate(fd, 0, 1 << 20))):
            try:
                call(); print(what, "ALLOWED")
            except OSError:
                print(what, "fails")
        try:
            open({str(results)!r}, "w"); print("results rewrite ALLOWED")
        except PermissionError:
            print("results rewrite denied")
    """)
    )
    r_fd, w_fd = os.pipe()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            LAUNCHER,
            "--write",
            str(ok),
            "--results-fd",
            str(w_fd),
            "launched_probe",
            "--",
            "--dir",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        pass_fds=(w_fd,),
        env={
            **os.environ,
            "OPENBLAS_NUM_THREADS": "2",
            "OMP_NUM_THREADS": "2",  # a pool exists
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        },
    )
    os.close(w_fd)
    with os.fdopen(r_fd, "rb") as f:
        piped = f.read()
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith(f"landlock ABI {ABI}: writes only beneath") and "earlier thread" not in out[0], out
    assert out[1:] == [
        "argv ['--dir', 'x']",
        "threads True",
        "thread write denied",
        "pipe append ok",
        "truncate fails",
        "pwrite fails",
        "fallocate fails",
        "results rewrite denied",
    ], out
    assert piped == b"record\n" and results.read_text() == "first\n" and not (other / "from-thread.txt").exists()


@pytest.mark.gpu
def test_cuda_comes_up_inside_the_launched_confinement(tmp_path):
    # the candidate worker initializes CUDA (driver threads, device nodes) already confined
    # by Landlock with no capabilities, then adds seccomp: the profiler works under all
    (tmp_path / "cuda_probe.py").write_text(
        textwrap.dedent("""
        import os, subprocess
        import torch
        from coda_agent.verifier.confine import landlock
        print(landlock.LAUNCH_SANDBOX)
        torch.cuda.get_device_capability(0)  # the worker's order: driver up, then seccomp,
        seccomp = landlock.install_seccomp(drop_caps=False)  # then the context and kernels
        a = torch.randn(256, 256, device="cuda")
        print("matmul", float((a @ a).abs().sum()) > 0)
        print(seccomp)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            (a * 2).sum(); torch.cuda.synchronize()
        print("profiler", any(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        print("nvidia-smi", smi.returncode == 0, smi.stderr.strip()[:200])
    """)
    )
    (tmp_path / "w").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", LAUNCHER, "--write", str(tmp_path / "w"), "cuda_probe"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "TMPDIR": str(tmp_path / "w"),  # as the pipeline gives the worker
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        },
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert "earlier thread" not in out[0] and out[0].endswith("; no capabilities"), out
    assert out[1] == "matmul True" and out[2].startswith("seccomp: ") and out[3] == "profiler True", out
    print(out)  # nvidia-smi confined: informative (the verdict's driver comes from the reference worker)

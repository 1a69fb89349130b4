"""verifier/fs_sandbox.py: Landlock confinement, checked in a child process (it is irreversible).

Skipped (never faked) where the kernel has no Landlock."""


import pytest
from verifier_helpers import run_child

from coda_agent.verifier.fs_sandbox import SandboxUnavailable, abi_version, confine_worker, write_rights

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
        from coda_agent.verifier.fs_sandbox import confine_worker
        print(confine_worker([{str(ok)!r}]))
        open({str(ok / 'a.txt')!r}, "w").write("x"); print("inside ok")
        for what, f in (("create", lambda: open({str(other / 'b.txt')!r}, "w")),
                        ("truncate", lambda: os.truncate({str(other / 'keep.txt')!r}, 0)),
                        ("remove", lambda: os.remove({str(other / 'keep.txt')!r})),
                        ("mkdir", lambda: os.mkdir({str(other / 'd')!r}))):
            try:
                f(); print(what, "ALLOWED")
            except PermissionError:
                print(what, "denied")
        r = subprocess.run(["sh", "-c", "echo x > {other / 'c.txt'}"], capture_output=True)
        print("child", "denied" if r.returncode else "ALLOWED")
        open("/dev/null", "w").write("x"); print("devnull ok")
        try:
            open("/dev/shm/coda-sandbox-test", "w"); print("shm ALLOWED")
        except PermissionError:
            print("shm denied")
        except FileNotFoundError:
            print("shm denied")  # no /dev/shm on this machine: nothing to write to either
    """)
    assert out[0].startswith(f"landlock ABI {ABI}: writes only beneath 2 path(s)")
    assert out[1:] == ["inside ok", "create denied", "truncate denied", "remove denied", "mkdir denied", "child denied",
                       "devnull ok", "shm denied"]
    assert (other / "keep.txt").read_text() == "precious" and not (other / "b.txt").exists()


@needs_landlock
def test_signals_to_the_parent_are_denied_where_scoped():
    if ABI < 6:
        pytest.skip(f"Landlock ABI {ABI} has no signal scoping")
    out = _child("""
        import os
        from coda_agent.verifier.fs_sandbox import confine_worker
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
        from coda_agent.verifier.fs_sandbox import restrict_writes
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        print(restrict_writes([{str(tmp_path)!r}]))
        stop.set()
    """)
    assert "; 1 earlier thread(s) not confined" in out[0], out
    alone = _child(f"""
        from coda_agent.verifier.fs_sandbox import restrict_writes
        print(restrict_writes([{str(tmp_path)!r}]))
    """)
    assert "earlier thread" not in alone[0], alone

"""verifier/confine/seccomp.py: the filter on top of Landlock, checked in child processes
(it is irreversible). Skipped (never faked) off x86_64 Linux."""

import platform

import pytest
from verifier_helpers import run_child

from coda_agent.verifier.confine.seccomp import (
    AUDIT_ARCH_X86_64,
    DENIED_IOCTLS,
    DENIED_X86_64,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SELF_ONLY_X86_64,
    X32_SYSCALL_BIT,
    program,
)

x86_64_linux = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="the filter lists x86_64 syscall numbers only",
)


def _run_bpf(rows, nr, arch=AUDIT_ARCH_X86_64, args=(0, 0, 0, 0, 0, 0)):
    """A tiny classic-BPF interpreter for the opcodes program() uses: what the kernel
    would return for a call ``nr(*args)`` of architecture ``arch``."""
    data = {0: nr, 4: arch}
    for i, a in enumerate(args):
        data[16 + 8 * i], data[20 + 8 * i] = a & 0xFFFFFFFF, (a >> 32) & 0xFFFFFFFF
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = rows[pc]
        if code == 0x20:
            acc = data[k]
            pc += 1
        elif code == 0x54:
            acc &= k
            pc += 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x45:
            pc += 1 + (jt if acc & k else jf)
        elif code == 0x06:
            return k
        else:  # pragma: no cover
            raise AssertionError(f"opcode {code:#x}")


def test_program_denies_exactly_the_listed_calls():
    rows = program()
    deny = SECCOMP_RET_ERRNO | 1
    for name, nr in DENIED_X86_64.items():
        assert _run_bpf(rows, nr) == deny, name
    # everything else a worker does stays allowed: read, write, openat, mmap, clone, futex
    for nr in (0, 1, 257, 9, 56, 202):
        assert _run_bpf(rows, nr) == SECCOMP_RET_ALLOW, nr
    # x32 calls (the same syscalls under other numbers) and other architectures: denied
    assert _run_bpf(rows, X32_SYSCALL_BIT | 90) == deny
    assert _run_bpf(rows, 15, arch=0x40000003) == deny  # AUDIT_ARCH_I386
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in rows)


def test_program_checks_arguments():
    rows = program()
    deny = SECCOMP_RET_ERRNO | 1
    # scheduling/priority/rlimits: on the caller (0) only, never on the parent's pid
    for name, (nr, idx) in SELF_ONLY_X86_64.items():
        assert _run_bpf(rows, nr) == SECCOMP_RET_ALLOW, name
        for i in idx:
            for target in (4242, 1 << 32):
                args = [0] * 6
                args[i] = target
                assert _run_bpf(rows, nr, args=args) == deny, (name, i, target)
    # setpriority(PRIO_USER=2, 0, 19) renices every process of the uid
    assert _run_bpf(rows, 141, args=(2, 0, 19, 0, 0, 0)) == deny
    # ioctl: the CUDA driver's pass, the file-attribute ones do not
    assert _run_bpf(rows, 16, args=(5, 0xC0104E4A, 0, 0, 0, 0)) == SECCOMP_RET_ALLOW
    for cmd in DENIED_IOCTLS.values():
        assert _run_bpf(rows, 16, args=(5, cmd, 0, 0, 0, 0)) == deny
    # user namespaces (every capability again inside one): never; other clone flags: yes
    assert _run_bpf(rows, 272, args=(0x10000000, 0, 0, 0, 0, 0)) == deny  # unshare(CLONE_NEWUSER)
    assert _run_bpf(rows, 56, args=(0x10000000 | 0x11, 0, 0, 0, 0, 0)) == deny  # clone(CLONE_NEWUSER|SIGCHLD)
    assert _run_bpf(rows, 56, args=(0x3D0F00, 0, 0, 0, 0, 0)) == SECCOMP_RET_ALLOW  # a pthread's clone
    assert _run_bpf(rows, 56, args=(0x01200011, 0, 0, 0, 0, 0)) == SECCOMP_RET_ALLOW  # fork()'s clone
    assert _run_bpf(rows, 56, args=(0x8000 | 0x11, 0, 0, 0, 0, 0)) == deny  # CLONE_PARENT: the verifier's zombie
    # fcntl: everything but leases (F_SETLEASE stalls other openers of a read-only file)
    assert _run_bpf(rows, 72, args=(5, 3, 0, 0, 0, 0)) == SECCOMP_RET_ALLOW  # F_GETFL
    assert _run_bpf(rows, 72, args=(5, 1024, 0, 0, 0, 0)) == deny
    assert _run_bpf(rows, 272, args=(0x400, 0, 0, 0, 0, 0)) == SECCOMP_RET_ALLOW  # unshare(CLONE_FILES)
    assert _run_bpf(rows, 435) == SECCOMP_RET_ERRNO | 38  # clone3: ENOSYS, libc falls back to clone
    # fallocate: plain (the size grows: rlimit and budgets see it) yes; KEEP_SIZE/PUNCH_HOLE no
    assert _run_bpf(rows, 285, args=(5, 0, 0, 1 << 20, 0, 0)) == SECCOMP_RET_ALLOW
    for mode in (1, 3, 0x10):  # EOPNOTSUPP: what preallocating callers fall back on
        assert _run_bpf(rows, 285, args=(5, mode, 0, 1 << 20, 0, 0)) == SECCOMP_RET_ERRNO | 95, mode
    # socketpair: stream pairs (with flags like SOCK_CLOEXEC) yes, datagram/seqpacket no
    assert _run_bpf(rows, 53, args=(1, 1 | 0o2000000, 0, 0, 0, 0)) == SECCOMP_RET_ALLOW
    assert _run_bpf(rows, 53, args=(1, 2, 0, 0, 0, 0)) == deny
    assert _run_bpf(rows, 53, args=(1, 5, 0, 0, 0, 0)) == deny


_child = run_child


@x86_64_linux
def test_installed_filter_denies_sockets_and_metadata_changes_on_every_thread(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    out = _child(f"""
        import ctypes, os, socket, threading
        from coda_agent.verifier.confine.seccomp import install
        go, done = threading.Event(), threading.Event()
        seen = []
        def early():  # a thread that exists before the filter (as CUDA's do)
            go.wait()
            try:
                os.chmod({str(f)!r}, 0o777); seen.append("early thread: chmod allowed")
            except PermissionError:
                seen.append("early thread: chmod denied")
            done.set()
        threading.Thread(target=early).start()
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        print(install())
        go.set(); done.wait(); print(seen[0])
        for what, call in (("unix", lambda: socket.socket(socket.AF_UNIX)),
                           ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
                           ("tcp6", lambda: socket.socket(socket.AF_INET6)),
                           ("chmod", lambda: os.chmod({str(f)!r}, 0o777)),
                           ("utime", lambda: os.utime({str(f)!r}, (0, 0))),
                           ("xattr", lambda: os.setxattr({str(f)!r}, "user.k", b"v"))):
            try:
                call(); print(what, "allowed")
            except PermissionError:
                print(what, "denied")
        for what, call in (("dgram pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)),
                           ("renice parent", lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)),
                           ("setsid", os.setsid)):
            try:
                call(); print(what, "allowed")
            except PermissionError:
                print(what, "denied")
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open({str(tmp_path / "h.bin")!r}, os.O_RDWR | os.O_CREAT)
        print("unshare user", "denied" if libc.unshare(0x10000000) != 0 else "allowed",
              "fallocate keep-size", "denied" if libc.fallocate(fd, 1, 0, 1 << 20) != 0 else "allowed")
        os.posix_fallocate(fd, 0, 4096); t = threading.Thread(target=print, args=("new thread ok",)); t.start(); t.join()
        import subprocess; print("child", subprocess.run(["true"]).returncode)
        os.setpriority(os.PRIO_PROCESS, 0, 1); print("renice self ok")
        a, b = socket.socketpair(); a.send(b"ok"); print("socketpair", b.recv(2).decode())
        open({str(tmp_path / "g.txt")!r}, "w").write("still writes"); print("write ok")
        caps = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith(("CapEff", "CapBnd"))]
        print("caps", *caps)
    """)
    assert out[0].startswith("seccomp: ") and "all threads" in out[0], out
    assert out[1] == "early thread: chmod denied"
    assert out[2:8] == ["unix denied", "udp denied", "tcp6 denied", "chmod denied", "utime denied", "xattr denied"]
    assert out[8:11] == ["dgram pair denied", "renice parent denied", "setsid denied"]
    # threads and children still start (clone3 -> ENOSYS -> clone); a plain fallocate works
    assert out[11:14] == ["unshare user denied fallocate keep-size denied", "new thread ok", "child 0"], out
    assert out[14:16] == ["renice self ok", "socketpair ok"] and out[16] == "write ok"
    # no capabilities left, even for a root worker (the bounding set too, where it could be dropped)
    assert out[17].split()[1] == "0000000000000000", out[17]
    assert out[0].endswith("; no capabilities")


@x86_64_linux
def test_switch_off_and_worker_description(tmp_path):
    out = _child(f"""
        import os
        os.environ["CODA_SECCOMP"] = "off"
        from coda_agent.verifier.confine.landlock import confine_worker
        print(confine_worker([{str(tmp_path / "w")!r}]))
        os.chmod({str(tmp_path / "w")!r}, 0o700); print("chmod allowed")
    """)
    assert out[0].endswith("; seccomp off (CODA_SECCOMP=off)") and out[1] == "chmod allowed"


@x86_64_linux
def test_confined_worker_cannot_read_the_parents_environment(tmp_path):
    """The parent holds the API key in its environment (workers get a filtered copy): a
    root worker with its capabilities could read /proc/<parent>/environ past Landlock."""
    out = _child(f"""
        import os
        from coda_agent.verifier.confine.landlock import confine_worker
        print(confine_worker([{str(tmp_path / "w")!r}]))
        try:
            open(f"/proc/{{os.getppid()}}/environ", "rb").read(); print("environ read")
        except PermissionError:
            print("environ denied")
    """)
    if not out[0].startswith("landlock"):
        pytest.skip(f"no Landlock here: {out[0]}")
    assert out[1] == "environ denied"


def test_the_off_switch_reaches_the_workers(monkeypatch):
    from coda_agent.verifier.confine.sandbox import worker_env

    monkeypatch.setenv("CODA_SECCOMP", "off")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "secret")
    env = worker_env()
    assert env["CODA_SECCOMP"] == "off" and "ANTHROPIC_API_KEY" not in env

"""A seccomp filter for the processes that run candidate code: what Landlock leaves open.

Why: Landlock (:mod:`~coda_agent.verifier.confine.landlock`, ABI 7 on the dev machine and the
H200) confines *writes* to the worker's folder, denies TCP bind/connect and scopes signals
and abstract unix sockets. It does not cover: connecting to a
*pathname* unix socket (a local daemon's control socket), UDP and other non-TCP sockets,
and changing the metadata of files outside the folder (chmod/chown/utime/xattr are not
writes to Landlock). None of that is reachable from code that passes the static stage,
but no layer may rest on the static stage alone (threat 23 of docs/threat-model.md), so the
kernel says no as well.

What it denies (``EPERM``, never a kill: a denied call is an exception the worker reports
like any other candidate error):

* ``socket`` in every address family. A worker needs no socket after CUDA is up (its
  results go through a pipe to the parent; libcuda's init does open one, so a worker that
  initializes CUDA installs the filter afterwards); ``socketpair`` stays allowed for
  stream pairs only (a datagram pair can ``sendto`` any pathname socket).
* chmod/chown/utime and extended-attribute changes, every variant (``*at``, ``f*``, ``l*``),
  ``file_setattr`` and the attribute ioctls (immutable/append-only through a read-only fd).
* ``io_uring_setup``/``enter``/``register``: io_uring performs opens, connects and sends
  from kernel workers that seccomp never sees.
* ``setsid``/``setpgid`` (a child in its own session outlives the worker's group kill),
  System V IPC, creating and operating on objects, and kernel keys (state that outlives
  the process), and scheduling, priority and rlimit calls aimed at any process but the
  caller (aimed at the parent they slow the trusted reference worker's baselines);
  ``ioprio_set`` outright; ``fcntl(F_SETLEASE)`` (a lease stalls other openers of a file).
* new user namespaces (``unshare``/``clone`` with ``CLONE_NEWUSER``; ``clone3`` fails with
  ENOSYS so libc falls back to ``clone``) and ``setns``: inside a new user namespace a
  process holds every capability again; ``clone`` with ``CLONE_PARENT`` (the child would
  be the verifier's, a zombie it never reaps); ``fallocate`` with a mode (blocks allocated
  beyond what ``st_size`` and the file-size limit see; EOPNOTSUPP, as from a file system
  without it); POSIX message queues.
* on x86_64, every x32-ABI call (``nr`` with bit 30 set), which would otherwise reach the
  same syscalls under numbers this filter does not list.

Before the filter, the calling thread drops every capability and the bounding set
(:func:`drop_capabilities`): a worker running as root would keep CAP_SYS_PTRACE and
CAP_DAC_OVERRIDE, enough to read the parent's ``/proc/<pid>/environ`` (the API key)
through Landlock's ptrace scoping, and CAP_SYS_ADMIN for mount changes, each usable from a
confined child (threat 23 of docs/threat-model.md).

How: a classic-BPF program over ``struct seccomp_data`` installed with
``seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)``, so every thread of the
process (CUDA's and torch's included) gets it, irreversibly, and children inherit it.
``PR_SET_NO_NEW_PRIVS`` must be set (Landlock sets it first). Syscall numbers are
per-architecture; only x86_64 is listed (the dev machine and the H200); elsewhere
:func:`install` reports "unavailable" and the worker runs with Landlock alone. Through
ctypes, no dependency; layouts from ``include/uapi/linux/{seccomp,filter,audit}.h``.
``CODA_SECCOMP=off`` turns both off (debugging; the verdict says so).
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

ENV_SWITCH = "CODA_SECCOMP"
"""Set to ``off`` to skip the filter (the worker's sandbox description says so)."""

SYS_SECCOMP_X86_64 = 317
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM, ENOSYS, EOPNOTSUPP = 1, 38, 95

DENIED_X86_64 = {
    "socket": 41,
    "chmod": 90,
    "fchmod": 91,
    "chown": 92,
    "fchown": 93,
    "lchown": 94,
    "utime": 132,
    "utimes": 235,
    "futimesat": 261,
    "utimensat": 280,
    "fchownat": 260,
    "fchmodat": 268,
    "fchmodat2": 452,
    "setxattr": 188,
    "lsetxattr": 189,
    "fsetxattr": 190,
    "removexattr": 197,
    "lremovexattr": 198,
    "fremovexattr": 199,
    "setxattrat": 463,
    "removexattrat": 466,
    "file_setattr": 469,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    # a child in a new session/group escapes the parent's process-group kill and outlives
    # the worker (still alive after run_worker returned)
    "setsid": 112,
    "setpgid": 109,
    # System V IPC objects and kernel keys outlive the process: state across verifications;
    # the operations too, since objects that already exist are found in /proc/sysvipc
    # (a uid-0 worker can attach, overwrite and remove a root-owned 0600 segment)
    "shmget": 29,
    "semget": 64,
    "msgget": 68,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "shmat": 30,
    "shmctl": 31,
    "semop": 65,
    "semctl": 66,
    "msgsnd": 69,
    "msgrcv": 70,
    "msgctl": 71,
    "semtimedop": 220,
    # POSIX message queues: kernel objects that outlive the process, reached without a path
    # walk (so without Landlock) and open to a uid-0 worker without any capability
    "mq_open": 240,
    "mq_unlink": 241,
    "mq_timedsend": 242,
    "mq_timedreceive": 243,
    "mq_notify": 244,
    "mq_getsetattr": 245,
    # joining another process's namespaces
    "setns": 308,
    # I/O priority: its "who" argument alone is not the target (IOPRIO_WHO_USER 0 is every
    # process of the uid); a worker has no use for it
    "ioprio_set": 251,
}
"""x86_64 syscall numbers (``arch/x86/entry/syscalls/syscall_64.tbl``) the filter denies."""

SELF_ONLY_X86_64 = {
    # name: (nr, argument indexes that must be 0 = "this process/thread")
    "setpriority": (141, (0, 1)),  # which == PRIO_PROCESS and who == 0 (PRIO_USER 0 = every process of the uid)
    "sched_setparam": (142, (0,)),
    "sched_setscheduler": (144, (0,)),
    "sched_setaffinity": (203, (0,)),
    "sched_setattr": (314, (0,)),
    "prlimit64": (302, (0,)),
}
"""Calls allowed on the worker itself only: aimed at the parent (``getppid()``) they slow
the trusted reference worker started next (nice 19, SCHED_IDLE, one CPU, tiny rlimits)."""

CLONE_NEWUSER, CLONE_PARENT = 0x10000000, 0x8000
FLAG_DENIED_X86_64 = {
    # name: (nr, argument index, bits that may not be set, errno)
    # a new user namespace hands back a full capability set inside it (after an execve,
    # unshare + its own uid_map, which the /proc/<pid> allowance lets it write);
    # CLONE_PARENT makes the child the *verifier's*: zombies it never reaps (a pid
    # exhaustion for the whole host at ~3000/s)
    "unshare": (272, 0, CLONE_NEWUSER, EPERM),
    "clone": (56, 0, CLONE_NEWUSER | CLONE_PARENT, EPERM),
    # fallocate with a mode (KEEP_SIZE, PUNCH_HOLE, ...): allocates blocks that st_size and the
    # file-size rlimit do not see (3 GiB behind a 16-byte file, outside any budget)
    "fallocate": (285, 1, 0xFFFFFFFF, EOPNOTSUPP),
}
"""Calls denied, with the given errno, when an argument has any of the given bits (its low
32 bits: clone flags and fallocate modes fit there). ``fallocate`` fails with EOPNOTSUPP
(what callers that preallocate fall back on: the file system does not support the mode)."""

CLONE3_NR = 435
"""``clone3`` passes its flags in a struct seccomp cannot read: it fails with ENOSYS, so
libc falls back to ``clone``, whose flags the filter checks (the usual container policy)."""

DENIED_IOCTLS = {"FS_IOC_SETFLAGS": 0x40086602, "FS_IOC32_SETFLAGS": 0x40046602, "FS_IOC_FSSETXATTR": 0x401C5820}
"""ioctl commands that change file attributes (immutable, append-only) through a read-only
descriptor; every other ioctl (the CUDA driver's) stays allowed."""

F_SETLEASE = 1024
"""``fcntl(F_SETLEASE)``: a lease on a file the worker can only read makes any other
opener wait up to the lease-break time (45 s by default)."""

DENIED_COMMANDS_X86_64 = {"ioctl": (16, tuple(DENIED_IOCTLS.values())), "fcntl": (72, (F_SETLEASE,))}
"""Calls denied (EPERM) for these values of their command argument (argument 1); every
other command stays allowed."""

SOCKETPAIR_NR, SOCK_TYPE_MASK, SOCK_STREAM = 53, 0xF, 1
"""``socketpair`` is allowed for stream pairs only: a datagram pair can ``sendto`` any
pathname socket (a listener outside the sandbox)."""

# classic BPF opcodes (include/uapi/linux/filter.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data
ERRNO_EPERM = SECCOMP_RET_ERRNO | EPERM


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _arg_lo(i: int) -> int:
    """Offset of the low 32 bits of syscall argument ``i`` (little-endian ``u64 args[6]``)."""
    return 16 + 8 * i


def _arg_hi(i: int) -> int:
    return 16 + 8 * i + 4


class _Asm:
    """A tiny classic-BPF assembler: jumps name labels, resolved to relative offsets."""

    def __init__(self) -> None:
        self.rows: list[list] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.rows)

    def op(self, code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        self.rows.append([code, jt, jf, k])

    def assemble(self) -> list[tuple[int, int, int, int]]:
        out = []
        for i, (code, jt, jf, k) in enumerate(self.rows):

            def rel(lbl: str | None) -> int:
                if lbl is None:
                    return 0
                off = self.labels[lbl] - i - 1
                if not 0 <= off < 256:
                    raise ValueError(f"BPF jump to {lbl} out of range ({off})")
                return off

            out.append((code, rel(jt), rel(jf), k))
        return out


def program() -> list[tuple[int, int, int, int]]:
    """The BPF program as ``(code, jt, jf, k)`` rows. Wrong architecture or an x32 call:
    deny. A :data:`DENIED_X86_64` number: deny. A :data:`SELF_ONLY_X86_64` call: allow only
    when its target arguments are 0 (both 32-bit halves). A :data:`FLAG_DENIED_X86_64` call:
    deny, with its errno, when the argument has one of its bits. A
    :data:`DENIED_COMMANDS_X86_64` call (``ioctl``, ``fcntl``): deny its listed commands.
    ``clone3``: ENOSYS. ``socketpair``: stream pairs only. Anything else: allow."""
    a = _Asm()
    a.op(_LD_W_ABS, _OFF_ARCH)
    a.op(_JEQ_K, AUDIT_ARCH_X86_64, None, "deny")
    a.op(_LD_W_ABS, _OFF_NR)
    a.op(_JSET_K, X32_SYSCALL_BIT, "deny", None)
    for nr in sorted(set(DENIED_X86_64.values())):
        a.op(_JEQ_K, nr, "deny", None)
    for name, (nr, _) in sorted(SELF_ONLY_X86_64.items()):
        a.op(_JEQ_K, nr, f"self_{name}", None)
    for name, (nr, _, _, _) in sorted(FLAG_DENIED_X86_64.items()):
        a.op(_JEQ_K, nr, f"flags_{name}", None)
    for name, (nr, _) in sorted(DENIED_COMMANDS_X86_64.items()):
        a.op(_JEQ_K, nr, f"cmd_{name}", None)
    a.op(_JEQ_K, CLONE3_NR, "enosys", None)
    a.op(_JEQ_K, SOCKETPAIR_NR, "socketpair", None)
    a.op(_RET_K, SECCOMP_RET_ALLOW)
    for name, (_, i, bits, errno) in sorted(FLAG_DENIED_X86_64.items()):
        a.label(f"flags_{name}")
        a.op(_LD_W_ABS, _arg_lo(i))
        a.op(_JSET_K, bits, None, "allow")
        a.op(_RET_K, SECCOMP_RET_ERRNO | errno)
    for name, (_, cmds) in sorted(DENIED_COMMANDS_X86_64.items()):
        a.label(f"cmd_{name}")
        a.op(_LD_W_ABS, _arg_lo(1))
        for cmd in sorted(cmds):
            a.op(_JEQ_K, cmd, "deny", None)
        a.op(_RET_K, SECCOMP_RET_ALLOW)
    a.label("enosys")
    a.op(_RET_K, SECCOMP_RET_ERRNO | ENOSYS)
    for name, (_, args) in sorted(SELF_ONLY_X86_64.items()):
        a.label(f"self_{name}")
        for i in args:
            a.op(_LD_W_ABS, _arg_lo(i))
            a.op(_JEQ_K, 0, None, "deny")
            a.op(_LD_W_ABS, _arg_hi(i))
            a.op(_JEQ_K, 0, None, "deny")
        a.op(_RET_K, SECCOMP_RET_ALLOW)
    a.label("socketpair")
    a.op(_LD_W_ABS, _arg_lo(1))
    a.op(_AND_K, SOCK_TYPE_MASK)
    a.op(_JEQ_K, SOCK_STREAM, "allow", "deny")
    a.label("allow")
    a.op(_RET_K, SECCOMP_RET_ALLOW)
    a.label("deny")
    a.op(_RET_K, ERRNO_EPERM)
    return a.assemble()


PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
SYS_CAPSET_X86_64 = 126
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def drop_capabilities() -> str:
    """Drop every capability of the calling thread (effective, permitted, inheritable,
    ambient) and the bounding set: a root worker kept CAP_SYS_PTRACE/CAP_DAC_OVERRIDE and
    could read the trusted parent's ``/proc/<pid>/environ`` (API keys) and change mounts.
    Capabilities are per thread; candidate code runs on this one and threads it starts
    inherit the empty sets. Returns what was done (never raises)."""
    libc = _libc()
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: nothing to drop then
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two __user_cap_data_struct, all zero
    if libc.syscall(ctypes.c_long(SYS_CAPSET_X86_64), header, data) != 0:
        return f"capabilities kept ({os.strerror(ctypes.get_errno())})"
    return "no capabilities"


def install(drop_caps: bool = True) -> str:
    """Install the filter on every thread of this process, after :func:`drop_capabilities`
    unless ``drop_caps`` is False (the launcher dropped them already, before any thread
    existed). Never raises: returns the description for the verdict (``"seccomp: ..."``,
    ``"seccomp off (CODA_SECCOMP=off)"`` or ``"seccomp unavailable: <why>"``)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "off":
        return f"seccomp off ({ENV_SWITCH}=off)"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"seccomp unavailable: syscall numbers listed for x86_64 only, not {platform.machine()}"
    caps = drop_capabilities() if drop_caps else "capabilities dropped before"
    rows = program()
    arr = (_SockFilter * len(rows))(*[_SockFilter(*r) for r in rows])
    prog = _SockFprog(len(rows), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    res = _libc().syscall(
        ctypes.c_long(SYS_SECCOMP_X86_64),
        ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
        ctypes.c_ulong(SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(prog),
    )
    if res != 0:
        err = ctypes.get_errno()
        why = f"thread {res} could not be synchronized" if res > 0 else os.strerror(err)
        return f"seccomp unavailable: {why}; {caps}"
    return (
        f"seccomp: sockets, file-metadata changes, io_uring, new sessions, SysV IPC/keys, message "
        f"queues, user namespaces, fallocate modes and scheduling of other processes denied "
        f"(all threads); {caps}"
    )

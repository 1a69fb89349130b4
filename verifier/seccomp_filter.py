"""A seccomp filter for the processes that run candidate code: what Landlock leaves open.

Why: Landlock (:mod:`~coda_agent.verifier.fs_sandbox`, ABI 7 on the dev machine and the
H200) confines *writes* to the worker's folder, denies TCP bind/connect and scopes signals
and abstract unix sockets. Red-team round 6 listed what it does not cover: connecting to a
*pathname* unix socket (a local daemon's control socket), UDP and other non-TCP sockets,
and changing the metadata of files outside the folder (chmod/chown/utime/xattr are not
writes to Landlock). None of that is reachable from code that passes the static stage
today, but the static stage is the layer red teams keep getting past, so the kernel says
no as well.

What it denies (``EPERM``, never a kill: a denied call is an exception the worker reports
like any other candidate error):

* ``socket`` in every address family. A worker needs no socket after CUDA is up (its
  results go through a descriptor opened before confinement); ``socketpair`` (unnamed,
  process-local) stays allowed.
* chmod/chown/utime and extended-attribute changes, every variant (``*at``, ``f*``, ``l*``).
* ``io_uring_setup``/``enter``/``register``: io_uring performs opens, connects and sends
  from kernel workers that seccomp never sees.
* on x86_64, every x32-ABI call (``nr`` with bit 30 set), which would otherwise reach the
  same syscalls under numbers this filter does not list.

How: a classic-BPF program over ``struct seccomp_data`` installed with
``seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)``, so every thread of the
process (CUDA's and torch's included) gets it, irreversibly, and children inherit it.
``PR_SET_NO_NEW_PRIVS`` must be set (Landlock sets it first). Syscall numbers are
per-architecture; only x86_64 is listed (the dev machine and the H200); elsewhere
:func:`install` reports "unavailable" and the worker runs with Landlock alone. Through
ctypes, no dependency; layouts from ``include/uapi/linux/{seccomp,filter,audit}.h``.
``CODA_SECCOMP=off`` turns it off (debugging; the verdict says so).
"""

from __future__ import annotations

import ctypes
import os
import platform

ENV_SWITCH = "CODA_SECCOMP"
"""Set to ``off`` to skip the filter (the worker's sandbox description says so)."""

SYS_SECCOMP_X86_64 = 317
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM = 1

DENIED_X86_64 = {
    "socket": 41,
    "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94,
    "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280,
    "fchownat": 260, "fchmodat": 268, "fchmodat2": 452,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
    "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
    "setxattrat": 463, "removexattrat": 466,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
}
"""x86_64 syscall numbers (``arch/x86/entry/syscalls/syscall_64.tbl``) the filter denies."""

# classic BPF opcodes (include/uapi/linux/filter.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def program(denied: dict[str, int] = DENIED_X86_64) -> list[tuple[int, int, int, int]]:
    """The BPF program as ``(code, jt, jf, k)`` rows: wrong architecture -> deny
    everything, x32 call -> deny, a listed number -> deny, else allow. Jumps are relative
    (skip ``jt``/``jf`` rows); the last two rows are the allow and the deny returns."""
    nrs = sorted(set(denied.values()))
    n = len(nrs)
    # rows: 0 ld arch; 1 jeq arch; 2 ld nr; 3 jset x32; 4..4+n-1 jeq nr; 4+n allow; 5+n deny
    allow, deny = 4 + n, 5 + n
    rows = [(_LD_W_ABS, 0, 0, _OFF_ARCH),
            (_JEQ_K, 0, deny - 2, AUDIT_ARCH_X86_64),
            (_LD_W_ABS, 0, 0, _OFF_NR),
            (_JSET_K, deny - 4, 0, X32_SYSCALL_BIT)]
    for i, nr in enumerate(nrs):
        here = 4 + i
        rows.append((_JEQ_K, deny - here - 1, 0, nr))
    rows.append((_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    rows.append((_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM))
    assert len(rows) == deny + 1 and rows[allow][3] == SECCOMP_RET_ALLOW
    return rows


def install() -> str:
    """Install the filter on every thread of this process. Never raises: returns the
    description for the verdict (``"seccomp: ..."``, ``"seccomp off (CODA_SECCOMP=off)"``
    or ``"seccomp unavailable: <why>"``)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "off":
        return f"seccomp off ({ENV_SWITCH}=off)"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"seccomp unavailable: syscall numbers listed for x86_64 only, not {platform.machine()}"
    rows = program()
    arr = (_SockFilter * len(rows))(*[_SockFilter(*r) for r in rows])
    prog = _SockFprog(len(rows), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    res = libc.syscall(ctypes.c_long(SYS_SECCOMP_X86_64), ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
                       ctypes.c_ulong(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if res != 0:
        err = ctypes.get_errno()
        why = f"thread {res} could not be synchronized" if res > 0 else os.strerror(err)
        return f"seccomp unavailable: {why}"
    return "seccomp: sockets, chmod/chown/utime/xattr changes and io_uring denied (all threads)"

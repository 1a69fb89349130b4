"""OS-level confinement of the candidate worker (Linux Landlock): no writes outside its folder.

Why: the static stage is the first trust boundary, and a way past it must not be enough
(e.g. a compile option that truncates any file, a type-hint ``eval`` that runs arbitrary
code: threats 20 and 21 of docs/threat-model.md). Whatever a candidate manages to run, the process it runs in should not
be able to change anything the verifier trusts afterwards: the spec's ``reference.py``,
the verifier's own modules, accepted kernels, the quack/cutlass install the trusted
reference worker imports, or a compile cache that worker reads.

How: before anything else runs in the worker (:mod:`~coda_agent.verifier.confine.launch`),
:func:`confine_worker` calls :func:`restrict_writes`. It builds a Landlock ruleset that *handles* every write-type
filesystem right (write, truncate, create, remove, rename/link across folders) and grants
them only beneath the given folders: the worker's own folder (results, saved tensors,
per-worker caches and TMPDIR) and the GPU device nodes plus ``/dev/null`` (the driver
reopens its nodes read-write; ``/dev/shm`` stays read-only). Reads and execution stay allowed everywhere (the libraries must load).
Where the kernel's Landlock ABI offers it, TCP bind/connect is denied outright (ABI >= 4)
and signals and abstract unix sockets are scoped to the worker's own processes (ABI >= 6:
a candidate cannot signal the verifier). The restriction is irreversible and inherited
by every child process; it needs no privileges (``PR_SET_NO_NEW_PRIVS`` is set first).

Threads: Landlock binds the *calling thread* and the threads and children it starts;
threads that exist before stay unconfined, and native code in the process can run on them
(e.g. through a signal handler sent with ``tgkill``; threat 22 of docs/threat-model.md). So the candidate worker is
started through :mod:`~coda_agent.verifier.confine.launch`, which confines the process
while it has one thread, before ``import torch`` (which starts a BLAS thread pool) and
before CUDA init (the driver's threads): 16 threads in all on the H200 host; the launcher hands the worker the description and the
write end of its results pipe through :data:`LAUNCH_SANDBOX` and :data:`LAUNCH_RESULTS_FD`. Whenever
threads did exist at confinement, the description says how many ("N earlier thread(s)
not confined"); the seccomp layer (:mod:`~coda_agent.verifier.confine.seccomp`) reaches
every thread either way.

The trusted reference worker and the parent are not confined. Landlock exists since
Linux 5.13; without it (or with ``CODA_FS_SANDBOX=off``) the worker runs unconfined and
says so: the description lands in the verdict's ``environment.worker_sandbox``, so a
verdict always tells whether its candidate ran confined.

Syscalls through ctypes (no dependency): numbers 444-446 are the same on every Linux
architecture; struct layouts from ``include/uapi/linux/landlock.h``.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# filesystem rights (ABI version that introduced them)
WRITE_FILE = 1 << 1
REMOVE_DIR, REMOVE_FILE = 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << i for i in range(6, 13))
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
WRITE_RIGHTS_V1 = (
    WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_CHAR
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_BLOCK
    | MAKE_SYM
)
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

LAUNCH_SANDBOX: str | None = None
"""The confinement description, when :mod:`~coda_agent.verifier.confine.launch` confined
this process before the worker module ran (None: it did not)."""

LAUNCH_RESULTS_FD: int | None = None
"""The write end of the parent's results pipe, handed over by the launcher (None: the
worker was started without it and opens its results file itself)."""

ENV_SWITCH = "CODA_FS_SANDBOX"
"""Set to ``off`` to run the candidate worker unconfined (debugging only; the verdict says so)."""


class SandboxUnavailable(RuntimeError):
    """Landlock cannot be used here (old kernel, disabled LSM, seccomp); the message says why."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version; raises :class:`SandboxUnavailable` when there is none."""
    libc = _libc()
    v = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if v < 0:
        err = ctypes.get_errno()
        raise SandboxUnavailable(f"Landlock not available: {os.strerror(err)} (errno {err})")
    return int(v)


def write_rights(abi: int) -> int:
    """Every write-type filesystem right the ABI knows."""
    rights = WRITE_RIGHTS_V1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


def restrict_writes(writable: list[str | Path]) -> str:
    """Confine this process (and its future children) for good: writes only beneath ``writable``.

    Args:
        writable: existing folders where creating, writing, truncating and removing files
            stays allowed, or single files that stay writable (device nodes); everything
            else becomes read-only for this process.

    Returns:
        A one-line description for the verdict, e.g. ``"landlock ABI 7: writes only
        beneath 2 folder(s); TCP denied; signals and abstract sockets scoped"``.

    Raises:
        SandboxUnavailable: no Landlock, or a syscall failed (nothing was applied then).
        FileNotFoundError: a ``writable`` folder does not exist.
    """
    abi = abi_version()
    libc = _libc()
    rights = write_rights(abi)
    attr = _RulesetAttr(handled_access_fs=rights)
    size = 8
    extras = []
    if abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
        extras.append("TCP denied")
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
        extras.append("signals and abstract sockets scoped")
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise SandboxUnavailable(f"landlock_create_ruleset failed: {os.strerror(err)}")
    try:
        for folder in writable:
            is_dir = os.path.isdir(folder)
            pfd = os.open(str(folder), os.O_PATH | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0))
            try:
                # a file rule may only carry the rights that apply to files
                rule = _PathBeneathAttr(
                    allowed_access=rights if is_dir else rights & (WRITE_FILE | TRUNCATE), parent_fd=pfd
                )
                if (
                    libc.syscall(
                        SYS_ADD_RULE,
                        ctypes.c_int(fd),
                        ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.byref(rule),
                        ctypes.c_uint32(0),
                    )
                    < 0
                ):
                    err = ctypes.get_errno()
                    raise SandboxUnavailable(f"landlock_add_rule({folder}) failed: {os.strerror(err)}")
            finally:
                os.close(pfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise SandboxUnavailable(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")
        if libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            err = ctypes.get_errno()
            raise SandboxUnavailable(f"landlock_restrict_self failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    earlier = _other_threads()
    if earlier:
        # Landlock binds the calling thread and what it starts; threads that already exist
        # (torch's, CUDA's) are not confined, and native code can take one over
        extras.append(f"{earlier} earlier thread(s) not confined")
    return f"landlock ABI {abi}: writes only beneath {len(writable)} path(s)" + "".join(f"; {e}" for e in extras)


def _other_threads() -> int:
    """Threads of this process besides the calling one (0 where /proc is unreadable)."""
    try:
        return max(0, len(os.listdir("/proc/self/task")) - 1)
    except OSError:
        return 0


def device_files() -> list[str]:
    """The device nodes a CUDA process writes: ``/dev/null`` and the NVIDIA nodes
    (``/dev/nvidia*``, ``/dev/nvidia-caps/*``). Not ``/dev`` as a whole: ``/dev/shm`` is a
    RAM-backed folder that outlives the worker (a call counter kept there would survive
    across verifications)."""
    import glob

    out = ["/dev/null"]
    for p in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")):
        if not os.path.isdir(p):
            out.append(p)
    return [p for p in out if os.path.exists(p)]


def switched_off() -> bool:
    """``CODA_FS_SANDBOX=off``: no layer at all (debugging only; the verdict says so)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() == "off"


def own_proc_dir() -> list[str]:
    """``/proc/<pid>`` of this process (empty without procfs). CUDA init writes there (most
    likely the driver naming its threads through ``/proc/self/task/<tid>/comm``): with the
    folder read-only, ``cuInit`` fails with error 304 (measured on the H200 when the worker
    is confined before CUDA init). Everything beneath it acts on this process only."""
    p = f"/proc/{os.getpid()}"
    return [p] if os.path.isdir(p) else []


def confine_worker(folders: list[str | Path], *, seccomp: bool = True) -> str:
    """A worker's confinement: writes only beneath ``folders`` (created if missing), its own
    ``/proc/<pid>`` (:func:`own_proc_dir`) and the device nodes of :func:`device_files`.

    Used by the candidate worker (its folder, through :mod:`~coda_agent.verifier.confine.launch`)
    and the compile worker (its temporary folder and, when shared, the compile cache),
    both of which run candidate code. Then installs the seccomp filter of
    :mod:`~coda_agent.verifier.confine.seccomp` (sockets, file-metadata changes, io_uring),
    or, with ``seccomp=False``, only drops every capability (per thread, so this must
    happen before threads exist) and leaves the filter to :func:`install_seccomp`: CUDA
    init opens a socket, so a process that initializes CUDA confined installs the filter
    afterwards (it reaches every thread then too). Never raises: returns the description
    for the verdict, ``"landlock ABI N: ...; seccomp: ..."``, ``"off (CODA_FS_SANDBOX=off)"``
    (neither layer) or ``"unavailable: <why>; seccomp: ..."`` (no Landlock: the worker's
    writes are unconfined)."""
    if switched_off():
        return f"off ({ENV_SWITCH}=off)"
    try:
        for f in folders:
            Path(f).mkdir(parents=True, exist_ok=True)
        desc = restrict_writes([*folders, *own_proc_dir(), *device_files()])
    except (SandboxUnavailable, OSError) as e:
        desc = f"unavailable: {e}"
    if not seccomp:
        from .seccomp import drop_capabilities

        return f"{desc}; {drop_capabilities()}"
    return f"{desc}; {install_seccomp()}"


def install_seccomp(drop_caps: bool = True) -> str:
    """The seccomp layer on top (:mod:`~coda_agent.verifier.confine.seccomp`); it needs
    ``PR_SET_NO_NEW_PRIVS``, which Landlock already set unless Landlock was unavailable.
    Returns its description (never raises)."""
    from .seccomp import install

    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"seccomp unavailable: PR_SET_NO_NEW_PRIVS failed: {os.strerror(ctypes.get_errno())}"
    return install(drop_caps=drop_caps)

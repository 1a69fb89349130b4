"""Makes children with clone(CLONE_PARENT | SIGCHLD): they belong to the worker's *parent*
(the verifier), in the worker's process group, and exit at once (zombies the parent must
reap). Records its group id."""

import ctypes
import os
import time

from sandbox_fixtures._common import record

libc = ctypes.CDLL(None, use_errno=True)
made = 0
for _ in range(20):
    pid = libc.syscall(ctypes.c_long(56), ctypes.c_long(0x8000 | 17), ctypes.c_long(0), ctypes.c_long(0),
                       ctypes.c_long(0), ctypes.c_long(0))
    if pid == 0:
        os._exit(0)
    made += pid > 0
time.sleep(0.2)
record("orphans", made=made, pgid=os.getpgid(0))
record("done")

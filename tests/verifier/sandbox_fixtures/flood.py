"""Floods its stdout past the parent's cap and attacks the log descriptor (ftruncate and
fallocate KEEP_SIZE on a file descriptor); records the results."""

import ctypes
import os
import sys

from sandbox_fixtures._common import record

sys.stdout.buffer.write(b"x" * (6 << 20) + b"THE END")
sys.stdout.flush()
libc = ctypes.CDLL(None, use_errno=True)
record("attack", truncate=libc.ftruncate(1, ctypes.c_long(0)) == 0,
       fallocate=libc.fallocate(1, 1, ctypes.c_long(0), ctypes.c_long(1 << 30)) == 0)
record("done")

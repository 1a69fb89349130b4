"""Dies by a signal: a NULL read via ctypes (SIGSEGV), or os.abort() with argv[2] == "abort"."""

import ctypes
import os
import sys

from sandbox_fixtures._common import record

record("begin", what="trial c1")
if len(sys.argv) > 2 and sys.argv[2] == "abort":
    os.abort()
ctypes.string_at(0)

"""Exits like torch does after an illegal memory access in a kernel."""

import sys

from sandbox_fixtures._common import record

record("begin", what="trial c2")
sys.stderr.write(
    "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call\n"
)
sys.exit(1)

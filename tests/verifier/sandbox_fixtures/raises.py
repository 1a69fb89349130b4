"""Raises a Python exception after beginning a part (stderr gets colored noise first)."""

import sys

from sandbox_fixtures._common import record

record("begin", what="trial c0")
sys.stderr.write("\x1b[31mwarning: colored noise\x1b[0m\n")
raise ValueError("candidate exploded on purpose")

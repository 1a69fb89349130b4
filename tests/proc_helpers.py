"""Process helpers shared by the tests that kill workers and commands."""

from __future__ import annotations

import os
from pathlib import Path


def gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie its new parent has not reaped yet is dead too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True

"""Run through confine/launch.py: writes its records into the parent's results pipe, then
tries to truncate it (a file descriptor would allow that; a pipe does not)."""

import json
import os

from coda_agent.verifier.confine import landlock

fd = landlock.LAUNCH_RESULTS_FD


def record(part: str, **fields) -> None:
    os.write(fd, (json.dumps({"part": part, **fields}, sort_keys=True) + "\n").encode())


record("begin", what="work", sandbox=landlock.LAUNCH_SANDBOX)
try:
    os.ftruncate(fd, 0)
    record("attack", truncate=True)
except OSError:
    record("attack", truncate=False)
record("done")

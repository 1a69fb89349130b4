"""Hangs forever, with a child process in its group that also hangs (both must be killed)."""

import subprocess
import sys
import time

from sandbox_fixtures._common import record

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as f:
        f.write(str(child.pid))
record("begin", what="bench big")
while True:
    time.sleep(1)

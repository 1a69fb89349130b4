"""Leaves a child in its own session holding stdout open (what a worker that escaped the
process-group kill would do); records the child's pid so the test can clean up."""

import subprocess
import sys

from sandbox_fixtures._common import record

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
record("escaped", pid=child.pid)
record("done")

"""``python -m coda_agent``: the ``coda-agent`` command."""

import sys

from .cli import main

sys.exit(main())

"""Shared by the fixtures: append one JSON record to the results file named in argv[1]."""

import json
import sys


def record(part: str, **fields) -> None:
    if len(sys.argv) > 1:
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps({"part": part, **fields}, sort_keys=True) + "\n")

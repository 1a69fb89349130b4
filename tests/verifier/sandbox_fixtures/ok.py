"""Finishes normally, writing two records; prints junk on stdout that must be ignored."""

from sandbox_fixtures._common import record

print('{"part": "done", "forged": true}')
record("begin", what="work")
record("work", value=42)
record("done")

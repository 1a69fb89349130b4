"""The results file a worker reports through: one JSON object a line, appended.

A worker appends one record per finished sub-stage (``{"part": ..., ...}``, sorted keys)
and a ``begin`` record before each part, so the lines already written say how far a
worker that died got (:func:`last_begun`). A confined worker writes into a pipe the parent
copies into the file (:func:`~coda_agent.verifier.confine.sandbox.run_worker`): records
can only be appended. The strict reader (:func:`read_records_checked`) names every line
the worker would not have written (repeated records, records after ``done``, lines that
are not JSON objects, oversized lines): in the candidate worker, candidate code writing
records. The record parts and their fields are the GPU workers' protocol
(``verifier/gpu/protocol.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def record_line(record: dict[str, Any]) -> str:
    """One results-file line: the JSON object with sorted keys, newline-terminated."""
    return json.dumps(record, sort_keys=True, default=str) + "\n"


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object (sorted keys) as a line, flushed and fsynced."""
    line = record_line(record)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


MAX_RECORD_LINE = 256 << 10
"""Longest results line read (bytes); a worker's records are a few KiB. Longer lines are
skipped and reported (a 255 MiB line of ``{},{},...`` takes the parent to 6.4 GiB, and
200,000 nested ``[`` crash ``json.loads`` with RecursionError)."""

RECORD_IDENTITY = {"begin": "what", "trial": "key", "recheck": "key", "bench": "shape", "launches": "case"}
"""The field that tells apart a part's records; every other part is written once per run."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All complete JSON lines of a results file (a torn last line is dropped).

    A missing file gives ``[]``; lines that are not JSON objects are skipped (see
    :func:`read_records_checked` for what a strict reader makes of them)."""
    return read_records_checked(path)[0]


def read_records_checked(path: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """``(records, anomalies)`` of a results file. Never raises for its content.

    The worker writes whole lines, each record once, and nothing after ``done``. So an
    anomaly is: a line that is not a JSON object (other than the last line, which a
    worker killed mid-write may leave torn), a line over :data:`MAX_RECORD_LINE` bytes,
    a record repeating an earlier one's part and identity (:data:`RECORD_IDENTITY`), or
    any record after ``done``. Only code inside the worker's process writes there, so in
    the candidate worker each is candidate code writing records (forged bench and
    integrity records, or the worker's real record glued to a newline-less prefix so that
    the reader drops it). Every record is
    returned, first ones first; callers that trust only first records stay correct, and
    the verifier fails a candidate worker with any anomaly."""
    p = Path(path)
    if not p.is_file():
        return [], []
    out: list[dict[str, Any]] = []
    anomalies: list[str] = []
    seen: set[tuple[str, str]] = set()
    done = False
    with open(p, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        if len(raw) > MAX_RECORD_LINE:
            anomalies.append(f"line {i + 1}: {len(raw)} bytes (over {MAX_RECORD_LINE})")
            continue
        try:
            rec = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict):
            if i != last:  # a torn final line is a crash's, anything earlier is not
                anomalies.append(f"line {i + 1}: not a JSON object")
            continue
        part = str(rec.get("part"))
        ident = (part, str(rec.get(RECORD_IDENTITY[part])) if part in RECORD_IDENTITY else "")
        if done:
            anomalies.append(f"line {i + 1}: a {part!r} record after 'done'")
        elif ident in seen:
            anomalies.append(f"line {i + 1}: a second {part!r} record" + (f" for {ident[1]!r}" if ident[1] else ""))
        seen.add(ident)
        done = done or part == "done"
        out.append(rec)
    return out, anomalies


def records_of(records: list[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    """The records whose ``part`` equals ``part``."""
    return [r for r in records if r.get("part") == part]


def last_begun(records: list[dict[str, Any]]) -> str | None:
    """What the worker was doing when it stopped: the last ``begin`` not followed by its end."""
    begun = [r for r in records if r.get("part") == "begin"]
    if not begun:
        return None
    last = begun[-1]
    idx = records.index(last)
    if any(r.get("part") not in ("begin",) for r in records[idx + 1 :]):
        return None
    return str(last.get("what"))

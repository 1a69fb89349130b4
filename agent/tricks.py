"""The tricks log: dated lessons (kernel, symptom -> fix) fed back into every prompt.

Design
------
``tricks_log.md`` is a human-curated file that goes verbatim into the static system
prompt, so the tool only ever *appends*: :func:`add_trick` re-reads the file under an
exclusive lock, writes old text + one new bullet through an atomic replace, and checks
that the old text is an exact prefix of the new one -- an existing entry is never
rewritten, reordered or reformatted. Lessons proposed by a run (``proposed_trick.md``,
written by the loop when attempt k failed and k+1 passed) are never appended
automatically: a human reads them and runs ``coda-agent tricks add --from-run RUN``.

Appended entries are single bullets::

    - **2026-03-05** `swiglu_bwd`: <one sentence: symptom -> fix>

:func:`parse_entries` reads both that form and the hand-written form of dated
sections (``## 2026-03-05 swiglu_fwd: title`` + body), for listing and rendering.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import re
import unicodedata
from pathlib import Path

from pydantic import BaseModel

from ..verifier.workspace import atomic_write_text
from .run_folder import RunError, proposed_lesson

TRICKS_FILE = "tricks_log.md"
MAX_TRICK_CHARS = 1000
"""Longest tricks entry (the loop proposes one sentence; the longest hand-written one is ~800)."""
HEADER = "# Tricks log\n\nLessons from kernel generations (date, kernel: symptom -> fix). Append-only.\n"

_DATE_RE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
_KERNEL_RE = re.compile(r"`([a-z][a-z0-9_]*)`")
_LEAD_KERNEL_RE = re.compile(r"(`?)([a-z][a-z0-9_]*)`?(\s*:)?(?=[\s:]|$)")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET_RE = re.compile(r"^[-*]\s+(.*)$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class TrickError(ValueError):
    """A trick could not be added (message says why)."""


class TrickEntry(BaseModel):
    """One entry of the log: its date and kernel when stated, its text and raw markdown."""

    date: str | None = None
    kernel: str | None = None
    text: str
    raw: str
    style: str = "bullet"


def _clean(text: str) -> str:
    return " ".join(text.split())


def format_entry(text: str, kernel: str | None, date: str) -> str:
    """The bullet line :func:`add_trick` appends."""
    k = f" `{kernel}`" if kernel else ""
    return f"- **{date}**{k}: {text}"


def parse_entries(text: str) -> list[TrickEntry]:
    """Entries of a tricks log: dated bullets and dated sections (undated top-level
    bullets outside any section count too, with ``date=None``)."""
    entries: list[TrickEntry] = []
    cur: list[str] | None = None
    style = "bullet"

    def flush() -> None:
        nonlocal cur
        if cur:
            raw = "\n".join(cur).rstrip()
            first = cur[0]
            head = first.lstrip("#-* ").strip()
            date_m = _DATE_RE.search(raw if style == "section" else first)
            body = _clean(" ".join([head, *cur[1:]]))
            body = re.sub(r"^\**\d{4}-\d{2}-\d{2}\**[\s:·—–-]*", "", body)
            kernel = None
            km = _LEAD_KERNEL_RE.match(body)
            if km and (km.group(1) or "_" in km.group(2) or km.group(3)):
                kernel = km.group(2)
                body = body[km.end() :].lstrip(" :·—–-")
            else:
                bm = _KERNEL_RE.search(first)
                kernel = bm.group(1) if bm else None
            entries.append(
                TrickEntry(
                    date=date_m.group(1) if date_m else None,
                    kernel=kernel,
                    text=body,
                    raw=raw,
                    style=style,
                )
            )
        cur = None

    for line in text.splitlines():
        h = _HEADING_RE.match(line)
        if h:
            flush()
            if len(h.group(1)) >= 2 and _DATE_RE.search(h.group(2)):
                cur, style = [line], "section"
            continue
        b = _BULLET_RE.match(line)
        if b:
            dated = bool(_DATE_RE.search(b.group(1)[:40]))
            if cur is not None and style == "section" and not dated:
                cur.append(line)  # a list inside a dated section's body
                continue
            flush()
            cur, style = [line], "bullet"
            continue
        if cur is not None:
            if not line.strip() and style == "bullet":
                flush()
            else:
                cur.append(line)
    flush()
    return entries


def _norm(text: str) -> str:
    """A trick's text as duplicates are compared: NFKC, case folded, with no zero-width
    characters, markdown emphasis or quotes (``**text**``, `` `text` ``, ``"text"`` are the
    same lesson as ``text``), no leading ``- `` or ``name:`` and no punctuation at either end."""
    t = unicodedata.normalize("NFKC", text)
    t = re.sub(r"[\u200b-\u200f\u2060\ufeff*_`\"'\u201c\u201d\u2018\u2019]", "", t)
    t = " ".join(t.casefold().split())
    t = re.sub(r"^(?:-\s*)?(?:[a-z0-9]+:\s*)?", "", t)
    return t.strip(" .,!?;:-")


def _known_texts(entries: list[TrickEntry]) -> set[str]:
    """Each entry's whole text and, for a bullet with continuation lines, its first line's
    (normalized, :func:`_norm`)."""
    known = {e.text for e in entries}
    for e in entries:
        if e.style == "bullet" and "\n" in e.raw:
            known.update(x.text for x in parse_entries(e.raw.splitlines()[0]))
    return {_norm(t) for t in known}


def _is_logged(body: str, kernel: str | None, date: str, entries: list[TrickEntry]) -> bool:
    """Whether ``body`` is already an entry: compared as written and as the log would parse
    the new line (the parser takes a leading ``name:`` or backticked word as the kernel, so
    "swiglu_bwd: recompute ..." is stored as a different text than it was given)."""
    known = _known_texts(entries)
    parsed = parse_entries(format_entry(body, kernel, date))
    return _norm(body) in known or any(_norm(e.text) in known for e in parsed)


def read_entries(root: str | Path) -> list[TrickEntry]:
    """Parsed entries of ``<root>/tricks_log.md`` (empty when the file is absent)."""
    p = Path(root) / TRICKS_FILE
    return parse_entries(p.read_text()) if p.is_file() else []


def add_trick(root: str | Path, text: str, kernel: str | None = None, date: str | None = None) -> TrickEntry:
    """Append one dated entry to ``<root>/tricks_log.md`` atomically; return it.

    ``text`` is collapsed to one line; ``date`` defaults to today (UTC, ``YYYY-MM-DD``).
    Raises :class:`TrickError` for empty text, a bad date or kernel name, or text that
    is already in the log. Existing content is never modified.
    """
    body = _clean(text)
    if not body:
        raise TrickError("empty trick text")
    if len(body) > MAX_TRICK_CHARS:
        # every entry goes into every prompt (a 300 KB lesson made each prompt ~95k tokens)
        raise TrickError(f"a trick is one or two sentences: {len(body)} characters, at most {MAX_TRICK_CHARS}")
    if kernel is not None and not _NAME_RE.match(kernel):
        raise TrickError(f"kernel must be a spec name like 'swiglu_fwd', got {kernel!r}")
    if date is None:
        date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    else:
        try:
            _dt.date.fromisoformat(date)
        except ValueError:
            raise TrickError(f"date must be YYYY-MM-DD, got {date!r}") from None
    root = Path(root)
    path = root / TRICKS_FILE
    root.mkdir(parents=True, exist_ok=True)
    # The lock is the workspace folder itself (flock on a directory descriptor): no lock
    # file appears in the checkout or piles up in /tmp (one per workspace path, as before).
    lock = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = path.read_text() if path.is_file() else ""
            # whole entries, not substrings ("fp32" is not already in the log because an entry
            # mentions it); a bullet's own line counts whole too, so that a reviewer's note on
            # the lines below it does not make a proposed lesson look new
            if _is_logged(body, kernel, date, parse_entries(old)):
                raise TrickError(f"this trick is already in {path}")
            line = format_entry(body, kernel, date)
            base = old if old else HEADER
            if not base.endswith("\n"):
                base += "\n"
            # A blank line keeps the new bullet out of a preceding section's body.
            sep = "" if base.endswith("\n\n") or _last_is_bullet(base) else "\n"
            new = base + sep + line + "\n"
            assert new.startswith(old), "tricks log append must keep the existing text as a prefix"
            atomic_write_text(path, new)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)
    return TrickEntry(date=date, kernel=kernel, text=body, raw=line)


def _last_is_bullet(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return False
    entries = parse_entries(text)
    return bool(entries) and entries[-1].style == "bullet" and entries[-1].raw.splitlines()[-1] == lines[-1]


def add_from_run(
    root: str | Path, run_dir: str | Path, date: str | None = None, *, unverified: bool = False
) -> TrickEntry:
    """Append the lesson a run proposed (``<run_dir>/proposed_trick.md``).

    The kernel is the run's spec (``run.json``). HTML comments are dropped whole (a
    multi-line one hides its body from a markdown preview and would put it into every
    prompt). The run folder is the answerer's to write, so its word that it passed is not
    enough: the library's manifest must vouch for the run (``run_folder.accepted_by``: the
    accepted kernel is this run's candidate byte for byte), unless ``unverified`` (a
    ``--no-accept`` run that passed, or a folder copied from elsewhere: the caller takes
    the text on its own reading: a hand-written ``run.json`` vouches for nothing). Raises
    :class:`TrickError` when the run proposed nothing (a lesson
    is proposed only when attempt k failed and k+1 passed; ``run.json`` must say so), when
    nothing vouches for it, when the lesson is longer than :data:`MAX_TRICK_CHARS` or
    already in the log.
    """
    try:
        text, kernel = proposed_lesson(root, run_dir, unverified=unverified)
    except RunError as e:
        raise TrickError(str(e)) from None
    return add_trick(root, text, kernel=kernel, date=date)

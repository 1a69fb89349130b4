"""The kept verdicts of ``coda-agent bench``: one folder per day and GPU, one file per kernel.

``bench`` keeps each kernel's full verdict as ``<results>/<date>-<gpu>/<kernel>.json``
(:func:`verdicts_dir`), and the results page is rendered from that folder
(:func:`~coda_agent.verifier.library.bench.page_from_kept`), so numbers are never taken from
anywhere but a verdict. This module owns the folder:

* writing (:func:`keep_verdict`): a verdict is merged shape by shape into the one already
  kept for its kernel (:func:`~coda_agent.verifier.library.repeats.merge_shapes`), so a call that
  measured some shapes never drops the others; when the two cannot share a table (a
  failure, another candidate, other versions) the later one is kept whole and the
  returned line says why and what was dropped;
* folding another folder in (:func:`merge_kept`, ``bench --from-verdicts DIR --merge-from
  SRC``), e.g. one copied back from a GPU machine: like a live bench, except that it never
  replaces a verdict it cannot merge with;
* reading back (:func:`day_verdicts`): only verdicts of the kernels accepted now (same
  sha256), with a note naming every file left out and why;
* guarding the page (:func:`check_page`, :data:`PAGE_MARK`): a page ``bench`` did not
  write (a hand-written record beside a kept folder) is never overwritten without force,
  and the check runs before anything in the folder changes.

Every write is atomic (:func:`~coda_agent.verifier.workspace.atomic_write_text`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from ..spec import LoadedSpec, load_spec
from ..verdict import Verdict
from ..workspace import atomic_write_text, sha256_file
from .repeats import merge_shapes, runs_of, shapes_of, stamp_shapes, why_not_mergeable


def slug(text: str) -> str:
    """A GPU name as a file-name part: ``NVIDIA H200`` -> ``nvidia-h200`` (``cpu`` when empty)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "cpu"


def verdicts_dir(out_dir: Path, date: str, gpu: str) -> Path:
    """Where ``bench`` keeps each kernel's full verdict: ``<out>/<date>-<gpu>/<kernel>.json``."""
    return out_dir / f"{date}-{slug(gpu)}"


def day_verdicts(root: Path, vdir: Path) -> tuple[dict[str, Verdict], list[str]]:
    """Every verdict kept in ``vdir`` whose kernel is still the accepted one (same sha256).

    Returns (verdicts by kernel, notes on the ones left out)."""
    out: dict[str, Verdict] = {}
    notes = []
    for f in sorted(vdir.glob("*.json")):
        try:
            v = Verdict.model_validate_json(f.read_text())
        except ValueError as e:
            notes.append(f"- {f.name}: not a readable verdict, left out ({_first_problem(e)})")
            continue
        if v.spec != f.stem:
            notes.append(
                f"- {f.name}: holds a verdict of {v.spec!r}, not {f.stem!r}; left out (a kept verdict is <kernel>.json)"
            )
            continue
        if not v.stages:  # a damaged file would read as "NOT verified: no GPU"
            notes.append(f"- {f.name}: records no stages (missing or empty 'stages'); left out")
            continue
        kernel = root / "generated_kernels" / f.stem / "kernel.py"
        if not kernel.is_file() or sha256_file(kernel) != v.candidate_hash:
            notes.append(
                f"- {f.stem}: measured for a kernel that is no longer the accepted one; left out "
                f"(run `coda-agent bench {f.stem}` again)"
            )
            continue
        out[f.stem] = v
    return out, notes


def keep_verdict(vdir: Path, loaded: LoadedSpec, v: Verdict, replace: bool = True) -> tuple[Verdict | None, str]:
    """Keep ``v`` as ``vdir/<kernel>.json`` (atomic), merged shape by shape with the verdict
    already kept there (:func:`~coda_agent.verifier.library.repeats.merge_shapes`: every shape of
    both stays, the later measurement of a shape both have wins).

    When the two cannot share a table (:func:`~coda_agent.verifier.library.repeats.why_not_mergeable`:
    a failing run, another candidate, other versions), the later verdict is kept whole: a
    newer ``v`` replaces the kept one (it is news; ``replace=False`` leaves it out too), an
    older ``v`` is left out. An unreadable kept file is replaced (the page could not have
    shown it). A shape whose median over several runs gives way to a later measurement of
    fewer runs is named in the returned line. Returns (what the file now
    holds from ``v``, or None when ``v`` was left out; a line saying what happened, naming
    the reason and the shapes dropped when a verdict was replaced)."""
    path = Path(vdir) / f"{loaded.name}.json"
    stamp_shapes(v)
    kept = None
    if path.is_file():
        try:
            kept = Verdict.model_validate_json(path.read_text())
        except ValueError as e:
            atomic_write_text(path, v.to_json())
            return v, f"{loaded.name}: replaced an unreadable kept verdict ({_first_problem(e)})"
    if kept is None:
        atomic_write_text(path, v.to_json())
        return v, f"{loaded.name}: kept ({len(shapes_of(v))} shape(s))"
    why = why_not_mergeable(kept, v)
    if why is None:
        out = merge_shapes(loaded, kept, v)
        atomic_write_text(path, out.to_json())
        ours, before = shapes_of(v), shapes_of(kept)
        mine = [
            s for s, m in shapes_of(out).items() if s in ours and m.get("measured_at") == ours[s].get("measured_at")
        ]
        fewer = [
            f"{s} ({runs_of(before[s])} runs -> {runs_of(ours[s])})"
            for s in mine
            if s in before and runs_of(before[s]) > runs_of(ours[s])
        ]
        return out, (
            f"{loaded.name}: merged, {len(mine)} shape(s) from this verdict, "
            f"{len(shapes_of(out)) - len(mine)} from the kept one (a shape in both: the later measurement)"
            + (f"; WARNING: a median over more runs gave way to a later one at {', '.join(fewer)}" if fewer else "")
        )
    dropped = sorted(set(shapes_of(kept)) - set(shapes_of(v)))
    if v.started_at < kept.started_at or not replace:
        return None, (
            f"{loaded.name}: left out, the two cannot be merged: {why}"
            + (
                f"; the kept verdict ({kept.started_at}) is newer"
                if v.started_at < kept.started_at
                else "; only a live bench replaces a kept verdict"
            )
        )
    atomic_write_text(path, v.to_json())
    return v, (
        f"{loaded.name}: replaced the kept verdict of {kept.started_at}, the two cannot be merged: {why}"
        + (f"; its shapes not measured again are dropped: {', '.join(dropped)}" if dropped else "")
    )


def _first_problem(e: Exception) -> str:
    """One line naming what is wrong with an unreadable verdict file (field and message)."""
    errors: Callable[[], Any] | None = getattr(e, "errors", None)  # pydantic's ValidationError.errors
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ())) or "(file)"
            return f"{len(errors())} problem(s); first: {loc}: {first.get('msg')}"
        except (IndexError, TypeError, ValueError):
            pass
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def merge_kept(root: Path, src: Path, vdir: Path) -> list[str]:
    """Fold every verdict kept in ``src`` (another ``bench``'s ``<date>-<gpu>/`` folder, e.g.
    one copied back from a GPU machine) into ``vdir`` with :func:`keep_verdict`, as a live
    ``bench`` writing into ``vdir`` would have, except that it never replaces a kept verdict
    it cannot merge with (another candidate, other versions, a failure: those are left out,
    with the reason; only a live bench replaces). Verdicts of kernels that are no longer the
    accepted ones, and unreadable files, are skipped. Returns a line per file saying what
    happened. Raises ValueError when ``src`` or ``vdir`` is not a folder, when they are the
    same folder, or when ``src`` holds no usable verdict file."""
    src, vdir = Path(src), Path(vdir)
    for label, d in (("--merge-from", src), ("--from-verdicts", vdir)):
        if not d.is_dir():
            raise ValueError(f"{label} {d}: not a folder of kept verdicts (expected <results>/<date>-<gpu>/)")
    if src.resolve() == vdir.resolve():
        raise ValueError(f"--merge-from {src}: the same folder as --from-verdicts; nothing to merge")
    if not any(src.glob("*.json")):
        raise ValueError(
            f"--merge-from {src}: no verdict files (*.json) in it; expected a folder a bench kept, "
            "<results>/<date>-<gpu>/"
        )
    found, notes = day_verdicts(root, src)
    lines = [f"skipped {n.removeprefix('- ')}" for n in notes]
    if not found:
        raise ValueError(
            f"--merge-from {src}: nothing to merge, every verdict file was skipped:\n  " + "\n  ".join(lines)
        )
    for name, v in found.items():
        lines.append(keep_verdict(vdir, load_spec(root / "kernel_specs" / name), v, replace=False)[1])
    return lines


def check_page(vdir: Path, out_dir: Path | None = None, force: bool = False) -> Path:
    """The page ``<vdir name>.md`` that :func:`page_from_kept` writes (in ``out_dir``, default
    beside ``vdir``). Raises ValueError when it exists without :data:`PAGE_MARK` (not written
    by ``bench``, e.g. a hand-written record) and ``force`` is not set: callers check this
    before changing anything in ``vdir``."""
    vdir = Path(vdir)
    target = (Path(out_dir) if out_dir else vdir.parent) / f"{vdir.name}.md"
    if target.is_file() and not force and PAGE_MARK.format(folder=vdir.name) not in target.read_text():
        raise ValueError(
            f"{target}: exists and was not written by `coda-agent bench` from {vdir.name}/ "
            "(no marker line at its end, e.g. a hand-written record); nothing was changed. Move it, "
            "or pass --force to replace it"
        )
    return target


PAGE_MARK = "<!-- written by coda-agent bench from the verdicts kept in {folder}/; rewritten by `coda-agent bench --from-verdicts`, so edits here are lost -->"
"""Last line of every page ``bench`` writes from kept verdicts: a page without it (e.g. a
hand-written record) is never overwritten without ``force``."""

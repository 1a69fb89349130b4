"""The run folder: its layout, its records (``run.json``) and what it is trusted for.

A generation run lives in one folder; each finished step leaves a file there (the loop,
:mod:`~coda_agent.agent.loop`, skips a step whose file exists on a resume)::

    runs/<UTC time>-<spec>/
      run.json                 the state: spec, spec_hash, backend, model, status,
                               attempts (stage reached, tokens, cache hits, wall time)
      attempt-<k>/             (one answer per attempt; with --candidates N > 1 the answer's
                               files are in attempt-<k>/candidate-<j>/, j = 1..N, beside the
                               attempt's prompt, and attempt-<k>/feedback.md is the one the
                               next repair prompt carries)
        prompt.md              the exact prompt text (Prompt.as_text)
        prompt.json            the structured prompt (system blocks, messages)
        response.json          model, usage, stop reason, LLM wall time
        response.md            the raw response          <- "LLM step done"
        candidate.py           the extracted module      (re-derived from response.md)
        verify/                the verifier's workdir
        verdict.json           the Verdict               <- "verify step done" (a GPU pass
                               is verified again on a resume unless the library accepted
                               it: verdict-stored-<n>.json; a CPU-only pass before a GPU
                               run: verdict-cpu-<n>.json)
        feedback.md            what the next repair prompt tells the model
      lesson/prompt.md, lesson/response.md   the lesson call (fail -> pass)
      proposed_trick.md        the one-sentence lesson (NOT appended to tricks_log.md)

The run folder is input, not proof: in --llm manual mode the answerer writes there. So
its files are read as text a run could have been handed (:func:`read_text`,
:func:`read_parsed`: a file the loop would not have written is a :class:`RunError` naming
it), symlinks, FIFOs, devices and folders the loop never writes are refused
(:func:`check_run_files`), and a stored GPU pass counts only where the library's manifest
vouches for it (:func:`library_verdict`: the kernel it accepted is this attempt's candidate
byte for byte; :func:`accepted_by`). The same anchor decides whether a proposed lesson may
enter the tricks log unread (:func:`proposed_lesson`). Committed run records
(:data:`COMMITTED_RUNS`) are never resumed (:func:`resume_dir`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field, computed_field

from ..verifier.verdict import Verdict
from ..verifier.workspace import atomic_write_text, sha256_bytes
from .llm.base import Usage

RUN_FILE = "run.json"
CANDIDATE_DIR = re.compile(r"candidate-[1-9]\d*")
"""An attempt's folder for one of its ``--candidates`` answers."""


PROPOSED_TRICK = "proposed_trick.md"


class RunError(RuntimeError):
    """The run cannot start or resume (message says why and what to do)."""


def read_text(p: Path) -> str:
    """A run-folder file's text. The folder is the answerer's to write (--llm manual), so
    bytes that are not UTF-8 are a :class:`RunError` naming the file, not a traceback."""
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RunError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); fix it, then resume") from None


def read_parsed(p: Path, parse: Callable[[str], Any]) -> Any:
    """``parse`` of a run-folder file's text; a file it refuses (wrong JSON shape, fields of
    the wrong type) is a :class:`RunError` naming the file (``verdict.json`` holding ``{}``
    is not a traceback)."""
    text = read_text(p)
    try:
        return parse(text)
    except (ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunError(f"{p}: not what the loop wrote there ({first}); fix or delete it, then resume") from None


class CandidateRecord(BaseModel):
    """One answer and its verdict: the attempt's own (one answer per attempt) or one of its
    ``--candidates`` (``j``, 1-based)."""

    j: int | None = None
    stage_reached: str | None = None  # "extract" when no module could be extracted
    passed: bool | None = None
    failed_stage: str | None = None
    extract_error: str | None = None
    backend: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: Usage = Usage()
    llm_wall_s: float = 0.0
    verify_wall_s: float = 0.0
    fused_ms: float | None = None
    """Geometric mean of the fused kernel's median time over the benchmark shapes (a GPU
    pass): what picks the fastest of several passing candidates."""


class AttemptRecord(CandidateRecord):
    """One attempt as recorded in ``run.json``. With several candidates, the answer fields
    hold their totals (usage, wall times), the chosen candidate's outcome (a pass) or the
    replayed one's (a failure: the answer the repair prompt quotes), and
    ``candidate_records`` holds each one."""

    k: int
    kind: str = "task"
    step: str = "started"  # started -> prompted -> responded -> verified
    prompt_sha256: str | None = None
    estimated_prompt_tokens: int | None = None
    candidates: int = 1
    """Answers asked for this attempt (``--candidates``; fixed when the attempt starts)."""
    chosen: int | None = None
    """The passing candidate taken (the fastest); None: none passed, or one answer per attempt."""
    replay: int | None = None
    """The failed candidate the next repair prompt quotes (the one that got furthest)."""
    candidate_records: list[CandidateRecord] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def wall_s(self) -> float:
        """LLM + verifier wall time of this attempt (seconds, summed over resumes)."""
        return round(self.llm_wall_s + self.verify_wall_s, 3)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cache_hit(self) -> bool:
        """The LLM call read its prefix from the prompt cache."""
        return self.usage.cache_read_input_tokens > 0


class LessonRecord(BaseModel):
    """The fail -> pass lesson: ``status`` proposed / waiting-for-answer / error / skipped."""

    status: str
    failed_attempt: int | None = None
    path: str | None = None
    text: str | None = None
    answer_path: str | None = None
    error: str | None = None
    usage: Usage = Usage()


class RunState(BaseModel):
    """The content of ``run.json``."""

    version: int = 1
    spec: str
    spec_hash: str
    spec_dir: str
    root: str
    backend: str
    model: str
    status: str = "running"
    max_attempts: int
    candidates: int = 1
    """Answers asked per attempt (``--candidates``); a resume keeps it unless given."""
    cpu_only: bool = False
    force: bool = False
    no_accept: bool = False
    """Started with --no-accept: sticky, a resumed run never accepts (start a new run to accept)."""
    created_at: str
    updated_at: str = ""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    answer_path: str | None = None
    answers_awaited: list[str] = Field(default_factory=list)
    """Every answer file a waiting run needs (several with ``--candidates``)."""
    accepted_path: str | None = None
    lesson: LessonRecord | None = None
    error: str | None = None

    def attempt(self, k: int) -> AttemptRecord:
        """The record of attempt ``k`` (created, in order, when new)."""
        for a in self.attempts:
            if a.k == k:
                return a
        rec = AttemptRecord(k=k)
        self.attempts.append(rec)
        self.attempts.sort(key=lambda a: a.k)
        return rec


class RunSummary(BaseModel):
    """What :func:`generate` returns: the run's final state plus totals and a rendering."""

    model_config = {"arbitrary_types_allowed": True}

    run_dir: Path
    state: RunState

    @property
    def status(self) -> str:
        return self.state.status

    @property
    def attempts(self) -> list[AttemptRecord]:
        return self.state.attempts

    @property
    def usage(self) -> Usage:
        total = Usage()
        for a in self.state.attempts:
            total = total + a.usage
        if self.state.lesson:
            total = total + self.state.lesson.usage
        return total

    @property
    def cache_hits(self) -> int:
        """LLM calls that read from the prompt cache."""
        n = sum(1 for a in self.state.attempts if a.cache_hit)
        if self.state.lesson and self.state.lesson.usage.cache_read_input_tokens > 0:
            n += 1
        return n

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.state.attempts)

    @property
    def proposed_trick(self) -> Path | None:
        p = self.run_dir / PROPOSED_TRICK
        return p if p.is_file() else None

    def resume_command(self, *extra: str) -> str:
        """The command that continues this run, flags included (``--cpu-only`` while an
        answer asked for under it is awaited) and ``extra`` flags after them, paths quoted
        for a shell: ``--force`` and ``--cmd`` are not taken from run.json on a resume
        (``--force`` by design, the command backend's CMD is not kept), so the hint repeats
        them, and says so after the command (a note inside the command, or an unquoted root
        with a space, would break the paste)."""
        s = self.state
        # the run's name: --resume finds it under runs/ from any folder of the workspace, on
        # a GPU machine whose checkout lives elsewhere too
        ref = self.run_dir.name if self.run_dir.parent.name == "runs" else self.run_dir
        # ... but only when the workspace is found: from outside it, the hint names it
        root = self.run_dir.parent.parent.resolve()
        cwd, env = Path.cwd().resolve(), os.environ.get("CODA_ROOT")
        found = root == cwd or root in cwd.parents or (env is not None and Path(env).resolve() == root)
        where = [] if found or ref == self.run_dir else ["--root", str(root)]
        argv = (
            ["coda-agent", *where, "generate", s.spec, "--resume", str(ref)]
            + (["--cmd", "CMD"] if s.backend == "command" else [])
            + (["--force"] if s.force else [])
            + (["--no-accept"] if s.no_accept else [])
            # the answer awaited is checked where it was asked for: as this call did
            + (["--cpu-only"] if s.cpu_only and s.status == "waiting-for-answer" else [])
            + list(extra)
        )
        return shlex.join(argv).replace("--cmd CMD", '--cmd "CMD"') + (
            " (the command backend's CMD is not kept in run.json: give it again)" if s.backend == "command" else ""
        )

    def render(self) -> str:
        """A plain-text summary for the CLI."""
        s = self.state
        lines = [f"run {self.run_dir}: {s.status}" + (f" -> {s.accepted_path}" if s.accepted_path else "")]
        lines.append(f"spec {s.spec}  backend {s.backend}  model {s.model}")
        lines.append(
            f"{'attempt':>7}  {'stage reached':<14} {'result':<7} {'in/out tokens':>15} {'cache read':>10} {'wall s':>8}"
        )
        for a in s.attempts:
            res = "pass" if a.passed else ("fail" if a.passed is False else a.step)
            tok = f"{a.usage.input_tokens}/{a.usage.output_tokens}"
            lines.append(
                f"{a.k:>7}  {a.stage_reached or '-':<14} {res:<7} {tok:>15} "
                f"{a.usage.cache_read_input_tokens:>10} {a.wall_s:>8.1f}"
            )
            if a.candidate_records:
                lines.append("         " + candidates_line(a))
        u = self.usage
        lines.append(
            f"total: {len(s.attempts)} attempt(s), tokens in {u.input_tokens} / out {u.output_tokens}, "
            f"cache hits {self.cache_hits} ({u.cache_read_input_tokens} tokens read, "
            f"{u.cache_creation_input_tokens} written), wall {self.wall_s:.1f} s"
        )
        if s.status == "waiting-for-answer" and len(s.answers_awaited) > 1:
            where = ", ".join(s.answers_awaited)
            lines.append(
                f"waiting for {len(s.answers_awaited)} answers: read the prompt.md beside each, write one reply "
                f"to each of {where}, then resume: {self.resume_command()}"
            )
        elif s.status == "waiting-for-answer" and s.answer_path:
            lines.append(
                f"waiting for the answer: read {Path(s.answer_path).with_name('prompt.md')}, write the "
                f"model's reply to {s.answer_path}, then resume: {self.resume_command()}"
            )
        done = [a for a in s.attempts if a.passed is not None]  # the latest verified attempt, if it failed
        last = done[-1] if done else None
        if last is not None and last.passed is False:
            fb = self.run_dir / f"attempt-{last.k}" / "feedback.md"
            why = last.extract_error or (f"failed the {last.failed_stage} stage" if last.failed_stage else "failed")
            if s.status == "out-of-attempts":
                more = (
                    f" (its feedback: {fb}; to try again: {self.resume_command('--max-attempts', str(last.k + 1))})"
                    if fb.is_file()
                    else ""
                )
            else:
                more = f" (the feedback the next attempt gets: {fb})" if fb.is_file() else ""
            lines.append(f"attempt {last.k}: {why}{more}")
        if s.status == "passed-cpu-only":
            goal = "verify it" if s.no_accept else "verify (and accept) it"
            lines.append(
                f"passed the CPU stages only; to {goal}, resume the run on a Hopper GPU: {self.resume_command()}"
            )
            taken = (Path(s.root) / "generated_kernels" / s.spec / "manifest.json").is_file()
            if taken and not (s.no_accept or s.force or accepted_by(Path(s.root), s.spec, self.run_dir)):
                lines.append(
                    f"({s.spec} already has an accepted kernel: that resume also needs --force to replace "
                    "it, or --no-accept to only verify)"
                )
        if s.no_accept:
            lines.append("this run was started with --no-accept: it verifies but never accepts")
        if s.error:
            lines.append(f"error: {s.error}")
        if s.status in ("failed", "interrupted", "verifier-error"):
            lines.append(f"to continue once the cause is fixed: {self.resume_command()}")
        if s.lesson:
            if s.lesson.status == "proposed":
                lines.append(
                    f"proposed trick ({s.lesson.path}): {s.lesson.text}\n"
                    f"  add it with: coda-agent tricks add --from-run {self.run_dir}"
                    + (" --unverified (no accepted kernel vouches for a --no-accept run)" if s.no_accept else "")
                )
            elif s.lesson.status == "waiting-for-answer":
                lines.append(f"lesson: waiting for an answer at {s.lesson.answer_path}, then: {self.resume_command()}")
            elif s.lesson.status == "error":
                lines.append(f"lesson: not proposed ({s.lesson.error})")
        return "\n".join(lines)


def candidates_line(a: AttemptRecord) -> str:
    """One line on an attempt's candidates: each one's outcome, the chosen or replayed one."""
    parts = []
    for c in a.candidate_records:
        what = (
            "pass" + (f" {c.fused_ms:.4g} ms" if c.fused_ms else "")
            if c.passed
            else (f"fail at {c.failed_stage}" if c.passed is False else "not answered")
        )
        mark = " (chosen)" if a.chosen == c.j else " (replayed)" if a.replay == c.j else ""
        parts.append(f"{c.j}: {what}{mark}")
    return f"candidates: {'; '.join(parts)}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def save_state(run_dir: Path, state: RunState) -> None:
    state.updated_at = utc_now()
    atomic_write_text(run_dir / RUN_FILE, json.dumps(state.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")


def load_run(run_dir: str | Path) -> RunSummary:
    """The summary of an existing run directory (raises :class:`RunError` if none, or when
    :func:`check_run_files` refuses one of its files)."""
    run_dir = Path(run_dir)
    p = run_dir / RUN_FILE
    try:
        found = p.is_file()
    except OSError as e:  # a name too long for the file system, ...
        raise RunError(f"{str(run_dir)[:200]}: cannot be looked at ({e.strerror})") from None
    if not found:
        raise RunError(f"{run_dir}: not a run directory (no {RUN_FILE})")
    check_run_files(run_dir)
    return RunSummary(run_dir=run_dir, state=read_parsed(p, RunState.model_validate_json))


def check_run_files(run_dir: Path) -> None:
    """Refuse a run folder whose own files (``run.json``, ``.lock``, ``attempt-<k>/*``,
    ``lesson/*``; not the verifier's workdirs) include anything but regular files and
    folders, or whose attempt and lesson folders hold any folder but ``verify/`` (and an
    attempt's ``candidate-<j>/`` folders, which hold files and ``verify/``). In --llm
    manual mode the answerer writes into the run folder: a FIFO named ``.lock`` or
    ``response.md`` would block ``--resume`` forever, a symlink would have the loop read,
    and send on to the model, a file from elsewhere, and a ``__pycache__/`` beside
    ``candidate.py`` would hold bytecode to run in its place (the verifier never imports
    through bytecode caches either, see ``verifier/confine/snapshot.py``).
    Raises :class:`RunError` naming the entry."""
    run_dir = Path(run_dir)
    folders = [run_dir, *(d for d in run_dir.iterdir() if d.name.startswith("attempt-") or d.name == "lesson")]
    folders += [
        c
        for d in folders[1:]
        if d.name.startswith("attempt-") and d.is_dir() and not d.is_symlink()
        for c in d.iterdir()
        if CANDIDATE_DIR.fullmatch(c.name) and c.is_dir() and not c.is_symlink()
    ]
    for folder in folders:
        if folder.is_symlink():
            raise RunError(f"{folder}: a symlink; a run folder holds only regular files and folders")
        for e in os.scandir(folder):
            if (
                folder == run_dir
                and e.is_dir(follow_symlinks=False)
                and not e.is_symlink()
                and not (re.fullmatch(r"attempt-\d+", e.name) or e.name == "lesson")
            ):
                # a folder named proposed_trick.md failed the lesson write after acceptance
                raise RunError(
                    f"{Path(e.path)}: a folder the loop never writes (a run folder holds attempt-<k>/ "
                    "and lesson/ only). Remove it, then resume"
                )
            if folder != run_dir and e.name == "verify" and e.is_dir(follow_symlinks=False):
                continue  # the verifier's workdir (a real folder: it empties parts of it): its contents are its own
            if e.is_symlink() or not (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False)):
                raise RunError(
                    f"{Path(e.path)}: not a regular file or folder (a symlink, FIFO, socket or device); "
                    "a run folder holds only regular files and folders. Remove it, then resume"
                )
            if (
                folder.name.startswith("attempt-")
                and CANDIDATE_DIR.fullmatch(e.name)
                and e.is_dir(follow_symlinks=False)
            ):
                continue  # checked as a folder of its own
            if folder != run_dir and e.is_dir(follow_symlinks=False):
                raise RunError(
                    f"{Path(e.path)}: a folder the loop never writes (an attempt folder holds files and "
                    "the verifier's verify/ only). Remove it, then resume"
                )


def record_path(d: Path, kind: str) -> Path:
    """``d/verdict-<kind>-<n>.json`` with the next free ``n``: where an attempt keeps a verdict
    set aside for the record (``cpu``: a CPU-only pass before a GPU run, ``stored``: a pass
    verified again, ``error``: a verifier error, ``stale``: a verdict on an answer edited since)."""
    return d / f"verdict-{kind}-{len(list(d.glob(f'verdict-{kind}-*.json'))) + 1}.json"


def library_verdict(
    root: Path, spec_name: str, run_dir: Path, attempt: int | None = None, candidate: int | None = None
) -> Verdict | None:
    """The verdict the library accepted this run's kernel with, or None.

    ``<root>/generated_kernels/<spec>/manifest.json`` is the trust anchor for a run folder
    (which is the answerer's to write): its verdict counts for ``run_dir`` only when its
    provenance names the run (by folder name), and the kernel it holds (``kernel_sha256``)
    is byte for byte the run's ``attempt-<k>/candidate.py``, ``k`` being the manifest's
    ``provenance.attempts`` (and ``attempt`` when given), or ``attempt-<k>/candidate-<j>/
    candidate.py`` when the provenance names a candidate ``j`` (``candidate`` when given
    must equal it; one answer per attempt has none). A folder of the same name, or a
    manifest later replaced by another run, gives None."""
    from ..verifier.library.accept import ManifestError, read_manifest, verdict_from_manifest

    try:
        man = read_manifest(Path(root) / "generated_kernels" / spec_name / "manifest.json")
        prov = man.get("provenance")
        if not isinstance(prov, dict) or Path(str(prov.get("run_dir") or "")).name != Path(run_dir).name:
            return None
        k = prov.get("attempts")
        if not isinstance(k, int) or isinstance(k, bool) or (attempt is not None and k != attempt):
            return None
        j = prov.get("candidate")
        if (j is not None and (not isinstance(j, int) or isinstance(j, bool) or j < 1)) or (
            attempt is not None and j != candidate
        ):
            return None
        cand = Path(run_dir) / f"attempt-{k}" / ("" if j is None else f"candidate-{j}") / "candidate.py"
        if cand.is_symlink() or not cand.is_file() or sha256_bytes(cand.read_bytes()) != man.get("kernel_sha256"):
            return None
        return verdict_from_manifest(man)
    except (ManifestError, OSError, KeyError, TypeError, ValueError):
        return None


def accepted_by(root: Path, spec_name: str, run_dir: Path) -> bool:
    """Whether the library's kernel of ``spec_name`` came from ``run_dir``
    (:func:`library_verdict`): what a resumed run's ``accepted_path`` must agree with to be
    believed (``run.json`` is the answerer's to write)."""
    return library_verdict(root, spec_name, run_dir) is not None


def new_run_dir(root: Path, spec_name: str) -> Path:
    """``<root>/runs/<UTC YYYYmmddTHHMMSSZ>-<spec>`` (suffixed when it exists)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = Path(root) / "runs" / f"{stamp}-{spec_name}"
    d, i = base, 2
    while d.exists():
        d = base.with_name(f"{base.name}-{i}")
        i += 1
    return d


COMMITTED_RUNS = Path("benchmarks") / "results" / "runs"
"""Where the runs behind the accepted kernels are committed: records, never resumed."""


def find_run(root: Path, value: str) -> Path:
    """A run folder given as a path (from the current folder), or by its name under the
    workspace's ``runs/`` (``--resume RUN``, ``tricks add --from-run RUN``); ``value`` as a
    path when none holds a run.json (the caller names what is missing)."""
    p = Path(value)
    if holds_run(p):
        return p
    return next((c for c in (root / "runs" / value, root / value) if holds_run(c)), p)


def holds_run(d: Path) -> bool:
    """Whether ``d/run.json`` is a file; False also where the path cannot be looked at (a
    name too long for the file system raised OSError)."""
    try:
        return (d / "run.json").is_file()
    except OSError:
        return False


def resume_dir(root: Path, value: str) -> Path:
    """``--resume RUN`` (:func:`find_run`). A committed run record
    (``benchmarks/results/runs/``) is refused: a resume rewrites run.json and the attempt
    folders, tracked files there."""
    found = find_run(root, value)
    where = found.resolve()
    # a run folder sits right in runs/: only its parent is looked at (a workspace that itself
    # lives under some benchmarks/results/runs/ folder is not a record)
    if where.parent.parts[-3:] == COMMITTED_RUNS.parts and holds_run(found):
        dest = root / "runs" / where.name
        raise RunError(
            f"--resume {value}: {found} is a committed run record ({COMMITTED_RUNS}/), kept as it "
            f"was; to continue it, copy it into runs/ first: mkdir -p {shlex.quote(str(root / 'runs'))} && "
            f"cp -r {shlex.quote(str(where))} {shlex.quote(str(dest))}"
        )
    if not holds_run(found):  # named once (load_run's message repeated the path)
        raise RunError(
            f"--resume {value}: no run there (looked for run.json in {Path(value)} and "
            f"{root / 'runs' / value}); `ls {root / 'runs'}` lists this workspace's runs"
        )
    return found


def accepted_from(root: Path, kernel: str | None) -> str:
    """Where the library's ``kernel`` says it came from, in words (for an error message)."""
    from ..verifier.library.accept import ManifestError, read_manifest

    if kernel is None:
        return "run.json names no spec"
    try:
        prov = read_manifest(root / "generated_kernels" / kernel / "manifest.json").get("provenance")
    except ManifestError:
        return f"no readable manifest in generated_kernels/{kernel}/"
    if not isinstance(prov, dict) or not prov.get("run_dir"):
        return "its manifest names no run"
    return f"its manifest names run {Path(str(prov['run_dir'])).name}, attempt {prov.get('attempts', '?')}"


def proposed_lesson(root: str | Path, run_dir: str | Path, *, unverified: bool = False) -> tuple[str, str | None]:
    """``(text, kernel)``: the lesson a run proposed (``<run_dir>/proposed_trick.md``, HTML
    comments dropped whole) and the run's spec (``run.json``), for ``tricks add --from-run``.

    The run folder is the answerer's to write, so its word that it passed is not enough:
    the library's manifest must vouch for the run (:func:`accepted_by`: the accepted kernel
    is this run's candidate byte for byte), unless ``unverified`` (a ``--no-accept`` run
    that passed, or a folder copied from elsewhere: the caller takes the text on its own
    reading). Raises :class:`RunError` when a file of the run is refused
    (:func:`check_run_files`), when the run proposed nothing (a lesson is proposed only
    when attempt k failed and k+1 passed; ``run.json`` must say so) or nothing vouches for it.
    """
    run_dir = Path(run_dir)
    try:  # the run folder is the answerer's to write: no symlinked proposed_trick.md
        check_run_files(run_dir)
    except (RunError, OSError) as e:
        raise RunError(f"{run_dir}: {e}") from None
    p = run_dir / PROPOSED_TRICK
    if not p.is_file():
        raise RunError(
            f"{p}: no proposed trick in this run (one is proposed only when an attempt failed "
            "and the next one passed every stage on the GPU; a CPU-only pass proposes none)"
        )
    text = re.sub(r"<!--.*?(-->|\Z)", "", p.read_text(errors="replace"), flags=re.S)
    state = None
    rj = run_dir / "run.json"
    if rj.is_file():
        try:
            state = json.loads(rj.read_text(errors="replace"))
        except ValueError:
            state = None
    state = state if isinstance(state, dict) else {}
    raw = state.get("lesson")
    lesson = raw if isinstance(raw, dict) else {}
    if lesson.get("status") != "proposed":
        raise RunError(
            f"{rj}: the run records no proposed lesson (lesson status "
            f"{lesson.get('status')!r}); {p.name} is not the loop's proposal"
        )
    kernel = state.get("spec") if isinstance(state.get("spec"), str) else None
    if not unverified and (kernel is None or not accepted_by(Path(root), kernel, run_dir)):
        raise RunError(
            f"{run_dir}: nothing outside the run folder vouches that this run passed: the library's "
            f"{kernel or '<spec>'} kernel was not accepted from it ({accepted_from(Path(root), kernel)}; the run "
            "must have that folder name and hold that attempt's candidate byte for byte). A --no-accept run or a "
            f"renamed copy is never vouched for: read {p} yourself and add it with --unverified, or as text "
            "with `tricks add TEXT`"
        )
    return text, kernel

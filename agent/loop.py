"""The generate loop: prompt -> LLM -> extract -> verify -> (repair ...) -> accept.

Design
------
A generation run may take an hour of GPU verification and real money in tokens, so it
is a *resumable state machine on disk*. Each attempt owns a folder and each finished
step leaves a file there; the presence of the file marks the step done (for a resume
of this machine's own run). The folder's layout, its records and what it is trusted for
are :mod:`~coda_agent.agent.run_folder`'s.

``run.json`` is rewritten atomically after every step (``status``: ``running``,
``waiting-for-answer``, ``accepted``, ``passed`` (verified, no accept requested),
``passed-cpu-only`` (static + compile passed without a GPU; never accepted),
``out-of-attempts``, ``failed`` (the LLM backend or acceptance failed),
``verifier-error``, ``interrupted``). Resuming (``resume=RUN_DIR``) walks
the attempts again and skips every step whose file exists: a response present but no
verdict -> verify; a failed verdict -> the next attempt's repair prompt. An LLM call
that finished is therefore never paid for twice, whatever interrupted the run.

Other decisions:

* The system blocks and the task message are rendered once (attempt 1) and reused
  verbatim by every repair and the lesson prompt, so the prompt-cache prefix stays
  byte-identical and the run is reproducible even if docs change mid-run.
* The run folder is input, not proof: in --llm manual mode the answerer writes there. A
  stored GPU pass in ``verdict.json`` is verified again on a resume (accepting or not)
  unless the library's manifest vouches for it (``run_folder.library_verdict``: the kernel
  it accepted is this attempt's candidate byte for byte), ``--force``
  is never read from ``run.json`` (the CLI asks for it on the resume), the manifest's
  provenance says whether this process received the answer itself
  (``answer_received_here``), and symlinks/FIFOs/devices in the folder are refused
  (``run_folder.check_run_files``).
* An extraction failure is a failed attempt whose feedback is the extraction error.
* The verifier is injected (``verifier(loaded, candidate_path, workdir) -> Verdict``, with
  an optional ``many(loaded, [(candidate_path, workdir), ...])`` that verifies several side
  by side); :func:`default_verifier` runs ``pipeline.verify`` through the scheduler.
* ``--candidates N`` asks for N answers per attempt and takes the fastest that passes
  (:mod:`~coda_agent.agent.candidates`).
* Backend errors the user can act on (``LLMError``) end the run as ``failed`` with the
  message; ``AwaitingAnswer`` (manual backend) ends it as ``waiting-for-answer``
  with the path where the answer goes. Anything else (Ctrl-C, a verifier crash) marks
  it ``interrupted``/``failed`` and propagates; ``--resume`` continues either way.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Callable

from ..verifier import progress
from ..verifier.verdict import Verdict
from ..verifier.workspace import atomic_write_text
from .answers import AnswerSteps, VerifierError, answered
from .candidates import ask_all
from .context import gather_context
from .lesson import LessonStep
from .llm.base import AwaitingAnswer, LLMError, LLMResponse
from .render import (
    Prompt,
    build_repair_prompt,
    build_task_prompt,
)
from .run_folder import (
    RUN_FILE,
    RunError,
    RunState,
    RunSummary,
    accepted_by,
    check_run_files,
    load_run,
    new_run_dir,
    read_parsed,
    read_text,
    save_state,
    utc_now,
)

TERMINAL = ("accepted", "passed", "passed-cpu-only", "out-of-attempts")
DEFAULT_MAX_ATTEMPTS = 5
"""Attempts of a new run unless ``--max-attempts`` says otherwise."""
Verifier = Callable[[Any, Path, Path], Verdict]


# --------------------------------------------------------------------------- helpers


def default_verifier(
    *, cpu_only: bool = False, bench: bool = True, timeout_s: float | None = None, ray: str | None = None
) -> Verifier:
    """A verifier callable through the scheduler (``verifier/schedule/``: every visible GPU,
    or a Ray cluster with ``ray``), with ``many(loaded, [(candidate, workdir), ...])``
    verifying several side by side. The scheduler is made on first use; ``ray`` is checked
    at once (ValueError: no Ray, or no reachable cluster)."""
    from ..verifier.schedule import Job, make_scheduler

    made: list[Any] = [make_scheduler(ray=ray, cpu_only=cpu_only)] if ray else []

    def many(loaded: Any, pairs: list[tuple[Path, Path]]) -> list[Verdict]:
        if not made:
            made.append(make_scheduler(ray=ray, cpu_only=cpu_only))
        sched = made[0]
        sched.screen = len(pairs) > 1  # one alone: its full run directly
        jobs = [
            Job(loaded, Path(c), workdir=Path(w), bench=bench, timeout_s=timeout_s, label=f"{Path(c).parent.name}")
            for c, w in pairs
        ]
        return sched.verify_many(jobs)

    def run(loaded: Any, candidate: Path, workdir: Path) -> Verdict:
        return many(loaded, [(candidate, workdir)])[0]

    run.many = many  # type: ignore[attr-defined]
    return run


# --------------------------------------------------------------------------- the loop


class _Run(AnswerSteps, LessonStep):
    def __init__(
        self,
        loaded: Any,
        root: Path,
        run_dir: Path,
        state: RunState,
        backend: Any,
        verifier: Verifier,
        accept_fn: Callable[..., Any] | None,
    ):
        self.loaded, self.root, self.run_dir, self.state = loaded, root, run_dir, state
        self.backend, self.verifier, self.accept_fn = backend, verifier, accept_fn
        self.max_examples = 3
        self.answered_here: set[tuple[int, int]] = set()  # (attempt, answer index) received by this process

    def save(self) -> None:
        save_state(self.run_dir, self.state)

    def adir(self, k: int) -> Path:
        return self.run_dir / f"attempt-{k}"

    # -- prompts ------------------------------------------------------------------
    def base_prompt(self) -> Prompt:
        p = self.adir(1) / "prompt.json"
        if p.is_file():
            return read_parsed(p, Prompt.from_json)
        ctx = gather_context(self.root, self.loaded, max_examples=self.max_examples)
        return build_task_prompt(self.loaded, ctx)

    def prompt_for(self, k: int) -> Prompt:
        d = self.adir(k)
        if (d / "prompt.json").is_file():
            return read_parsed(d / "prompt.json", Prompt.from_json)
        base = self.base_prompt()
        if k == 1:
            prompt = base
        else:
            prev = self.module_dir(k - 1)  # the replayed candidate's, with several
            cand = prev / "candidate.py"
            prompt = build_repair_prompt(
                base,
                previous_response=read_text(prev / "response.md"),
                previous_candidate=read_text(cand) if cand.is_file() else None,
                feedback=read_text(self.adir(k - 1) / "feedback.md"),
                attempt=k,
                max_attempts=self.state.max_attempts,
            )
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "prompt.md", prompt.as_text())
        atomic_write_text(d / "prompt.json", prompt.to_json())
        return prompt

    # -- LLM ----------------------------------------------------------------------
    def call(self, prompt: Prompt, d: Path, backend: Any = None) -> tuple[LLMResponse, float]:
        """Call the backend (``backend``: a copy of it for one of several calls at once) for
        ``prompt`` whose files live in ``d``; persist the reply."""
        backend = self.backend if backend is None else backend
        d.mkdir(parents=True, exist_ok=True)
        if hasattr(backend, "bind"):
            backend.bind(d)
        t0 = time.monotonic()
        who = getattr(backend, "name", "the model")
        where = f" for {d.name}" if d.name.startswith("candidate-") else ""
        with progress.step(f"waiting for the answer{where} ({who})") as s:
            try:
                resp = backend.complete(prompt)
            except AwaitingAnswer:
                s.outcome = "no answer yet (the run waits for one)"
                raise
            s.outcome = f"answered ({resp.usage.output_tokens} output tokens)"
        wall = time.monotonic() - t0
        meta = {
            "backend": getattr(backend, "name", "?"),
            "model": resp.model,
            "stop_reason": resp.stop_reason,
            "usage": resp.usage.model_dump(),
            "wall_s": round(wall, 3),
            "finished_at": utc_now(),
        }
        atomic_write_text(d / "response.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
        # last: its presence means "done". A blank answer (thinking used every output token,
        # a refusal) is still an answer: written blank, a resume would take it for "no answer
        # yet" and pay for the call again, losing this one from the accounting.
        text = resp.text if resp.text.strip() else f"(the model returned no text; stop_reason={resp.stop_reason})\n"
        atomic_write_text(d / "response.md", text)
        return resp, wall

    # -- one attempt ----------------------------------------------------------------
    def attempt(self, k: int) -> Verdict | None:
        """Run (or resume) attempt ``k``: its prompt, every answer asked for, each verified
        (side by side when several). Returns the verdict that counts: the passing one (the
        fastest of several), else the replayed failure's (None: its answer had no module).
        Raises AwaitingAnswer / LLMError from the backend, VerifierError."""
        d = self.adir(k)
        rec = self.state.attempt(k)
        if rec.step == "started" and not (d / "response.md").is_file():
            rec.candidates = self.state.candidates  # fixed once the attempt starts
        prompt = self.prompt_for(k)
        rec.kind = prompt.kind
        rec.prompt_sha256 = prompt.sha256()
        rec.estimated_prompt_tokens = prompt.estimate_tokens()
        if rec.step == "started":
            rec.step = "prompted"
        self.save()

        slots = self.slots(k)
        t0 = time.monotonic()

        def ask(backend: Any, slot: Path) -> None:
            self.crec(k, slots.index(slot)).backend = getattr(backend, "name", None)
            self.call(prompt, slot, backend)
            self.answered_here.add((k, slots.index(slot)))

        asked = ask_all(self.backend, slots, ask, lambda slot: answered(slot / "response.md"))
        if asked and rec.candidates > 1:
            rec.llm_wall_s += time.monotonic() - t0  # the N calls ran at once: the attempt's wall time
        sources = [self.read_answer(k, i, slot) for i, slot in enumerate(slots)]
        if rec.step in ("started", "prompted"):
            rec.step = "responded"
        self.save()

        verdicts = self.verdicts(k, slots, sources)
        verdict = verdicts[0] if rec.candidates <= 1 else self.choose(k, slots, verdicts)
        rec.step = "verified"
        self.save()
        return verdict

    # -- after a pass -----------------------------------------------------------------
    def finish(self, k: int, verdict: Verdict, force: bool) -> None:
        s = self.state
        cand = self.module_dir(k) / "candidate.py"
        if not verdict.gpu_verified:
            # Not verified yet: no acceptance and no lesson (a repair's lesson is only
            # worth proposing once the fix has passed the GPU stages too).
            s.status = "passed-cpu-only"
            s.error = None
            self.save()
            return
        elif self.accept_fn is None:
            s.status = "passed"
        elif s.accepted_path is None:
            rec = s.attempt(k)
            provenance = {
                "backend": rec.backend or getattr(self.backend, "name", "?"),
                "model": rec.model or getattr(self.backend, "model", "?"),
                "prompt_sha256": rec.prompt_sha256,
                "attempts": k,
                "run_dir": str(self.run_dir),
                # whether this process received the answer from its backend; otherwise backend
                # and model are as the run folder recorded them (the answerer's to write in
                # --llm manual mode), not something this process saw
                "answer_received_here": (k, (rec.chosen or 1) - 1) in self.answered_here,
            }
            if rec.candidates > 1 and rec.chosen is not None:  # library_verdict finds it there
                provenance.update(candidate=rec.chosen, candidates=rec.candidates)
            try:
                path = self.accept_fn(self.loaded, cand, verdict, root=self.root, provenance=provenance, force=force)
            except Exception as e:
                s.status, s.error = "failed", f"accept refused: {type(e).__name__}: {e}"
                self.save()
                self.lesson(k)
                return
            s.accepted_path = str(path)
            s.status = "accepted"
        else:
            s.status = "accepted"
        s.error = None
        self.save()
        self.lesson(k)


def generate(
    loaded_spec: Any,
    *,
    root: str | Path,
    backend: Any,
    verifier: Verifier | None = None,
    max_attempts: int | None = None,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    accept_fn: Callable[..., Any] | None = None,
    force: bool = False,
    cpu_only: bool = False,
    no_accept: bool = False,
    max_examples: int = 3,
    candidates: int | None = None,
) -> RunSummary:
    """Generate a kernel for ``loaded_spec`` (a ``LoadedSpec``) and return the run summary.

    * ``backend``: an LLM backend (``make_backend(...)``).
    * ``verifier``: ``verifier(loaded, candidate_path, workdir) -> Verdict``; default
      :func:`default_verifier` (``pipeline.verify`` with ``cpu_only``).
    * ``run_dir``: where a new run goes (default ``<root>/runs/<UTC>-<spec>``);
      ``resume``: an existing run directory to continue (same spec and spec hash).
    * ``accept_fn``: called on a GPU-verified pass as
      ``accept_fn(loaded, candidate, verdict, root=root, provenance={...}, force=force)``
      (``verifier.accept.accept`` fits); its return value is recorded as
      ``accepted_path``.
    * ``max_attempts``: attempts in total; None: :data:`DEFAULT_MAX_ATTEMPTS` for a new
      run, the run's own on resume (given on resume, it replaces that: raising it
      continues an ``out-of-attempts`` run).
    * ``no_accept``: recorded in ``run.json`` and sticky over resumes: the caller must not
      pass ``accept_fn`` for such a run (raises RunError if it does).
    * ``candidates``: answers asked per attempt, verified side by side, the fastest pass
      taken (:mod:`~coda_agent.agent.candidates`); None: 1 for a new run, the run's own on
      resume (given on resume, it applies to the attempts not yet started).

    Returns with ``status`` ``accepted`` / ``passed`` / ``passed-cpu-only`` /
    ``out-of-attempts`` / ``waiting-for-answer`` / ``failed`` (backend error or accept
    refused, message in ``state.error``). Ctrl-C or an unexpected error propagates
    after recording ``interrupted`` / ``failed`` in ``run.json``.
    """
    root = Path(root)
    if verifier is None:
        verifier = default_verifier(cpu_only=cpu_only)
    if max_attempts is not None and max_attempts < 1:
        raise RunError("max_attempts must be >= 1")
    if candidates is not None and candidates < 1:
        raise RunError("candidates must be >= 1")
    backend_name = getattr(backend, "name", type(backend).__name__)
    backend_model = getattr(backend, "model", "?")
    if resume is not None:
        run_dir = Path(resume)
        state = load_run(run_dir).state
        if state.spec != loaded_spec.name:
            raise RunError(f"{run_dir} is a run of spec {state.spec!r}, not {loaded_spec.name!r}")
        if state.spec_hash != loaded_spec.spec_hash:
            raise RunError(
                f"{run_dir}: spec {state.spec!r} changed since the run started "
                f"(hash {state.spec_hash[:12]} -> {loaded_spec.spec_hash[:12]}); start a new run"
            )
        if max_attempts is not None:
            made = max((a.k for a in state.attempts), default=0)
            if max_attempts < made:
                # attempts are replayed from 1: a lower limit would stop the replay before a
                # recorded attempt (a passed run ended "out-of-attempts", and the limit stuck)
                raise RunError(
                    f"{run_dir} has made {made} attempt(s); --max-attempts must be at least {made} (got {max_attempts})"
                )
            state.max_attempts = max_attempts
        state.root = str(root)  # where it runs now (a run folder copied from another checkout)
        state.backend, state.model = backend_name, backend_model
        state.cpu_only, state.force = cpu_only, force
        state.no_accept = state.no_accept or no_accept
        if candidates is not None:
            state.candidates = candidates
    else:
        run_dir = Path(run_dir) if run_dir is not None else new_run_dir(root, loaded_spec.name)
        if (run_dir / RUN_FILE).exists():
            raise RunError(f"{run_dir} already holds a run; continue it with --resume {run_dir}")
        run_dir.mkdir(parents=True, exist_ok=True)
        state = RunState(
            spec=loaded_spec.name,
            spec_hash=loaded_spec.spec_hash,
            spec_dir=str(loaded_spec.directory),
            root=str(root),
            backend=backend_name,
            model=backend_model,
            max_attempts=DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts,
            candidates=candidates or 1,
            cpu_only=cpu_only,
            force=force,
            no_accept=no_accept,
            created_at=utc_now(),
        )
    if state.accepted_path is not None:
        # run.json says this run was accepted: believed only when the library's manifest
        # names this run, and then shown where this workspace keeps it (a run record copied
        # from another checkout names that checkout's path)
        ours = accepted_by(root, loaded_spec.name, run_dir)
        state.accepted_path = str(Path(root) / "generated_kernels" / loaded_spec.name) if ours else None
    if state.no_accept and accept_fn is not None:
        raise RunError(
            f"{run_dir} was started with --no-accept and never accepts; resume it with --no-accept, "
            "or start a new run to accept a kernel"
        )
    state.status, state.error, state.answer_path, state.answers_awaited = "running", None, None, []
    run = _Run(loaded_spec, root, run_dir, state, backend, verifier, accept_fn)
    run.max_examples = max_examples

    check_run_files(run_dir)
    try:  # never blocks, never follows a link: the folder may hold what an answerer put there
        fd = os.open(run_dir / ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise RunError(f"{run_dir / '.lock'}: cannot open the run's lock file ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunError(f"{run_dir / '.lock'}: not a regular file; remove it, then resume")
    lock = os.fdopen(fd, "a")
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunError(f"{run_dir} is being run by another process") from None
        run.save()
        try:
            k = 1
            while True:
                progress.item(k, state.max_attempts, f"{loaded_spec.name}: attempt {k} (at most {state.max_attempts})")
                try:
                    verdict = run.attempt(k)
                except AwaitingAnswer as w:
                    state.status, state.answer_path = "waiting-for-answer", str(w.answer_path)
                    state.answers_awaited = [str(p) for p in w.answer_paths]
                    run.save()
                    break
                except LLMError as e:
                    state.status, state.error = "failed", str(e)
                    run.save()
                    break
                except VerifierError as e:
                    state.status, state.error = "verifier-error", str(e)
                    run.save()
                    break
                if verdict is not None and verdict.passed:
                    run.finish(k, verdict, force)
                    break
                if k >= state.max_attempts:
                    state.status = "out-of-attempts"
                    run.save()
                    break
                k += 1
        except BaseException as e:
            state.status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            state.error = f"{type(e).__name__}: {e}".rstrip(": ")
            run.save()
            raise
    finally:
        lock.close()
    return RunSummary(run_dir=run_dir, state=state)

"""What a ``generate`` request may do, decided before any work starts.

``coda-agent generate`` spends API tokens and GPU hours, so everything that can be refused
is refused first, with a message that says what to do: a run named where a spec belongs,
``--cmd``/``--model`` given to the wrong backend, ``--force`` with ``--no-accept``, a
resume of another spec's run (or of a committed record), no backend configured, an
anthropic run on a machine without a GPU (tokens for answers nothing could accept), a
spec from outside the workspace's library, and a new accepted kernel for a spec that has
one without ``--force``. A resumed run keeps the backend it started with and stays
``--no-accept`` if it started so; ``--force`` is never read from the run folder (the
answerer writes there in ``--llm manual`` mode): a resume must say it again.

:func:`prepare_generate` returns the :class:`GenerateRequest` to hand to
:func:`~coda_agent.agent.loop.generate`, or raises :class:`RequestError`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..verifier.spec import LoadedSpec, SpecError, resolve_spec
from .llm import NO_BACKEND_HELP, LLMError, default_backend_name, make_backend
from .run_folder import RunError, accepted_by, find_run, holds_run, load_run, resume_dir


class RequestError(Exception):
    """A request that cannot run; the message says why and what to do instead."""


@dataclass
class GenerateRequest:
    """The arguments of :func:`~coda_agent.agent.loop.generate` for one request."""

    loaded: LoadedSpec
    backend: Any
    resume: Path | None
    max_attempts: int | None
    accept_fn: Callable[..., Any] | None
    force: bool
    cpu_only: bool
    no_accept: bool
    candidates: int | None = None


def prepare_generate(
    root: Path,
    spec: str,
    *,
    llm: str | None,
    cmd: str | None,
    model: str | None,
    max_attempts: int | None,
    resume: str | None,
    cpu_only: bool,
    no_accept: bool,
    force: bool,
    allow_unconfined: bool,
    has_gpu: Callable[[], bool],
    warn: Callable[[str], None],
    candidates: int | None = None,
) -> GenerateRequest:
    """Check a ``generate`` request against the rules in the module docstring and build the
    backend. ``has_gpu`` is asked only without ``cpu_only``; ``warn`` receives the one
    warning a request can carry (answers on a machine without a GPU are checked, never
    accepted). Raises :class:`RequestError` (the first rule broken, in the order the
    user should fix them)."""
    if not (root / "kernel_specs" / spec).is_dir() and holds_run(find_run(root, spec)):
        raise RequestError(
            f"{spec} is a run, not a spec: continue it with "
            f"`coda-agent generate SPEC --resume {spec}` (SPEC: the run's spec, e.g. "
            f"{spec.rsplit('-', 1)[-1]})"
        )
    try:
        loaded = resolve_spec(root, spec)
    except SpecError as e:
        raise RequestError(str(e)) from None
    name, command = llm, cmd
    if command and name not in (None, "command"):
        raise RequestError(f"--cmd is for --llm command, not --llm {name}")
    if command and name is None:
        name = "command"
    if max_attempts is not None and max_attempts < 1:  # before any warning about this machine
        raise RequestError(f"--max-attempts {max_attempts}: expected an integer >= 1")
    if candidates is not None and candidates < 1:
        raise RequestError(f"--candidates {candidates}: expected an integer >= 1 (answers asked per attempt)")
    if force and no_accept:
        raise RequestError("--force replaces an accepted kernel and --no-accept never accepts: give one of them")
    try:
        resume_path = resume_dir(root, resume) if resume else None
    except RunError as e:
        raise RequestError(str(e)) from None
    if resume_path is not None:
        try:  # a resumed run keeps the backend it started with, and a --no-accept run stays one
            resumed = load_run(resume_path).state
        except Exception as e:  # noqa: BLE001 - reported as a request error
            raise RequestError(f"--resume {resume}: {e}") from None
        if resumed.spec != loaded.name:  # before any warning about this machine
            raise RequestError(f"--resume {resume}: a run of spec {resumed.spec!r}, not {loaded.name!r}")
        name = name or resumed.backend
        # the run's summary says so; run.json could have it cleared, but a resume that accepts
        # still verifies in this process and never replaces an accepted kernel without --force
        no_accept = no_accept or resumed.no_accept
        # --force is never read from the run folder: the answerer writes there in --llm manual
        # mode (tests/test_cli.py::test_force_is_never_read_from_the_run_folder)
    name = name or default_backend_name()
    if name is None:
        raise RequestError(NO_BACKEND_HELP)
    if name == "command" and not command:
        again = " (run.json does not keep it: give the resumed run its command again)" if resume else ""
        raise RequestError(f'--llm command needs the command: --llm command --cmd "CMD"{again}')
    if model and name != "anthropic":
        raise RequestError(f"--model is for --llm anthropic; --llm {name} takes the model its answerer uses")
    try:  # first: a missing API key is the first thing to fix
        backend = make_backend(name, model=model, command=command)
    except LLMError as e:
        raise RequestError(str(e)) from None
    gpu = cpu_only or has_gpu()  # (cpu_only: never asked)
    if not gpu:
        if name == "anthropic":
            raise RequestError(
                "no CUDA GPU here: every answer would get the static and sm_90a compile stages only "
                "and none could be accepted, while each attempt spends API tokens. Run on a Hopper "
                "GPU, or pass --cpu-only to check answers without verifying them"
            )
        warn(
            "no CUDA GPU here: answers get the static and sm_90a compile stages only and cannot be "
            "accepted (as with --cpu-only); resume the run on a Hopper GPU to verify them"
        )
    accepted_dir = root / "generated_kernels" / loaded.name
    ours = resume_path is not None and resumed.accepted_path is not None and accepted_by(root, loaded.name, resume_path)
    if not (no_accept or cpu_only):
        from ..verifier.library.accept import outside_library

        why = outside_library(root, loaded)
        if why:
            raise RequestError(f"{why} (pass --no-accept to only verify)")
    if (accepted_dir / "manifest.json").exists() and gpu and not (force or no_accept or cpu_only or ours):
        # (ours: this run accepted that kernel; a resume to answer its lesson replaces nothing)
        # checked for resumed runs too: a run started on a CPU machine without --force would
        # otherwise verify and benchmark on the GPU, then end "accept refused"
        again = (
            (" (this run was started with --force; a resume must say it again: it is never read from the run folder)")
            if resume_path is not None and resumed.force
            else ""
        )
        raise RequestError(
            f"{loaded.name} is already accepted ({accepted_dir}); a new accepted kernel would not replace it. "
            f"Use --force to replace it (the old one moves to history/) or --no-accept to only verify{again}."
        )
    accept_fn = None
    if not no_accept:
        from ..verifier.library.accept import accept

        accept_fn = functools.partial(accept, allow_unconfined=allow_unconfined)
    return GenerateRequest(
        loaded=loaded,
        backend=backend,
        resume=resume_path,
        max_attempts=max_attempts,
        accept_fn=accept_fn,
        force=force,
        cpu_only=cpu_only,
        no_accept=no_accept,
        candidates=candidates,
    )

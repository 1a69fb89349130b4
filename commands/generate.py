"""The LLM's side: ``coda-agent generate SPEC`` (spec -> LLM -> verifier -> (repair)* ->
accepted kernel) and ``coda-agent prompt SPEC`` (exactly what the model would receive).

Rules:

* ``generate`` checks its whole request (:func:`~coda_agent.agent.session.prepare_generate`)
  and ``--ray`` before any answer is paid for; the run itself is
  :func:`~coda_agent.agent.loop.generate`, and this module only prints its summary.
* Exit code 2 when a run ends ``verifier-error`` or ``failed`` (the verifier, the LLM
  backend or acceptance failed, not the candidate), as ``verify`` does; 1 when it ran out of
  attempts; 0 when it was accepted, passed, or waits for a manual answer.
"""

from __future__ import annotations

from rich.markup import escape

from ..verifier import workspace
from . import common
from .common import FAILED, OK, USAGE, UsageError, console, err, output_flag, spec_arg, workspace_root


def cmd_generate(args) -> int:
    """The main job: spec -> LLM -> verifier -> (repair)* -> accepted kernel."""
    from ..agent.loop import RunError, generate
    from ..agent.session import RequestError, prepare_generate

    root = workspace_root(args)
    try:
        req = prepare_generate(
            root,
            args.spec,
            llm=args.llm,
            cmd=args.cmd,
            model=args.model,
            max_attempts=args.max_attempts,
            resume=args.resume,
            cpu_only=args.cpu_only,
            no_accept=args.no_accept,
            force=args.force,
            allow_unconfined=args.allow_unconfined,
            has_gpu=common.has_gpu,
            warn=lambda msg: err.print(f"[yellow]{msg}[/]"),
            candidates=args.candidates,
        )
    except RequestError as e:
        raise UsageError(str(e)) from None
    from ..agent.loop import default_verifier

    try:  # --ray is checked before any answer is paid for
        verifier = default_verifier(cpu_only=req.cpu_only, ray=args.ray)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        summary = generate(
            req.loaded,
            root=root,
            backend=req.backend,
            verifier=verifier,
            candidates=req.candidates,
            max_attempts=req.max_attempts,
            resume=req.resume,
            accept_fn=req.accept_fn,
            force=req.force,
            cpu_only=req.cpu_only,
            no_accept=req.no_accept,
        )
    except RunError as e:
        raise UsageError(str(e)) from None
    console.print(summary.render(), markup=False, highlight=False)
    ok = {"accepted", "passed", "waiting-for-answer"} | ({"passed-cpu-only"} if args.cpu_only else set())
    if summary.status in ("verifier-error", "failed"):
        # the verifier, the LLM backend (a broken --cmd, an API error) or acceptance failed, not the
        # candidate: as `verify`, so that a script can tell the two apart
        return USAGE
    return OK if summary.status in ok else FAILED


def cmd_prompt(args) -> int:
    """Print exactly what the model would receive for SPEC, with a token estimate."""
    from ..agent.render import render_prompt

    root = workspace_root(args)
    loaded = spec_arg(root, args.spec)
    out = output_flag(workspace.out_file, args.out, "--out", root, kind="prompt")
    prompt = render_prompt(loaded, root)
    text = prompt.as_text()
    if args.out:
        output_flag(workspace.write_out, out, text, "--out")
        err.print(escape(f"wrote {args.out}"))
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    err.print(f"~{prompt.estimate_tokens()} tokens (estimate: characters / 4); prompt sha256 {prompt.sha256()[:12]}")
    return OK

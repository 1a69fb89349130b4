"""``coda-agent verify SPEC CANDIDATE...``: every verifier stage on each candidate file.

One file: its verdict table, ``--json`` its verdict, ``--accept`` writes
``generated_kernels/<spec>/``. Several files: verified side by side through the scheduler
(every visible GPU, or a Ray cluster with ``--ray``), one row each; ``--accept`` takes one.

Rules:

* Everything that would make the run pointless is refused before it starts: swapped
  arguments, a missing or repeated file, an ``--accept`` that no machine here could honour
  (no GPU, ``--cpu-only``, ``--no-bench``) or that ``accept`` would refuse at the end (a spec
  from outside this workspace's ``kernel_specs/``).
* Exit code 2 when the verifier or the machine failed (``verifier_error``), 1 when a
  candidate was rejected or not verified as asked, 0 otherwise.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from ..verifier import tables, workspace
from . import common
from .common import FAILED, OK, USAGE, UsageError, console, err, output_flag, spec_arg, workspace_root


def cmd_verify(args) -> int:
    """Run every verifier stage on each CANDIDATE.py (several: side by side through the
    scheduler); --accept writes generated_kernels/ (one file)."""
    root = workspace_root(args)
    if args.spec.endswith(".py") and Path(args.spec).is_file():
        raise UsageError(
            f"SPEC {args.spec!r} is a Python file: the usage is `coda-agent verify SPEC CANDIDATE`, "
            "the spec's name first (arguments swapped?)"
        )
    loaded = spec_arg(root, args.spec)
    cands = [Path(c) for c in args.candidate]
    if len(cands) > 1 and args.accept:
        raise UsageError(
            f"--accept takes one candidate file, got {len(cands)}: verify them, then accept the one chosen"
        )
    json_out = output_flag(workspace.out_file, args.json, "--json", root, keep=tuple(cands), kind="verdict")
    for cand in cands:
        if cand.is_dir():
            raise UsageError(
                f"candidate {cand} is a folder; give the candidate module's .py file (e.g. {cand / 'kernel.py'})"
            )
        if not cand.is_file():
            raise UsageError(f"candidate file not found: {cand}")
    twice = sorted({str(c) for c in cands if sum(c.resolve() == d.resolve() for d in cands) > 1})
    if twice:
        raise UsageError(f"candidate file given twice: {', '.join(twice)}")
    if args.allow_unconfined and not args.accept:
        raise UsageError("--allow-unconfined only applies with --accept (it lets an unconfined run be accepted)")
    if args.force and not args.accept:
        raise UsageError("--force only applies with --accept (it replaces an accepted kernel)")
    if args.accept and (args.cpu_only or args.no_bench or not common.has_gpu()):
        why = "--cpu-only" if args.cpu_only else "--no-bench" if args.no_bench else "no CUDA GPU here"
        raise UsageError(
            f"--accept needs every stage on a Hopper GPU, benchmark included ({why}): "
            "nothing would be accepted, so nothing was run"
        )
    _check_library_spec(root, loaded, "pass it by name, or drop --accept", when=args.accept)
    from ..verifier.schedule import Job

    sched = _scheduler(args, several=len(cands) > 1)
    jobs = [Job(loaded, c, bench=not args.no_bench, label=c.name) for c in cands]
    verdicts = sched.verify_many(jobs)
    if len(cands) > 1:
        return _verify_many_result(args, cands, verdicts, json_out, sched.describe())
    verdict = verdicts[0]
    cand = cands[0]
    tables.print_verdict(console, verdict)
    if json_out is not None:
        output_flag(workspace.write_out, json_out, verdict.to_json(outcome=True))
    broken = verdict.verifier_error
    if broken is not None:
        err.print(
            f"verifier error in the {broken.stage} stage: the verifier or this machine failed, not the "
            f"candidate (what failed: the {broken.stage} row above)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return USAGE
    if not verdict.passed:
        return FAILED
    if not verdict.done_as_asked(cpu_only=args.cpu_only, bench=not args.no_bench):
        err.print(
            "not verified: the benchmark stage did not pass (see its row above)"
            if verdict.gpu_correct
            else "not verified: the GPU stages did not run (no sm_90 GPU here); "
            "use --cpu-only for static + compile only"
        )
        return FAILED
    if args.accept:
        from ..verifier.library.accept import AcceptError, accept

        try:
            dest = accept(
                loaded,
                cand,
                verdict,
                root=root,
                force=args.force,
                allow_unconfined=args.allow_unconfined,
                provenance={"backend": "human", "source": str(cand)},
            )
        except AcceptError as e:
            kept = f" The verdict is in {args.json}." if args.json else " (--json FILE keeps the verdict.)"
            raise UsageError(f"{e}.{kept}") from None
        console.print(f"[green]accepted[/] -> {escape(str(dest))}")
    return OK


def _scheduler(args, *, several: bool):
    """The scheduler of a command: every visible GPU, or a Ray cluster with ``--ray``
    (:func:`~coda_agent.verifier.schedule.make_scheduler`); a bad ``--ray`` is a usage error."""
    from ..verifier.schedule import make_scheduler

    try:
        return make_scheduler(
            ray=getattr(args, "ray", None), cpu_only=bool(getattr(args, "cpu_only", False)), screen=several
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def _verify_many_result(args, cands: list[Path], verdicts: list, json_out, where: str) -> int:
    """Print and write the verdicts of ``verify SPEC FILE FILE ...``; the exit status: 2 when
    any verdict is a verifier error, 1 when any file was not verified as asked, else 0."""
    import json

    console.print(tables.verdicts_table([(str(c), v) for c, v in zip(cands, verdicts, strict=True)], where))
    for c, v in zip(cands, verdicts, strict=True):
        failed = v.failed_stage
        for f in (failed.findings if failed is not None else [])[:3]:
            console.print(escape(f"  {c}: [{f.kind}] {f.message.splitlines()[0] if f.message else ''}"[:300]))
    if json_out is not None:
        items = [dict(json.loads(v.to_json(outcome=True)), file=str(c)) for c, v in zip(cands, verdicts, strict=True)]
        output_flag(workspace.write_out, json_out, json.dumps(items, indent=2, sort_keys=True) + "\n")
    if any(v.verifier_error is not None for v in verdicts):
        err.print("verifier error for some file: the verifier or this machine failed, not the candidate (rows above)")
        return USAGE
    ok = all(v.done_as_asked(cpu_only=args.cpu_only, bench=not args.no_bench) for v in verdicts)
    return OK if ok else FAILED


def _check_library_spec(root: Path, loaded, hint: str, *, when: bool) -> None:
    """Refuse up front (``when`` a kernel would be accepted) what ``accept`` would refuse
    only after the whole GPU run: a spec from outside this workspace's kernel_specs/."""
    from ..verifier.library.accept import outside_library

    why = outside_library(root, loaded) if when else None
    if why:
        raise UsageError(f"{why} ({hint})")

"""coda-agent command line: the only module that prints.

Every command is a thin shell over a pure function elsewhere (agent.loop, verifier.*),
rendered with rich. Exit codes are part of the interface (CI and scripts rely on them):

* 0 -- ok;
* 1 -- a check failed (a candidate rejected, a regression, a run out of attempts);
* 2 -- usage or input error (unknown spec, malformed spec file, missing file, refused
  overwrite, no LLM backend configured), or a verifier error (the verifier or the machine
  failed, not the candidate: ``verify``, and ``generate`` whose run ends ``verifier-error``
  or ``failed``: the LLM backend or acceptance failed).

argparse (stdlib) is used rather than typer/click: the surface is small, and it keeps
the dependency list to what the design card names.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path
from typing import Callable, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from .verifier import tables, workspace

T = TypeVar("T")

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default, and
# printed lines are never wrapped there, so a command in a hint can be copied from a log.
console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=not sys.stdout.isatty())
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160, soft_wrap=not sys.stderr.isatty())

OK, FAILED, USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit code 2."""


# --------------------------------------------------------------------------- helpers


def _root(args) -> Path:
    try:
        return workspace.find_root(getattr(args, "root", None))
    except workspace.WorkspaceError as e:
        raise UsageError(str(e)) from None


def _spec(root: Path, name_or_path: str):
    """Resolve SPEC (a name under kernel_specs/ or a path) to a LoadedSpec."""
    from .verifier.spec import SpecError, resolve_spec

    try:
        return resolve_spec(root, name_or_path)
    except SpecError as e:
        raise UsageError(str(e)) from None


# --------------------------------------------------------------------------- commands


def cmd_list(args) -> int:
    """Specs and accepted kernels with their status."""
    from .verifier.library.catalogue import catalogue

    root = _root(args)
    rows = catalogue(root)
    for r in rows:
        if r.status == "invalid":  # whole; the table shows its start
            err.print(f"error: {r.detail}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    console.print(tables.catalogue_table(root, rows))
    return USAGE if any(r.problem for r in rows) else OK


def _output(check: Callable[..., T], *args, **kwargs) -> T:
    """``check(*args, **kwargs)``, one of the workspace's output-flag checks
    (:mod:`~coda_agent.verifier.workspace`); a path it refuses is a usage error."""
    try:
        return check(*args, **kwargs)
    except workspace.OutputPathError as e:
        raise UsageError(str(e)) from None


def cmd_prompt(args) -> int:
    """Print exactly what the model would receive for SPEC, with a token estimate."""
    from .agent.render import render_prompt

    root = _root(args)
    loaded = _spec(root, args.spec)
    out = _output(workspace.out_file, args.out, "--out", root, kind="prompt")
    prompt = render_prompt(loaded, root)
    text = prompt.as_text()
    if args.out:
        _output(workspace.write_out, out, text, "--out")
        err.print(escape(f"wrote {args.out}"))
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    err.print(f"~{prompt.estimate_tokens()} tokens (estimate: characters / 4); prompt sha256 {prompt.sha256()[:12]}")
    return OK


def cmd_verify(args) -> int:
    """Run every verifier stage on each CANDIDATE.py (several: side by side through the
    scheduler); --accept writes generated_kernels/ (one file)."""
    root = _root(args)
    if args.spec.endswith(".py") and Path(args.spec).is_file():
        raise UsageError(
            f"SPEC {args.spec!r} is a Python file: the usage is `coda-agent verify SPEC CANDIDATE`, "
            "the spec's name first (arguments swapped?)"
        )
    loaded = _spec(root, args.spec)
    cands = [Path(c) for c in args.candidate]
    if len(cands) > 1 and args.accept:
        raise UsageError(
            f"--accept takes one candidate file, got {len(cands)}: verify them, then accept the one chosen"
        )
    json_out = _output(workspace.out_file, args.json, "--json", root, keep=tuple(cands), kind="verdict")
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
    if args.accept and (args.cpu_only or args.no_bench or not _has_gpu()):
        why = "--cpu-only" if args.cpu_only else "--no-bench" if args.no_bench else "no CUDA GPU here"
        raise UsageError(
            f"--accept needs every stage on a Hopper GPU, benchmark included ({why}): "
            "nothing would be accepted, so nothing was run"
        )
    _check_library_spec(root, loaded, "pass it by name, or drop --accept", when=args.accept)
    from .verifier.schedule import Job

    sched = _scheduler(args, several=len(cands) > 1)
    jobs = [Job(loaded, c, bench=not args.no_bench, label=c.name) for c in cands]
    verdicts = sched.verify_many(jobs)
    if len(cands) > 1:
        return _verify_many_result(args, cands, verdicts, json_out, sched.describe())
    verdict = verdicts[0]
    cand = cands[0]
    tables.print_verdict(console, verdict)
    if json_out is not None:
        _output(workspace.write_out, json_out, verdict.to_json(outcome=True))
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
        from .verifier.library.accept import AcceptError, accept

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
    from .verifier.schedule import make_scheduler

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
        _output(workspace.write_out, json_out, json.dumps(items, indent=2, sort_keys=True) + "\n")
    if any(v.verifier_error is not None for v in verdicts):
        err.print("verifier error for some file: the verifier or this machine failed, not the candidate (rows above)")
        return USAGE
    ok = all(v.done_as_asked(cpu_only=args.cpu_only, bench=not args.no_bench) for v in verdicts)
    return OK if ok else FAILED


def _has_gpu() -> bool:
    """Whether torch sees a CUDA device (commands that verify or measure need one)."""
    from .verifier.gpu import environment

    return environment.cuda_available()


def _check_library_spec(root: Path, loaded, hint: str, *, when: bool) -> None:
    """Refuse up front (``when`` a kernel would be accepted) what ``accept`` would refuse
    only after the whole GPU run: a spec from outside this workspace's kernel_specs/."""
    from .verifier.library.accept import outside_library

    why = outside_library(root, loaded) if when else None
    if why:
        raise UsageError(f"{why} ({hint})")


def cmd_generate(args) -> int:
    """The main job: spec -> LLM -> verifier -> (repair)* -> accepted kernel."""
    from .agent.loop import RunError, generate
    from .agent.session import RequestError, prepare_generate

    root = _root(args)
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
            has_gpu=_has_gpu,
            warn=lambda msg: err.print(f"[yellow]{msg}[/]"),
            candidates=args.candidates,
        )
    except RequestError as e:
        raise UsageError(str(e)) from None
    from .agent.loop import default_verifier

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


def _measuring_flags(args) -> tuple[tuple[str, object], ...]:
    """(flag, given) for the bench flags that only shape a measurement."""
    return ("--shape", args.shape), ("--repeat", args.repeat != 1), ("--jobs", args.jobs)


def _refuse_ignored(what: str, *flags: tuple[str, object]) -> None:
    """UsageError naming the ``(flag, given)`` pairs that were given although ``what`` (a
    sentence on the mode) would ignore them."""
    ignored = [f for f, given in flags if given]
    if ignored:
        raise UsageError(f"{what}, so {', '.join(ignored)} would be ignored")


def cmd_bench(args) -> int:
    """Benchmark accepted kernels (GPU) and write benchmarks/results/<date>-<gpu>.md (+ PNG)."""
    from .verifier.library.bench import bench_kernels

    root = _root(args)
    out_dir = _output(workspace.out_dir, root, args.out)
    if args.repeat < 1:
        raise UsageError(f"bench --repeat {args.repeat}: expected an integer >= 1")
    if args.merge_from is not None and args.from_verdicts is None:
        raise UsageError(
            "bench --merge-from SRC needs --from-verdicts DIR: the kept folder to merge SRC's verdicts into"
        )
    if args.force and args.from_verdicts is None and not args.from_manifests:
        raise UsageError(
            "bench --force only applies with --from-verdicts DIR or --from-manifests (it replaces a page "
            "bench did not write)"
        )
    if args.from_verdicts is not None:
        vdir = args.from_verdicts
        # a new user's `--from-verdicts DIR swiglu_bwd` rewrote the page of every kernel
        _refuse_ignored(
            f"bench --from-verdicts measures nothing and renders every kernel kept in {vdir}",
            ("SPEC names", args.spec),
            ("--all", args.all),
            ("--from-manifests", args.from_manifests),
            *_measuring_flags(args),
        )
        if args.merge_from is not None:  # SRC's verdicts are copied into DIR
            _output(workspace.check_out_target, root, vdir, "--from-verdicts", str(vdir))
        if out_dir is None:  # the page goes beside DIR
            _output(workspace.check_out_target, root, vdir.parent / f"{vdir.name}.md", "--from-verdicts", str(vdir))
        from .verifier.library.bench import page_from_kept
        from .verifier.library.kept import check_page, merge_kept

        try:
            if args.merge_from is not None:
                if vdir.is_dir():  # page_from_kept checks too, but only after the merge
                    check_page(vdir, out_dir, args.force)
                for line in merge_kept(root, args.merge_from, vdir):
                    console.print(escape(line))
            report = page_from_kept(root, vdir, out_dir=out_dir, force=args.force)
        except ValueError as e:
            raise UsageError(str(e)) from None
        for line in report.notes:
            console.print(escape(f"left off the page: {line}"), style="yellow")
        if report.markdown_path is None:
            raise UsageError(
                f"{args.from_verdicts}: no kept verdict of a current accepted kernel with a passing bench"
                + (
                    f" ({len(report.notes)} file(s) left off, listed above)"
                    if report.notes
                    else " (no *.json verdict files in it)"
                )
            )
        stale = report.markdown_path.with_suffix(".png")
        console.print(
            escape(
                f"wrote {report.markdown_path}"
                + (
                    f" and {report.plot_path}"
                    if report.plot_path
                    else " (no plot: matplotlib is not installed; pip install -e '.[bench]'"
                    + (f"; {stale.name} beside the page is from an earlier rendering)" if stale.exists() else ")")
                )
            )
        )
        return OK
    if not args.all and not args.spec:
        raise UsageError("bench needs SPEC ... or --all")
    if args.all and args.spec:
        raise UsageError(f"bench: give SPEC names or --all, not both (got --all and {' '.join(args.spec)})")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"bench --jobs {args.jobs}: expected an integer >= 1")
    if args.from_manifests:
        if not args.all:
            # the manifests page has one name per day and GPU: a subset would replace it with fewer sections
            raise UsageError("bench --from-manifests renders the page of every accepted kernel: use --all")
        _refuse_ignored("bench --from-manifests measures nothing", *_measuring_flags(args))
    if args.spec:  # a typo is named before "no GPU" (a new user read that as the problem)
        from .verifier.library.accept import accepted_names

        try:
            accepted_names(root, list(args.spec))
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not args.from_manifests and not _has_gpu():
        raise UsageError(
            "bench measures on a Hopper GPU and there is no CUDA GPU here; without one, "
            "--from-verdicts DIR re-renders a measured page and --from-manifests writes one from "
            "the numbers recorded at acceptance"
        )
    try:
        report = bench_kernels(
            root,
            None if args.all else list(args.spec),
            out_dir=out_dir,
            bench_shapes=args.shape or None,
            from_manifests=args.from_manifests,
            jobs=args.jobs,
            repeat=args.repeat,
            force=args.force,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    for verdict in report.verdicts.values():
        tables.print_verdict(console, verdict, recorded=args.from_manifests)
    if report.schedule:
        console.print(escape(f"GPU stages: {len(report.verdicts)} kernel(s) over {report.schedule}"))
    for line in report.notes:
        console.print(escape(f"kept verdicts: {line}"))
    if report.markdown_path:
        console.print(
            escape(
                f"wrote {report.markdown_path}"
                + (
                    f" and {report.plot_path}"
                    if report.plot_path
                    else " (no plot: matplotlib is not installed; pip install -e '.[bench]')"
                )
            )
        )
    else:
        console.print("[yellow]nothing measured (benchmarks need a Hopper GPU); no results written[/]")
    return OK if report.ok else FAILED


def cmd_regress(args) -> int:
    from .verifier.library.regress import regress

    root = _root(args)
    json_out = _output(workspace.out_file, args.json, "--json", root, kind="regress")
    if args.cpu_only and args.verdicts:
        raise UsageError(
            "regress --cpu-only checks integrity, static and compile only; --verdicts judges what a GPU "
            "measured: give one of them"
        )
    if args.shape and (args.cpu_only or args.verdicts):
        raise UsageError(
            "regress --shape picks the benchmark shapes to measure; "
            + ("--cpu-only measures none" if args.cpu_only else "--verdicts judges what was measured")
        )
    if args.kernels:  # a misspelt name first, as bench does (before the no-GPU refusal)
        from .verifier.library.accept import accepted_names

        try:
            accepted_names(root, args.kernels)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not (args.cpu_only or args.verdicts) and not _has_gpu():
        raise UsageError(
            "regress checks correctness and speed on a Hopper GPU and there is no CUDA GPU here; "
            "use --cpu-only (integrity, static, sm_90a compile) or --verdicts DIR (what bench measured)"
        )
    try:
        rep = regress(
            root,
            kernels=args.kernels or None,
            cpu_only=args.cpu_only,
            tolerance=args.tolerance,
            bench_shapes=args.shape or None,
            verdicts=args.verdicts,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    console.print(tables.regress_table(rep, cpu_only=args.cpu_only, verdicts=args.verdicts, tolerance=args.tolerance))
    if rep.schedule:
        console.print(escape(f"GPU stages: {len(rep.rows)} kernel(s) over {rep.schedule}"))
    if json_out is not None:
        _output(workspace.write_out, json_out, rep.to_json())
    return OK if rep.ok else FAILED


def cmd_tricks(args) -> int:
    from .agent.tricks import TrickError, add_from_run, add_trick

    root = _root(args)
    try:
        return _tricks_add(root, args, add_from_run, add_trick)
    except TrickError as e:
        raise UsageError(str(e)) from None


def _tricks_add(root, args, add_from_run, add_trick) -> int:
    if args.from_run and args.text:
        raise UsageError("tricks add: give TEXT or --from-run RUN, not both")
    if args.unverified and not args.from_run:
        raise UsageError("--unverified only applies with --from-run RUN")
    if args.from_run:
        from .agent.run_folder import find_run, holds_run

        run = find_run(root, args.from_run)
        if not holds_run(run):
            raise UsageError(
                f"--from-run {args.from_run}: no such run folder (a path, or a name under {root / 'runs'})"
            )
        entry = add_from_run(root, run, unverified=args.unverified)
    elif args.text:
        if "\n" in args.text.strip():
            raise UsageError("a trick is one line (symptom -> fix); edit tricks_log.md by hand for longer notes")
        if args.kernel and args.kernel != "general" and not (root / "kernel_specs" / args.kernel).is_dir():
            raise UsageError(f"--kernel {args.kernel!r}: no such spec under kernel_specs/ (or use 'general')")
        entry = add_trick(root, args.text.strip(), kernel=args.kernel)
    else:
        raise UsageError('tricks add needs "TEXT" or --from-run RUN')
    console.print("appended to tricks_log.md:", getattr(entry, "raw", entry), markup=False, highlight=False)
    return OK


def cmd_review(args) -> int:
    from .verifier.library.accept import ManifestError
    from .verifier.library.review import review_text

    root = _root(args)
    loaded = _spec(root, args.spec)
    try:
        text = review_text(root, loaded)
    except (FileNotFoundError, ManifestError) as e:  # no accepted kernel to review, or a broken manifest
        raise UsageError(str(e)) from None
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    return OK


# --------------------------------------------------------------------------- parser


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction >= 0 such as 0.10, got {text!r}") from None
    if not 0 <= v < 10:
        raise argparse.ArgumentTypeError(f"expected a fraction >= 0 such as 0.10, got {text}")
    return v


def _version() -> str:
    """The installed distribution's version ("unknown" when run from a checkout without one)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coda-agent")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _quiet_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress display (it is shown on stderr only when stderr is a terminal)",
    )


def _ray_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the GPU stages as Ray tasks on a Ray cluster (an address such as ray://host:10001, or "
        "auto: the cluster this machine runs); needs the ray extra",
    )


def _reporter(args) -> contextlib.AbstractContextManager:
    """The progress display for this command: a rich live display on stderr when stderr is a
    terminal and ``--quiet`` was not given; nothing otherwise."""
    from .verifier import progress

    if getattr(args, "quiet", True) or not err.is_terminal:
        return progress.reporting(None)
    stack = contextlib.ExitStack()
    stack.enter_context(progress.reporting(stack.enter_context(progress.RichReporter(err))))
    return stack


def cmd_tune(args) -> int:
    """Tune accepted kernels' GEMM configs on the GPU (``verifier/tune/command.py``)."""
    import os

    from .verifier.tune.command import run_tune

    root = _root(args)
    try:
        results, table, page = run_tune(
            root,
            args.kernel,
            args.shape,
            args.space,
            args.jobs or os.cpu_count() or 1,
            args.out,
            progress=lambda m: console.print(escape(m)),
        )
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"tune: {e}") from None
    for r in results:
        for row in r.rows:
            console.print(
                escape(
                    f"{r.kernel} {row['shape']} {row['epilogue']}: default {row['default_ms']} ms, "
                    f"best {row['best_ms']} ms ({row['best_name']}), cuBLAS {row['cublas_ms']} ms, "
                    f"route {row.get('route')}"
                )
            )
        if r.status != "ok":
            console.print(escape(f"{r.kernel}: {r.status}: {r.note}"), style="red")
    console.print(escape(f"wrote {table} and {page}"))
    return OK if all(r.status == "ok" for r in results) else FAILED


def cmd_build(args) -> int:
    """Compile accepted kernels ahead of time into the kernel cache."""
    import os

    from .runtime.cache import cache_dir
    from .verifier.tune.command import run_build

    root = _root(args)
    try:
        done = run_build(root, args.kernel, args.shape, args.jobs or os.cpu_count() or 1, args.arch)
    except ValueError as e:
        raise UsageError(f"build: {e}") from None
    for d in done:
        line = f"{d.job.label}: {'ok' if d.ok else 'FAILED ' + d.error} ({d.seconds:.1f} s, {d.planned} variants)"
        console.print(escape(line), style=None if d.ok else "red")
    console.print(escape(f"kernel cache: {cache_dir()}"))
    return OK if all(d.ok for d in done) else FAILED


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coda-agent",
        description="An LLM writes fused GEMM-epilogue kernels (CODA); a verifier proves them "
        "correct and fast on Hopper before they enter generated_kernels/.",
    )
    p.add_argument("--root", help="workspace root (default: $CODA_ROOT or the nearest folder with kernel_specs/)")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="write a kernel for SPEC with an LLM, verify, repair, accept")
    g.add_argument("spec")
    g.add_argument(
        "--llm",
        choices=["anthropic", "manual", "command"],
        help="LLM backend (default: anthropic when ANTHROPIC_API_KEY is set)",
    )
    g.add_argument(
        "--cmd",
        metavar="CMD",
        help="for --llm command: shell command that reads the prompt on stdin and writes the answer",
    )
    g.add_argument("--model", help="model id for --llm anthropic (default: $CODA_MODEL or the built-in default)")
    g.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        help="attempts before giving up (default 5; a resumed run keeps its own unless given)",
    )
    g.add_argument(
        "--resume", metavar="RUN", help="continue a run: its folder, or its name under runs/ (e.g. after --llm manual)"
    )
    g.add_argument(
        "--candidates",
        type=int,
        default=None,
        metavar="N",
        help="answers asked per attempt (the same prompt, sampled N times), verified side by side; the "
        "fastest that passes is taken (default 1; a resumed run keeps its own unless given)",
    )
    _ray_flag(g)
    g.add_argument("--cpu-only", action="store_true", help="static + compile only (never accepts)")
    g.add_argument("--no-accept", action="store_true", help="verify but do not write generated_kernels/")
    g.add_argument("--force", action="store_true", help="replace an accepted kernel (old one kept in history/)")
    g.add_argument(
        "--allow-unconfined",
        action="store_true",
        help="accept even if the candidate ran without the Landlock confinement (recorded in the manifest)",
    )
    _quiet_flag(g)
    g.set_defaults(fn=cmd_generate)

    pr = sub.add_parser("prompt", help="print exactly what the model would receive for SPEC")
    pr.add_argument("spec")
    pr.add_argument("--out", help="write to a file instead of stdout")
    pr.set_defaults(fn=cmd_prompt)

    v = sub.add_parser("verify", help="run the verifier on candidate modules (several: side by side)")
    v.add_argument("spec")
    v.add_argument("candidate", nargs="+", help="candidate .py file(s): one verdict each")
    v.add_argument("--accept", action="store_true", help="on success, write generated_kernels/<spec>/")
    v.add_argument("--force", action="store_true", help="with --accept: replace an accepted kernel")
    v.add_argument(
        "--allow-unconfined",
        action="store_true",
        help="with --accept: accept even if the candidate ran unconfined (recorded in the manifest)",
    )
    v.add_argument("--cpu-only", action="store_true", help="static + sm_90a compile only (not verification)")
    v.add_argument("--no-bench", action="store_true", help="skip the benchmark stage")
    v.add_argument(
        "--json",
        metavar="FILE",
        help="also write the verdict as JSON to FILE, with outcome (gpu-verified, gpu-correct, "
        "cpu-checks-passed, rejected or verifier-error), passed, gpu_verified and failed_stage "
        "at the top level; several files: a JSON list of them, each with its file",
    )
    _ray_flag(v)
    _quiet_flag(v)
    v.set_defaults(fn=cmd_verify)

    b = sub.add_parser("bench", help="benchmark accepted kernels against their baselines (GPU)")
    b.add_argument("spec", nargs="*", help="accepted kernels to benchmark (or --all)")
    b.add_argument("--all", action="store_true", help="every accepted kernel under generated_kernels/")
    b.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="compile stages run at once before the GPU stages (default: half the cores, at most 8)",
    )
    b.add_argument("--out", help="results folder (default benchmarks/results)")
    b.add_argument("--shape", action="append", help="only this benchmark shape (repeatable), e.g. llama3-8b/M8192")
    b.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="verify and time every kernel N times (round-robin) and report per-shape medians "
        "over the runs, with each run's ratios (default 1)",
    )
    b.add_argument(
        "--from-manifests",
        action="store_true",
        help="measure nothing: write the results page from the numbers recorded at acceptance",
    )
    b.add_argument(
        "--from-verdicts",
        type=Path,
        default=None,
        metavar="DIR",
        help="measure nothing: rewrite the page of the verdicts a live bench kept in DIR "
        "(benchmarks/results/<date>-<gpu>/), e.g. after a kernel was put back",
    )
    b.add_argument(
        "--merge-from",
        type=Path,
        default=None,
        metavar="SRC",
        help="with --from-verdicts DIR: first fold the verdicts kept in SRC (another bench's "
        "<date>-<gpu>/ folder, e.g. copied back from the GPU machine) into DIR shape by shape, as a "
        "live bench into DIR would (shapes SRC did not measure are kept), then rewrite DIR's page",
    )
    b.add_argument(
        "--force",
        action="store_true",
        help="with --from-verdicts or --from-manifests: replace a page of that name that bench "
        "did not write (a hand-written record; refused otherwise)",
    )
    _quiet_flag(b)
    b.set_defaults(fn=cmd_bench)

    r = sub.add_parser(
        "regress", help="re-check every accepted kernel (integrity, static, compile; GPU: numerics, perf ratios)"
    )
    r.add_argument("kernels", nargs="*")
    r.add_argument(
        "--cpu-only",
        action="store_true",
        help="integrity, spec, static and sm_90a compile only (what CI runs; no numerics or speed)",
    )
    r.add_argument(
        "--tolerance",
        type=_fraction,
        default=0.10,
        help="allowed worsening of fused/bare_gemm (the only gating ratio), geometric mean over shapes "
        "(default 0.10; a single shape may worsen by twice that; host-bound shapes never gate)",
    )
    r.add_argument("--json", help="write the report as JSON")
    r.add_argument("--shape", action="append", help="GPU mode: benchmark only this spec shape (repeatable)")
    r.add_argument(
        "--verdicts",
        type=Path,
        default=None,
        help="GPU mode without measuring again: judge the verdicts `coda-agent bench` kept in this "
        "folder (benchmarks/results/<date>-<gpu>/)",
    )
    _quiet_flag(r)
    r.set_defaults(fn=cmd_regress)

    ls = sub.add_parser("list", help="specs and accepted kernels with status")
    ls.set_defaults(fn=cmd_list)

    t = sub.add_parser("tricks", help="the living tricks log")
    tsub = t.add_subparsers(dest="tricks_cmd", required=True, metavar="ACTION")
    ta = tsub.add_parser("add", help='append a dated entry: tricks add "..." [--kernel K] | --from-run RUN')
    ta.add_argument("text", nargs="?")
    ta.add_argument("--kernel", help="the spec the lesson is about (default: general)")
    ta.add_argument(
        "--from-run",
        metavar="RUN",
        help="append the lesson proposed in a run (after reading it); the "
        "run must be the one the library's kernel was accepted from, unless --unverified",
    )
    ta.add_argument(
        "--unverified",
        action="store_true",
        help="with --from-run: take a lesson no accepted kernel vouches for (a --no-accept run that "
        "passed, or a copied run folder), on your own reading of it",
    )
    ta.set_defaults(fn=cmd_tricks)

    rv = sub.add_parser("review", help="what a human reviewer needs: diff vs previous version, numbers, provenance")
    rv.add_argument("spec")
    rv.set_defaults(fn=cmd_review)

    from .verifier.tune.command import add_parsers

    add_parsers(sub, cmd_tune, cmd_build)
    return p


CANDIDATE_COMMANDS = ("generate", "verify", "bench", "regress")
"""The commands that run candidate or accepted kernel code in the verifier's workers."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coda-agent`` console script. Returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help -> 0, usage error -> 2
        return int(e.code or 0)
    if args.cmd in CANDIDATE_COMMANDS:
        from .verifier.confine.landlock import ENV_SWITCH, switched_off

        if switched_off():  # the verdict records it; the person at the console should see it too
            err.print(
                f"[yellow]warning: {ENV_SWITCH}=off: candidate code runs unconfined (no Landlock, no seccomp); "
                "for debugging only, and such a run is never accepted without --allow-unconfined[/]"
            )
    import threading

    sigs = (
        (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if threading.current_thread() is threading.main_thread() else ()
    )
    previous = {sig: signal.signal(sig, _interrupted) for sig in sigs}  # (handlers belong to the main thread)
    try:
        with _reporter(args):
            return args.fn(args)
    except UsageError as e:
        err.print(Text("error: ", style="red") + Text(str(e)), highlight=False, soft_wrap=True)  # one line, greppable
        return USAGE
    except KeyboardInterrupt as e:
        err.print("terminated" if isinstance(e, Terminated) else "interrupted")
        return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP, raised as a KeyboardInterrupt so that every cleanup written for Ctrl-C
    runs (a run records ``interrupted``, temporary folders go); ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupted(signum: int, frame: object) -> None:
    """Signal handler of the CLI: kill the verifier's workers and an ``--llm command`` first
    (each runs in its own session, so neither a terminal's Ctrl-C nor a SIGTERM reaches it,
    and they would run on unread), then raise (tests/test_cli.py's interrupt tests)."""
    from .verifier.confine.sandbox import kill_live_groups

    kill_live_groups()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


if __name__ == "__main__":
    sys.exit(main())

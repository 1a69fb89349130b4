"""coda-agent command line: the parser, ``main`` and signal handling.

The commands themselves are in ``commands/`` (one module per group; its ``__init__``
lists them), each a thin shell over a pure function elsewhere (``agent.*``,
``verifier.*``), rendered with rich; this module and they are the only ones that print.
Exit codes are part of the interface (CI and scripts rely on them):

* 0 -- ok;
* 1 -- a check failed (a candidate rejected, a regression, a run out of attempts);
* 2 -- usage or input error (unknown spec, malformed spec file, missing file, refused
  overwrite, no LLM backend configured), or a verifier error (the verifier or the machine
  failed, not the candidate: ``verify``, and ``generate`` whose run ends ``verifier-error``
  or ``failed``: the LLM backend or acceptance failed).

Rules: a command raises :class:`~coda_agent.commands.common.UsageError` for bad input and
``main`` prints it as one line (exit code 2); SIGINT, SIGTERM and SIGHUP kill the
verifier's workers and an ``--llm command`` before the cleanups of a Ctrl-C run.

argparse (stdlib) is used rather than typer/click: the surface is small, and it keeps
the dependency list to what the design card names.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from rich.text import Text

from .commands.bench import cmd_bench, cmd_regress
from .commands.common import USAGE, UsageError, err
from .commands.generate import cmd_generate, cmd_prompt
from .commands.library import cmd_list, cmd_review, cmd_tricks
from .commands.tune import cmd_build, cmd_tune
from .commands.verify import cmd_verify


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

"""Attempts to acceptance with N = 1 against N = 4 answers per attempt (``--candidates``).

For each spec and each N, ``--repeats`` fresh runs of the generate loop with the same model
backend (``--no-accept``: the library is never touched; the spec's own accepted kernel is
never in its prompt), each up to ``--max-attempts`` attempts. Per run: the outcome, the
attempt that passed, the answers paid for, tokens and wall time. The table gives, per spec
and N, how many runs passed, the mean attempts and answers to the pass, and the totals.

Needs a model backend and, for a real measurement, a Hopper GPU (every stage, benchmark
included: what acceptance needs). ``--cpu-only`` measures attempts to pass the static and
compile stages only (a weaker proxy; the table says so).

Usage, where one machine has both the model and the GPU::

    export ANTHROPIC_API_KEY=...        # or: --llm command --cmd "my-llm-cli --stdin"
    python benchmarks/best_of_n.py --out $OUT/best_of_n --specs swiglu_fwd,gemm_rmsnorm \\
        [--n 1,4] [--repeats 3] [--max-attempts 5] [--model MODEL] [--cpu-only]

A run folder that exists is continued (``--resume``), and one that ended (passed, accepted,
out of attempts) is only read, so the same command can alternate between two machines when
the GPU machine cannot reach the model: on the machine with the model,
``--llm anthropic --cpu-only`` answers every run's next attempt and runs the CPU stages
(a CPU-only pass ends that turn); on the GPU machine, ``--llm manual`` (the same ``--out``,
copied over) verifies those answers on the GPU and, for a failure, writes the next prompt
and waits. Repeat until no run is ``passed-cpu-only`` or ``waiting-for-answer``; the GPU
machine's table is the result. No answer is paid for twice (the loop's rule).

Writes ``best_of_n.json`` (every run) and ``best_of_n.md`` (the table); the runs' folders
are kept under ``<out>/runs/``. Cost: up to specs x sum(N) x repeats x max-attempts answers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


ENDED = ("passed", "accepted", "out-of-attempts")
"""Run statuses that are only read, never continued."""
PASSED = ("passed", "accepted")


def one_run(
    root: Path,
    spec: str,
    n: int,
    run_dir: Path,
    backend: Any,
    verifier: Any,
    max_attempts: int,
    cpu_only: bool = False,
) -> dict:
    """The record of the generate run of ``spec`` with ``n`` candidates per attempt in
    ``run_dir``: a new run, or the one there continued (``--resume``) unless it ended
    (:data:`ENDED`). ``passed_at_attempt``: the attempt that passed (every stage, or the
    CPU stages with ``cpu_only``), else None; ``wall_s``: LLM and verifier time summed over
    every attempt and resume."""
    from coda_agent.agent.loop import generate
    from coda_agent.agent.run_folder import RunSummary, load_run
    from coda_agent.verifier.spec import load_spec

    loaded = load_spec(root / "kernel_specs" / spec)
    if (run_dir / "run.json").is_file():
        s = load_run(run_dir)
        if s.status not in ENDED:
            s = generate(
                loaded, root=root, backend=backend, verifier=verifier, resume=run_dir, no_accept=True, cpu_only=cpu_only
            )
    else:
        s = generate(
            loaded,
            root=root,
            backend=backend,
            verifier=verifier,
            run_dir=run_dir,
            max_attempts=max_attempts,
            no_accept=True,
            candidates=n,
            cpu_only=cpu_only,
        )
    assert isinstance(s, RunSummary)
    ok = PASSED + (("passed-cpu-only",) if cpu_only else ())
    passed = next((a.k for a in s.attempts if a.passed), None) if s.status in ok else None
    used = [a for a in s.attempts if passed is None or a.k <= passed]
    return {
        "spec": spec,
        "n": n,
        "run_dir": str(run_dir),
        "status": s.status,
        "passed_at_attempt": passed,
        "attempts": len(s.attempts),
        "answers": sum(max(1, a.candidates) for a in used),
        "input_tokens": s.usage.input_tokens,
        "output_tokens": s.usage.output_tokens,
        "wall_s": round(sum(a.wall_s for a in s.attempts), 1),
        "error": s.state.error,
    }


def summarize(runs: list[dict], cpu_only: bool) -> str:
    """The Markdown table of ``runs`` (per spec and N)."""
    goal = "pass the static and compile stages (CPU-only proxy)" if cpu_only else "pass every stage on the GPU"
    lines = [
        f"Attempts to {goal}, per spec and answers per attempt (N)",
        "",
        "| spec | N | runs | passed | mean attempts to pass | mean answers to pass | tokens in/out | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["spec"], r["n"]) for r in runs})
    for spec, n in keys:
        rs = [r for r in runs if (r["spec"], r["n"]) == (spec, n)]
        ok = [r for r in rs if r["passed_at_attempt"] is not None]
        att = f"{statistics.mean(r['passed_at_attempt'] for r in ok):.2f}" if ok else "-"
        ans = f"{statistics.mean(r['answers'] for r in ok):.1f}" if ok else "-"
        tok = f"{sum(r['input_tokens'] for r in rs)}/{sum(r['output_tokens'] for r in rs)}"
        lines.append(
            f"| {spec} | {n} | {len(rs)} | {len(ok)} | {att} | {ans} | {tok} | {sum(r['wall_s'] for r in rs):.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--specs", default="swiglu_fwd,gemm_rmsnorm", help="comma-separated spec names")
    ap.add_argument("--n", default="1,4", help="answers per attempt to compare, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="runs per spec and N")
    ap.add_argument("--max-attempts", type=int, default=5)
    ap.add_argument(
        "--llm",
        choices=["anthropic", "command", "manual"],
        default=None,
        help="manual: the GPU machine's turn of the two-machine protocol (see the module docstring)",
    )
    ap.add_argument("--cmd", help="for --llm command: the command that reads the prompt on stdin")
    ap.add_argument("--model", help="for --llm anthropic")
    ap.add_argument("--cpu-only", action="store_true", help="static + compile only (a proxy; no GPU needed)")
    ap.add_argument("--ray", help="run the GPU stages on a Ray cluster (an address, or auto)")
    a = ap.parse_args(argv)
    from coda_agent.agent.llm import LLMError, default_backend_name, make_backend
    from coda_agent.agent.loop import default_verifier

    name = a.llm or ("command" if a.cmd else default_backend_name())
    try:
        backend = make_backend(name, command=a.cmd, model=a.model)
    except LLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verifier = default_verifier(cpu_only=a.cpu_only, ray=a.ray)
    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for spec in [s for s in a.specs.split(",") if s]:
        for n in [int(x) for x in a.n.split(",")]:
            for i in range(a.repeats):
                run_dir = a.out / "runs" / f"{spec}-n{n}-r{i + 1}"
                runs.append(one_run(ROOT, spec, n, run_dir, backend, verifier, a.max_attempts, a.cpu_only))
                (a.out / "best_of_n.json").write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n")
                print(json.dumps(runs[-1], sort_keys=True), flush=True)
    text = summarize(runs, a.cpu_only)
    (a.out / "best_of_n.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-verify every accepted kernel under the verifier's current rules (GPU; no benchmark).

Runs the whole pipeline but the benchmark (static, compile, correctness and gradients with
the secret coverage cases) on each ``generated_kernels/<name>/kernel.py`` against its spec,
``--jobs`` kernels at a time, keeps each verdict as ``OUT/<name>.json`` and prints a table:
outcome, the failed stage and its first finding, the worst ratio per numerics rule (over
the correctness and gradients stages; 1.0 is the bound), and the seconds the workers
spent on the secret coverage cases against all correctness trials (the cost of coverage)::

    python benchmarks/reverify.py --out OUT [--jobs 3] [KERNEL ...]

A kernel that fails is regenerated through the agent loop, never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ("max_abs", "elementwise", "quantiles")


def _worst_rules(verdict) -> dict[str, float]:
    worst: dict[str, float] = {}
    for st in verdict.stages:
        for per in (st.metrics.get("trials") or {}).values():
            for m in per.values():
                for rule, ratio in (m.get("rules") or {}).items():
                    if isinstance(ratio, (int, float)):
                        worst[rule] = max(worst.get(rule, 0.0), float(ratio))
    return worst


def _row(name: str, verdict, wall: float) -> dict:
    failed = verdict.failed_stage
    corr = verdict.stage("correctness")
    m = corr.metrics if corr is not None else {}
    cov, alltr = m.get("coverage_s") or {}, m.get("trials_s") or {}
    first = failed.findings[0] if failed is not None and failed.findings else None
    return {
        "kernel": name,
        "outcome": verdict.outcome,
        "wall_s": round(wall, 1),
        "failed_stage": failed.stage if failed else None,
        "finding": (f"[{first.kind}] {first.case or ''}: {first.message[:400]}" if first else None),
        "worst": _worst_rules(verdict),
        "coverage_s": cov,
        "trials_s": alltr,
        "cases": len(m.get("cases") or []),
    }


def main(argv: list[str] | None = None) -> int:
    from coda_agent.verifier.pipeline import verify
    from coda_agent.verifier.spec import load_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="*", help="accepted kernels (default: all)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the verdicts and table.md")
    ap.add_argument("--jobs", type=int, default=3)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    names = a.kernels or sorted(p.parent.name for p in (ROOT / "generated_kernels").glob("*/kernel.py"))

    def one(name: str) -> dict:
        t0 = time.monotonic()
        man = json.loads((ROOT / "generated_kernels" / name / "manifest.json").read_text())
        loaded = load_spec(ROOT / "kernel_specs" / man.get("spec", name))
        v = verify(loaded, ROOT / "generated_kernels" / name / "kernel.py", bench=False)
        (a.out / f"{name}.json").write_text(v.to_json(outcome=True))
        row = _row(name, v, time.monotonic() - t0)
        print(f"{name}: {row['outcome']} ({row['wall_s']} s)", file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        rows = list(ex.map(one, names))
    lines = [
        "| kernel | outcome | "
        + " | ".join(f"worst {r}" for r in RULES)
        + " | cases | coverage s (cand / ref) | all trials s (cand / ref) | wall s | first finding |",
        "|---|---|" + "---|" * len(RULES) + "---|---|---|---|---|",
    ]
    for r in rows:
        w = r["worst"]
        cov, tr = r["coverage_s"], r["trials_s"]
        lines.append(
            f"| {r['kernel']} | {r['outcome']} | "
            + " | ".join(f"{w.get(k, 0):.3g}" for k in RULES)
            + f" | {r['cases']} | {cov.get('candidate', 0):.1f} / {cov.get('reference', 0):.1f}"
            + f" | {tr.get('candidate', 0):.1f} / {tr.get('reference', 0):.1f} | {r['wall_s']}"
            + f" | {(r['finding'] or '').replace('|', '/')[:200]} |"
        )
    table = "\n".join(lines)
    (a.out / "table.md").write_text(table + "\n")
    (a.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(table)
    return 0 if all(r["outcome"] == "gpu-correct" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

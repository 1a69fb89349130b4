"""Calibrate the verifier's numerics rules: honest results must pass with margin, wrong ones fail.

For every spec, at its correctness shapes and at the secret coverage cases of a few
secrets (``verifier/gpu/coverage.py``: production-size ragged, tiny M, heavy-tailed,
outlier, saturating and near-zero-row inputs), it judges with
:func:`coda_agent.verifier.stages.numerics.tolerance_check` (the verifier's own rules and the
spec's numbers):

* honest results: ``ideal`` (ref32 rounded once to the output dtype, the best any kernel
  can do); torch's own bf16 computation of the spec's reference by other kernels than the
  yardstick's: ``torch_bf16_cpu`` (the reference in the inputs' precision on the CPU, for
  GPU runs of at most :data:`CPU_FLOPS` GEMM FLOPs) and ``torch_bf16_reduced`` (on the GPU with
  cuBLAS's reduced-precision bf16 reductions allowed); and on a Hopper GPU
  ``quack_library`` (quack's hand-written kernel, where the spec names one) and ``kernel``
  (the accepted kernel);
* ``baseline_bf16``, reported apart: the spec's unfused ``baseline`` code run in bf16. It
  is not a yardstick: where it rounds intermediates the reference keeps (swiglu_bwd's
  dpost, rms_bwd's dgamma sum, cross_entropy_bwd's softmax of large logits) it is less
  accurate than the reference's own bf16 run, and it fails CODA's max-abs rule too;
* fp8 outputs and their scales: ``fp8_calibration.py`` (honest quantizers from other
  GEMMs, tensor cores and quack's included; truncation and another format's grid wrong);
* wrong results built from ``ideal`` (the class "wrong within the tolerance"):
  ``zero_small`` (every element below the 20th percentile of |ref| set to 0),
  ``flip_small`` (the sign of every element below the 17th percentile flipped),
  ``snap_grid`` (rounded to a grid of 0.08 x rms), ``drop_bits`` (bf16 outputs rounded
  to 4 mantissa bits).

It prints, per candidate and rule, the largest ratio (statistic / bound: > 1 fails) and
the margin 1 / ratio, and writes every judged number to ``--json``. Run on the GPU for the
kernel and quack rows (``benchmarks/results/numerics-calibration.md`` keeps the numbers)::

    python benchmarks/probes/numerics_rule_calibration.py --device cuda --secrets 3 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

HONEST = ("ideal", "torch_bf16_cpu", "torch_bf16_reduced", "quack_library", "kernel")
APART = ("baseline_bf16",)
WRONG = ("zero_small", "flip_small", "snap_grid", "drop_bits")
CPU_FLOPS = 4e9
"""Largest GEMM (bench.flops at the case's dims) whose bf16 reference is also run on the CPU."""
RULES = ("max_abs", "elementwise", "quantiles", "sign", "nonfinite")


def _round_to(t: torch.Tensor, dtype: str) -> torch.Tensor:
    return t.to(getattr(torch, dtype))


def wrong_variants(ideal: torch.Tensor, ref32: torch.Tensor, dtype: str) -> dict[str, torch.Tensor]:
    """The class-1 wrong results of one output (see the module doc), in ``dtype``."""
    r = ref32.double()
    fin = torch.isfinite(r)
    a = r.abs()[fin].reshape(-1)
    if a.numel() == 0:
        return {}
    sample = a[torch.randperm(a.numel())[: 1 << 20]] if a.numel() > (1 << 24) else a
    q20 = float(sample.kthvalue(max(1, int(0.20 * sample.numel())))[0])
    q17 = float(sample.kthvalue(max(1, int(0.17 * sample.numel())))[0])
    rms = float(a.pow(2).mean().sqrt())
    x = ideal.double()
    out = {
        "zero_small": torch.where(r.abs() < q20, torch.zeros_like(x), x),
        "flip_small": torch.where(r.abs() < q17, -x, x),
        "snap_grid": torch.round(x / (0.08 * rms)) * (0.08 * rms) if rms > 0 else x,
    }
    if dtype == "bfloat16":
        m, e = torch.frexp(x)
        out["drop_bits"] = torch.ldexp(torch.round(m * 32) / 32, e)
    return {k: _round_to(v, dtype) for k, v in out.items()}


def _kernel_fn(name: str):
    from coda_agent.kernels._registry import run_kernel

    return lambda *args, **consts: run_kernel(name, *args, **consts)


def _torch_bf16_alternatives(spec, ref, inputs, run) -> dict[str, dict[str, torch.Tensor]]:
    """torch's bf16 computation of the reference by other kernels than the yardstick's: on
    the CPU (small cases) and on the GPU with reduced-precision bf16 reductions."""
    from coda_agent.verifier.gpu.worker_reference import reference_outputs
    from coda_agent.verifier.spec import eval_expr

    out = {}
    flops = float(eval_expr(spec.bench.flops, run.dims)) if spec.bench.flops else math.inf
    if not run.sample and flops <= CPU_FLOPS:
        _, lowp = reference_outputs(spec, ref, {k: v.cpu() for k, v in inputs.items()}, run.dims)
        out["torch_bf16_cpu"] = lowp
    flag = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    try:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
        _, lowp = reference_outputs(spec, ref, inputs, run.dims)
        out["torch_bf16_reduced"] = lowp
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag
    return out


class _Rows(list):
    """A list that also appends each row to a JSON-lines file."""

    def __init__(self, sink: Path | None):
        super().__init__()
        self.sink = sink
        if sink is not None:
            sink.write_text("")

    def append(self, row: dict) -> None:
        super().append(row)
        if self.sink is not None:
            with open(self.sink, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")


def calibrate(
    names: list[str] | None, device: str, secrets: int, bench: bool, sample: int = 1 << 62, sink: Path | None = None
) -> list[dict]:
    """Judge every candidate (module doc) and return the rows; each row is also appended to
    ``sink`` (JSON lines) as soon as it exists, so a run cut short keeps what it judged."""
    from fp8_calibration import fp8_rows

    from coda_agent.verifier.gpu.inputs import make_inputs
    from coda_agent.verifier.gpu.protocol import sample_index
    from coda_agent.verifier.gpu.runs import make_bench_checks, make_bench_shapes, make_runs
    from coda_agent.verifier.gpu.worker_reference import _exact_fp32, reference_outputs
    from coda_agent.verifier.spec import find_specs
    from coda_agent.verifier.stages.numerics import tolerance_check

    _exact_fp32()
    dev = torch.device(device)
    rows: list[dict] = _Rows(sink)
    accepted = {p.parent.name for p in (ROOT / "generated_kernels").glob("*/kernel.py")}
    for loaded in find_specs(ROOT):
        if names and loaded.name not in names:
            continue
        spec, ref = loaded.spec, loaded.load_reference()
        runs = []
        for s in range(1, secrets + 1):  # (the sampled production-size case: benchmarks/reverify.py)
            runs += [
                r
                for r in make_runs(spec, secret=s, device=device)
                if not r.recheck and not r.sample and (s == 1 or r.key.startswith("cov"))
            ]
        if bench and device == "cuda" and spec.shapes.benchmark:
            shapes = make_bench_shapes(spec)[:1]
            runs += make_bench_checks(spec, shapes, secret=7)
        cands = {"baseline_bf16": ref.baseline}
        if device == "cuda" and "quack_library" in spec.bench.baselines:
            cands["quack_library"] = ref.quack_library
        if device == "cuda" and loaded.name in accepted:
            cands["kernel"] = _kernel_fn(loaded.name)
        for run in runs:
            t0 = time.perf_counter()
            inputs = make_inputs(loaded, run.dims, run.seed, dev, ref, run.draw)
            consts = spec.constants_of(run.dims)
            ref32, lowp = reference_outputs(spec, ref, inputs, run.dims)
            results: dict[str, dict[str, torch.Tensor]] = {}
            if device == "cuda":
                results.update(_torch_bf16_alternatives(spec, ref, inputs, run))
            for cname, fn in cands.items():
                try:
                    with torch.no_grad():
                        got = (
                            fn(**inputs, **consts)
                            if cname != "kernel"
                            else fn(*[inputs[t.name] for t in spec.entry.inputs], **consts)
                        )
                    if not isinstance(got, dict):
                        got = dict(
                            zip(
                                [o.name for o in spec.entry.outputs],
                                got if isinstance(got, tuple) else (got,),
                                strict=False,
                            )
                        )
                    results[cname] = {k: v.detach() for k, v in got.items()}
                except Exception as e:  # noqa: BLE001 -- a candidate that cannot run is a row, not a crash
                    rows.append(
                        dict(
                            spec=loaded.name,
                            run=run.key,
                            case=run.case,
                            candidate=cname,
                            output=None,
                            error=f"{type(e).__name__}: {str(e)[:300]}",
                        )
                    )
            if spec.fp8_outputs:  # judged with their scales (fp8_calibration.py)
                for row in fp8_rows(spec, ref, inputs, run, ref32, lowp, device):
                    rows.append(row)
            quantized = {o.name for o in spec.fp8_outputs} | {o.scale for o in spec.fp8_outputs}
            for pos, o in enumerate(spec.entry.outputs):
                if o.name in quantized:
                    continue
                r32, lp = ref32[o.name], lowp[o.name]
                tol = spec.tolerance.for_output(o.name)
                ideal = _round_to(r32, o.dtype)
                outs = {"ideal": ideal}
                for cname, res in results.items():
                    if o.name in res:
                        outs[cname] = res[o.name].to(getattr(torch, o.dtype)).cpu()
                if not run.sample:
                    outs.update(wrong_variants(ideal, r32, o.dtype))
                for cname, out in outs.items():
                    n = run.sample or (sample if out.numel() > sample else 0)
                    if n:  # sampled positions, as the verifier's benchmark-shape checks
                        idx = sample_index(out.numel(), n, run.seed, pos)
                        o_, r_, l_ = out.reshape(-1)[idx], r32.reshape(-1)[idx], lp.reshape(-1)[idx]
                    else:
                        o_, r_, l_ = out, r32, lp
                    if o_.shape != r_.shape:
                        rows.append(
                            dict(
                                spec=loaded.name,
                                run=run.key,
                                case=run.case,
                                candidate=cname,
                                output=o.name,
                                error=f"shape {tuple(o_.shape)} != {tuple(r_.shape)}",
                            )
                        )
                        continue
                    j = tolerance_check(o_, r_, l_, tol, o.dtype, spec.low_precision)
                    rows.append(
                        dict(
                            spec=loaded.name,
                            run=run.key,
                            case=run.case,
                            draw=run.draw,
                            candidate=cname,
                            output=o.name,
                            ok=j["ok"],
                            failed=j.get("failed", []),
                            ratios={k: v["ratio"] for k, v in j.get("rules", {}).items()},
                            sign_wrong=j.get("rules", {}).get("sign", {}).get("wrong"),
                        )
                    )
            del inputs, results, ref32, lowp
            if device == "cuda":
                torch.cuda.empty_cache()
            print(f"  {loaded.name} {run.case}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return rows


def summarize(rows: list[dict]) -> str:
    """A markdown table: per candidate and rule, the largest ratio and (honest rows) the margin."""
    lines = [
        "| candidate | judged | failed | " + " | ".join(f"max {r}" for r in RULES[:3]) + " | sign wrong | margin |",
        "|---|---|---|" + "---|" * 3 + "---|---|",
    ]
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("output") is not None and "ratios" in r:
            by.setdefault(r["candidate"], []).append(r)
    for cand in [*HONEST, *APART, *WRONG]:
        rs = by.get(cand)
        if not rs:
            continue
        worst = {rule: max((x["ratios"].get(rule, 0.0) for x in rs), default=0.0) for rule in RULES}
        failed = sum(1 for x in rs if not x["ok"])
        sign = sum(x.get("sign_wrong") or 0 for x in rs)
        top = max(worst[r] for r in RULES[:3])
        margin = f"{1 / top:.2f}x" if cand in HONEST and top > 0 and math.isfinite(top) else "-"
        lines.append(
            f"| {cand} | {len(rs)} | {failed} | "
            + " | ".join(f"{worst[r]:.3g}" for r in RULES[:3])
            + f" | {sign} | {margin} |"
        )
    errors = [r for r in rows if r.get("error")]
    if errors:
        lines.append("")
        lines += [f"- error: {e['spec']} {e['candidate']} {e['case']}: {e['error']}" for e in errors[:20]]
    return "\n".join(lines)


def per_spec(rows: list[dict]) -> str:
    """Per spec and output: the honest candidates' worst ratio and whether every wrong one failed."""
    out = ["| spec | output | honest worst (rule) | wrong results caught |", "|---|---|---|---|"]
    keys = sorted({(r["spec"], r["output"]) for r in rows if r.get("output")})
    for spec, output in keys:
        rs = [r for r in rows if r.get("spec") == spec and r.get("output") == output and "ratios" in r]
        honest = [r for r in rs if r["candidate"] in HONEST]
        wrong = [r for r in rs if r["candidate"] in WRONG]
        w = max(
            ((v, k, r["candidate"]) for r in honest for k, v in r["ratios"].items() if k in RULES[:3]),
            default=(0, "-", "-"),
        )
        caught = sum(1 for r in wrong if not r["ok"])
        out.append(f"| {spec} | {output} | {w[0]:.3g} ({w[1]}, {w[2]}) | {caught}/{len(wrong)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--secrets", type=int, default=2, help="secrets whose coverage cases are judged")
    ap.add_argument("--spec", action="append", help="only these specs (repeatable)")
    ap.add_argument("--bench", action="store_true", help="also the first benchmark shape, sampled (GPU)")
    ap.add_argument(
        "--sample",
        type=int,
        default=1 << 62,
        help="judge at most this many sampled elements per output (the rules on a sample)",
    )
    ap.add_argument("--json", type=Path, help="append every judged row here as it is judged (JSON lines)")
    ap.add_argument("--summarize", type=Path, help="print the tables of an earlier --json file and exit")
    a = ap.parse_args(argv)
    if a.summarize:
        rows = [json.loads(line) for line in a.summarize.read_text().splitlines() if line.strip()]
    else:
        rows = calibrate(a.spec, a.device, a.secrets, bench=a.bench, sample=a.sample, sink=a.json)
    from fp8_calibration import FP8_HONEST, FP8_WRONG, summarize_fp8

    fp8 = [r for r in rows if "flips" in r]
    rows = [r for r in rows if "flips" not in r]
    print(summarize(rows))
    print()
    print(per_spec(rows))
    if fp8:
        print()
        print(summarize_fp8(fp8))
    honest_fail = [r for r in rows if r.get("candidate") in HONEST and r.get("ok") is False]
    honest_fail += [r for r in fp8 if r["candidate"] in FP8_HONEST and not r["ok"]]
    wrong_pass = [r for r in rows if r.get("candidate") in WRONG and r.get("ok") is True]
    # a wrong fp8 candidate must fail on its codes (its scale is the honest one)
    wrong_pass += [r for r in fp8 if r["candidate"] in FP8_WRONG and r["ok"] and "fp8_rounding" in r["ratios"]]
    for r in honest_fail[:30]:
        print(f"HONEST FAIL {r['spec']} {r['candidate']} {r['output']} {r['case']}: {r['failed']} {r['ratios']}")
    for r in wrong_pass[:30]:
        print(f"WRONG PASS {r['spec']} {r['candidate']} {r['output']} {r['case']}: {r['ratios']}")
    return 1 if honest_fail or wrong_pass else 0


if __name__ == "__main__":
    sys.exit(main())

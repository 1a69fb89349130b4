"""Regression over accepted kernels: nothing may silently break an accepted kernel.

For each ``generated_kernels/<name>/`` (``coda-agent regress``), in order, stopping at the
first failure of that kernel:

1. **integrity** -- ``kernel.py``'s sha256 equals the manifest's (an edit after
   verification is a failure: re-verify and re-accept with ``--force``);
2. **spec** -- the spec's hash equals the one the kernel was accepted against; if not,
   the row says "needs re-verification" and names the spec fields that changed (the
   manifest keeps the accepted spec's parsed TOML for this);
3. **static** and **compile** (sm_90a; works without a GPU) -- catches dependency bumps
   (cutlass-dsl / quack) that break the kernel;
4. with a Hopper GPU (not ``cpu_only``): the full correctness, gradient and benchmark
   stages. Performance is judged only as *ratios* fused/baseline measured in the same
   run, compared with the ratios recorded at acceptance (:func:`compare_ratios`: per
   baseline, the geometric mean over shapes may worsen by at most ``tolerance``, default
   10 %, and no single shape by more than twice that). Absolute times are never
   compared across runs.

   Only fused/``bare_gemm`` gates (when the spec times it; otherwise every baseline
   does). The bare GEMM is torch's cuBLAS GEMM of the same M/N/K: one device-bound
   kernel, the same in every run, so it cancels run-to-run drift of the machine and
   still moves when quack's mainloop or the epilogue gets slower. The other baselines
   (torch eager/compile, quack's library kernel, Liger) are third-party code whose
   own time can move between runs: on the H200, quack's RoPE library kernel at the
   1B shapes (host-bound, ~0.2 ms) took 0.314 ms in one run and 0.206 ms in another,
   while the fused kernel did not get slower. Their ratio changes are reported in the
   row (``info``), never a failure.

The report is data (:class:`RegressReport`); ``commands/bench.py`` renders it and ``--json`` saves it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .. import progress
from ..confine.sandbox import in_parallel
from ..spec import SpecError, diff_fields, load_spec
from ..stages.bench import host_bound
from ..workspace import sha256_file
from .accept import ManifestError, accepted_names, read_manifest

RowStatus = Literal["pass", "fail", "needs-reverify", "skip"]


class RegressRow(BaseModel):
    """One kernel's outcome. ``stage`` is where it stopped (or the last stage run)."""

    kernel: str
    status: RowStatus
    stage: str
    message: str = ""
    worst_ratio_change: float | None = Field(
        default=None, description="max over shapes/baselines of ratio_now / ratio_accepted (1.0 = unchanged)"
    )
    worst_at: str = ""
    ratios: dict[str, Any] = Field(default_factory=dict)

    @property
    def ratio_text(self) -> str:
        if self.worst_ratio_change is None:
            return "-"
        return f"{self.worst_ratio_change:.3f}x accepted ({self.worst_at})"


class RegressReport(BaseModel):
    """All rows plus how the run was made."""

    cpu_only: bool
    tolerance: float
    rows: list[RegressRow] = Field(default_factory=list)
    environment: dict[str, Any] = Field(default_factory=dict, description="the machine that ran regress")
    source: str = Field(
        default="measured by this run",
        description="where the GPU numbers come from: this run, "
        "or the folder of verdicts kept by `coda-agent bench` (--verdicts)",
    )
    measured_on: list[str] = Field(default_factory=list, description="GPU(s) of the kept verdicts (--verdicts)")
    schedule: str | None = Field(
        default=None, description="where this run's GPU stages ran (the scheduler, verifier/schedule/)"
    )

    @property
    def ok(self) -> bool:
        return all(r.status in ("pass", "skip") for r in self.rows)

    def to_json(self) -> str:
        d = self.model_dump(mode="json")
        d["ok"] = self.ok
        return json.dumps(d, indent=2, sort_keys=True) + "\n"


GATING_BASELINE = "bare_gemm"
"""The baseline whose fused/baseline ratio gates a regression (module docstring, item 4)."""


def compare_ratios(
    accepted_shapes: dict[str, Any],
    now_shapes: dict[str, Any],
    tolerance: float,
    pair_tolerance: float | None = None,
    gate: set[str] | None = None,
) -> dict[str, Any]:
    """Compare fused/baseline ratios between acceptance and now.

    Both arguments are bench-stage ``metrics["shapes"]``: ``{shape: {"baselines":
    {name: {"ratio": float, ...}}}}``. For each (shape, baseline) measured both times,
    change = ratio_now / ratio_accepted (> 1: the kernel got slower relative to that
    baseline). The verdict is per *baseline*: the geometric mean of its changes over the
    shapes must stay within ``1 + tolerance``, and no single pair may exceed
    ``1 + pair_tolerance`` (default ``2 * tolerance``).

    Why not every pair at ``tolerance``: one run measures ~24 pairs and a single timing
    outlier (seen on the H200: a baseline at one 70B shape 20 % slow in one run, then
    normal) would fail CI for nothing; a real regression moves the ratios at every
    shape, and a regression confined to one shape still trips the per-pair guard.

    ``gate``: only these baselines can make a pair or geomean ``regressed`` (and give
    ``worst``); the others are compared and listed in ``pairs``/``geomean`` but only
    inform (``info_worst``/``info_worst_at``). None: every baseline gates. Shapes that
    are host-bound at acceptance or now (:func:`~coda_agent.verifier.stages.bench.host_bound`)
    never gate and are left out of the geometric means; they are listed in ``host_bound``
    and their pairs inform like a non-gating baseline's.

    Returns ``{"worst": float | None, "worst_at": str, "regressed": [str], "pairs":
    {"shape/baseline": [accepted, now, change]}, "geomean": {baseline: change},
    "info_worst": float | None, "info_worst_at": str, "host_bound": [shape]}``.
    """
    pair_tol = 2 * tolerance if pair_tolerance is None else pair_tolerance
    pairs: dict[str, list[float]] = {}
    for shape, acc in accepted_shapes.items():
        now = now_shapes.get(shape)
        if not now:
            continue
        for b, r in acc.get("baselines", {}).items():
            ra, rn = r.get("ratio"), now.get("baselines", {}).get(b, {}).get("ratio")
            if ra and rn:
                pairs[f"{shape}/{b}"] = [ra, rn, rn / ra]
    # a host-bound shape (at acceptance or now) times Python and launch gaps, not the kernel
    hb = sorted(
        sh
        for sh in accepted_shapes
        if sh in now_shapes and (host_bound(accepted_shapes[sh]) or host_bound(now_shapes[sh]))
    )
    gates = (lambda b: True) if gate is None else (lambda b: b in gate)
    gated = {k: v for k, v in pairs.items() if gates(k.rsplit("/", 1)[1]) and k.rsplit("/", 1)[0] not in hb}
    info = {k: v for k, v in pairs.items() if k not in gated}
    if not gated:
        return {
            "worst": None,
            "worst_at": "",
            "regressed": [],
            "pairs": pairs,
            "geomean": {},
            "info_worst": None,
            "info_worst_at": "",
            "host_bound": hb,
        }
    by_base: dict[str, list[float]] = {}
    for k, v in pairs.items():
        shape, b = k.rsplit("/", 1)
        if shape not in hb:
            by_base.setdefault(b, []).append(v[2])
    geomean = {b: math.exp(sum(math.log(c) for c in cs) / len(cs)) for b, cs in by_base.items()}
    worst_at, (_, _, worst) = max(gated.items(), key=lambda kv: kv[1][2])
    info_at, (_, _, info_worst) = max(info.items(), key=lambda kv: kv[1][2]) if info else ("", (0, 0, None))
    regressed = sorted(f"geomean/{b}" for b, g in geomean.items() if gates(b) and g > 1 + tolerance)
    regressed += sorted(k for k, v in gated.items() if v[2] > 1 + pair_tol)
    return {
        "worst": worst,
        "worst_at": worst_at,
        "regressed": regressed,
        "pairs": pairs,
        "geomean": geomean,
        "info_worst": info_worst,
        "info_worst_at": info_at,
        "host_bound": hb,
    }


def _cpu_stage_row(name: str, stages: list) -> RegressRow | None:
    """The failing row for a static or compile stage that is not ok, else None."""
    for st in stages:
        if st.stage not in ("static", "compile") or st.ok:
            continue
        first = st.findings[0] if st.findings else None
        if st.stage == "static":
            msg = f"{st.summary}" + (f"; line {first.line}: {first.message}" if first else "")
        else:
            msg = f"no longer compiles for sm_90a: {st.summary}" + (f"; {first.message}" if first else "")
        return RegressRow(kernel=name, status="fail", stage=st.stage, message=msg[:2000])
    return None


def _kept_verdict(vdir: Path, name: str, spec_hash: str, kernel_hash: str):
    """The verdict ``coda-agent bench`` kept for ``name`` in ``vdir``, or a failing row saying why not."""
    from ..verdict import Verdict

    f = Path(vdir) / f"{name}.json"
    if not f.exists():
        # fail-closed (every accepted kernel is judged), but say what it means: a folder
        # that measured some kernels only is not a "(FileNotFoundError)" for the others
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            message=f"not measured in {vdir} (no {f.name}): run coda-agent bench {name}, or "
            "name only the kernels that folder holds",
        )
    try:
        v = Verdict.model_validate_json(f.read_text())
    except (OSError, ValueError) as e:
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            message=f"no usable benchmark verdict {f} ({type(e).__name__}); run coda-agent bench {name}",
        )
    if not v.stages:
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            message=f"{f} records no stages (missing or empty 'stages'): not a verdict coda-agent "
            f"bench kept; run coda-agent bench {name}",
        )
    if v.candidate_hash != kernel_hash or v.spec_hash != spec_hash:
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            message=f"{f} was measured for another kernel.py or spec (hash differs); run coda-agent bench {name} again",
        )
    return v


def regress_one(
    root: Path,
    name: str,
    *,
    cpu_only: bool,
    tolerance: float,
    verify_fn=None,
    bench_shapes: list[str] | None = None,
    verdicts: Path | None = None,
) -> RegressRow:
    """Run the regression ladder for one accepted kernel (see module docstring).

    ``verdicts``: a folder of verdicts kept by ``coda-agent bench``
    (``benchmarks/results/<date>-<gpu>/``) to judge instead of running the GPU stages again;
    each must be for this very ``kernel.py`` and spec (sha256), else the row fails."""
    kdir = root / "generated_kernels" / name
    kernel = kdir / "kernel.py"
    try:
        man = read_manifest(kdir / "manifest.json")
    except ManifestError as e:
        return RegressRow(kernel=name, status="fail", stage="integrity", message=str(e))
    if not kernel.is_file():
        return RegressRow(kernel=name, status="fail", stage="integrity", message="kernel.py missing")
    if man.get("gpu_verified") is not True:
        # accept() refuses such a verdict; a manifest saying so was written by something else
        return RegressRow(
            kernel=name,
            status="fail",
            stage="integrity",
            message="the manifest does not record a GPU verification (gpu_verified is not true); "
            f"verify it on a GPU (coda-agent verify {name} generated_kernels/{name}/kernel.py --accept --force)",
        )
    got = sha256_file(kernel)
    if got != man.get("kernel_sha256"):
        return RegressRow(
            kernel=name,
            status="fail",
            stage="integrity",
            message=f"kernel.py was modified after verification: sha256 {got[:12]} != manifest "
            f"{str(man.get('kernel_sha256'))[:12]}; re-verify it (coda-agent verify {name} "
            f"generated_kernels/{name}/kernel.py --accept --force)",
        )
    spec_name = man.get("spec", name)
    try:
        loaded = load_spec(root / "kernel_specs" / spec_name)
    except SpecError as e:
        return RegressRow(kernel=name, status="fail", stage="spec", message=str(e).splitlines()[0])
    if loaded.spec_hash != man.get("spec_hash"):
        fields = diff_fields(man.get("spec_raw") or {}, loaded.raw) if man.get("spec_raw") else []
        what = ", ".join(fields) if fields else "reference.py (or fields not recorded)"
        return RegressRow(
            kernel=name,
            status="needs-reverify",
            stage="spec",
            message=f"spec {spec_name} changed since acceptance (changed: {what}); needs re-verification",
        )

    if cpu_only:
        from ..pipeline import cpu_stages

        stages = list(cpu_stages(loaded, kernel).stages)
    else:
        if verdicts is not None:
            verdict = _kept_verdict(verdicts, name, loaded.spec_hash, got)
            if isinstance(verdict, RegressRow):
                return verdict
        else:
            if verify_fn is None:
                from ..pipeline import verify as verify_fn
            verdict = verify_fn(loaded, kernel, bench_shapes=bench_shapes)  # static and compile included
        stages = verdict.stages
    row = _cpu_stage_row(name, stages)
    if row is not None:
        return row
    if cpu_only:
        return RegressRow(
            kernel=name,
            status="pass",
            stage="compile",
            message="integrity, spec, static, sm_90a compile ok (CPU-only: numerics and speed not run)",
        )

    failed = verdict.failed_stage
    if failed is not None:
        return RegressRow(kernel=name, status="fail", stage=failed.stage, message=f"{failed.status}: {failed.summary}")
    bench = verdict.stage("bench")
    if bench is None or bench.status != "pass":
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            message="no GPU benchmark ran (needs a Hopper GPU; use --cpu-only elsewhere)",
        )
    acc_shapes = (man.get("stages", {}).get("bench", {}).get("metrics") or {}).get("shapes") or {}
    timed = {b for m in acc_shapes.values() for b in m.get("baselines", {})}
    gate = {GATING_BASELINE} if GATING_BASELINE in timed else None
    cmp = compare_ratios(acc_shapes, bench.metrics.get("shapes") or {}, tolerance, gate=gate)
    info = ""
    if cmp["info_worst"] is not None:
        info = (
            f" (not gating: other baselines' or host-bound shapes' ratios moved at most "
            f"{cmp['info_worst']:.2f}x, at {cmp['info_worst_at']})"
        )
    if cmp["host_bound"]:
        info += f"; shapes host-bound at acceptance or now, not gated: {', '.join(cmp['host_bound'])}"
    if cmp["worst"] is None:
        if cmp["pairs"] and cmp["host_bound"]:
            return RegressRow(
                kernel=name,
                status="pass",
                stage="bench",
                ratios=cmp["pairs"],
                message="correct; every comparable shape is host-bound, so speed is not judged" + info,
            )
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            message="no comparable (shape, baseline) ratio between acceptance and now" + info,
        )
    if cmp["regressed"]:
        k = cmp["regressed"][0]
        if k.startswith("geomean/"):
            b = k.split("/", 1)[1]
            detail = (
                f"fused/{b} is {cmp['geomean'][b]:.2f}x its accepted value "
                f"(geometric mean over {sum(1 for p in cmp['pairs'] if p.endswith('/' + b))} shapes)"
            )
        else:
            a, n, c = cmp["pairs"][k]
            detail = f"{k}: fused/baseline {a:.3f} at acceptance -> {n:.3f} now ({c:.2f}x)"
        return RegressRow(
            kernel=name,
            status="fail",
            stage="bench",
            worst_ratio_change=cmp["worst"],
            worst_at=cmp["worst_at"],
            ratios=cmp["pairs"],
            message=f"slower relative to its baselines (tolerance {tolerance:.0%} on the geometric mean, "
            f"{2 * tolerance:.0%} per shape): {detail}{info}",
        )
    g = verdict.stage("gradients")
    grads = "gradients ok" if g is not None and g.status == "pass" else "no gradient outputs to check"
    return RegressRow(
        kernel=name,
        status="pass",
        stage="bench",
        worst_ratio_change=cmp["worst"],
        worst_at=cmp["worst_at"],
        ratios=cmp["pairs"],
        message=f"correct, {grads}, perf ratios within tolerance{info}",
    )


def regress(
    root: Path,
    kernels: list[str] | None = None,
    *,
    cpu_only: bool = False,
    tolerance: float = 0.10,
    verify_fn=None,
    bench_shapes: list[str] | None = None,
    verdicts: Path | None = None,
    scheduler: Any = None,
) -> RegressReport:
    """Regress every accepted kernel (or ``kernels``). Raises ValueError for unknown names.

    ``bench_shapes`` restricts the GPU benchmark to these spec shape names (ratios are
    compared only for shapes measured both at acceptance and now). ``verdicts`` judges the
    verdicts ``coda-agent bench`` kept in that folder instead of measuring again (see
    :func:`regress_one`); ValueError when it is not a folder. On a GPU the kernels run
    one per visible GPU at once, each alone on its GPU (``scheduler``: a
    :class:`~coda_agent.verifier.schedule.Scheduler` instead of every visible GPU;
    ``RegressReport.schedule`` says where)."""
    if verdicts is not None and not Path(verdicts).is_dir():
        raise ValueError(f"--verdicts {verdicts}: not a folder (expected benchmarks/results/<date>-<gpu>/)")
    from ..gpu.environment import collect_environment

    rep = RegressReport(
        cpu_only=cpu_only, tolerance=tolerance, environment=collect_environment().model_dump(mode="json")
    )
    if verdicts is not None and not cpu_only:
        from ..verdict import Verdict

        rep.source = f"verdicts kept by coda-agent bench in {verdicts}"
        gpus = set()
        for f in sorted(Path(verdicts).glob("*.json")):
            try:
                gpus.add(str(Verdict.model_validate_json(f.read_text()).environment.gpu))
            except ValueError:
                continue
        rep.measured_on = sorted(gpus)
    names = accepted_names(root, kernels)
    # Rationale: CPU-only rows are independent sm_90a compiles (each its own process), so they
    # run side by side; GPU rows run one per GPU, each alone on its GPU (timings never share one).
    jobs = min(8, os.cpu_count() or 1) if cpu_only else 1
    if not cpu_only and verdicts is None and verify_fn is None:
        from ..schedule import make_scheduler

        sched = scheduler or make_scheduler(screen=False)
        verify_fn, jobs = sched.verify_fn, sched.parallel
        rep.schedule = sched.describe()

    def one(i: int) -> RegressRow:
        progress.item(i + 1, len(names), names[i])
        return regress_one(
            root,
            names[i],
            cpu_only=cpu_only,
            tolerance=tolerance,
            verify_fn=verify_fn,
            bench_shapes=bench_shapes,
            verdicts=verdicts,
        )

    rep.rows.extend(in_parallel(one, len(names), jobs))
    return rep

"""The ``correctness`` stage: the candidate's value outputs against the trusted references.

Built in the parent from what the two workers saved (see
:mod:`~coda_agent.verifier.gpu.results`); nothing here touches the GPU. Checks, in the
order a finding is reported for each output of each trial:

1. the worker reached the candidate (``not-hopper`` refusal or a setup failure is a
   verifier ``error``; an import failure is the candidate's ``crash``/``cuda-error``);
   the measuring instruments were not replaced (``harness-tampered``);
2. the worker's output-contract violations (``output-not-plain-tensor``,
   ``output-shape``, ``output-dtype``, ``output-aliases-input``, ``output-count`` ...);
3. inputs unchanged: the candidate's inputs *after* the call are bitwise equal to the
   reference worker's independently regenerated inputs (``input-mutated``); the inputs
   *before* the call must match too, else input generation is broken (verifier error);
4. per output: memory the kernel never wrote (``stale-memory``: the allocator poison),
   then sanity (``nan-output``, ``zero-output``, ``constant-output``), then the
   tolerance rule (``tolerance``, with :func:`~coda_agent.verifier.stages.numerics.describe_error`);
5. kernel launches <= ``spec.entry.max_launches`` at every correctness shape (one call
   each; ``too-many-launches``; zero kernels seen is ``no-launches``), and GEMM launches
   among them <= ``spec.entry.max_gemm_launches`` (``too-many-gemm-launches``: a second
   pass over the output, e.g. a dummy-K GEMM rotating a stored result, fits a launch
   budget that host prep leaves room in);
6. the post-timing recheck trial (a fresh seed) passes the same checks
   (``drift-after-timing``).

Gradient outputs get steps 4 and 6 in the ``gradients`` stage (``gradients.py``),
which reuses :func:`check_outputs`. Findings repeat at most once per
(kind, output, shape case): the seeds of one case collapse.
"""

from __future__ import annotations

import time
from typing import Any

from ..gpu.coverage import KEY_PREFIX as COVERAGE_KEY_PREFIX
from ..gpu.poison import bitwise_equal, poison_count
from ..gpu.protocol import SCRATCH_BUDGET, Run, gemm_launches
from ..gpu.results import GpuRun, failure_finding, jsonable
from ..gpu.samples import expand_blocks
from ..spec import LoadedSpec, OutputSpec, ToleranceSpec
from ..verdict import Finding, Stage, StageResult, Status
from .numerics import describe_error, output_sanity, tolerance_check
from .numerics_fp8 import check_fp8_output


class FindingSet:
    """Findings with (kind, output, case) de-duplication."""

    def __init__(self) -> None:
        self.items: list[Finding] = []
        self._seen: set[tuple] = set()

    def add(self, kind: str, message: str, output: str | None = None, case: str | None = None) -> None:
        key = (kind, output, case)
        if key in self._seen:
            return
        self._seen.add(key)
        self.items.append(Finding(kind=kind, message=message, output=output, case=case))


def check_output(
    name: str,
    out: Any,
    ref32: Any,
    ref_lowp: Any,
    tol: ToleranceSpec,
    label: str,
    dtype: str | None = None,
    lowp_dtype: str = "bfloat16",
) -> tuple[tuple[str, str] | None, dict[str, Any]]:
    """Compare one output tensor with its references.

    ``out`` (CPU tensor, declared shape), ``ref32`` (fp32), ``ref_lowp``; ``tol`` the
    output's rules (``ToleranceSpec.for_output``); ``dtype`` its declared dtype and
    ``lowp_dtype`` the spec's low precision (``numerics.judge``); ``label`` names the trial
    in messages. Returns ``((kind, message) or None, metrics)`` where the kind is the first
    failing check of: ``stale-memory``, ``nan-output``, ``zero-output``,
    ``constant-output``, ``tolerance`` (any numerics rule: the message names the rule, the
    output, where and by how much); metrics hold ``max_err``, ``allowed``, ``ratio``
    (the largest over the rules), ``ok``, ``poisoned`` and ``rules`` (each rule's ratio).
    """
    res = tolerance_check(out, ref32, ref_lowp, tol, dtype, lowp_dtype)
    metrics = {k: res[k] for k in ("max_err", "allowed", "ratio", "ok", "lowp_err", "worst_index")}
    metrics["rules"] = {k: v["ratio"] for k, v in res.get("rules", {}).items()}
    n_poison = poison_count(out)
    metrics["poisoned"] = n_poison
    if n_poison:
        where = describe_error(out, ref32, allowed=res["allowed"])
        return (
            "stale-memory",
            f"{name} [{label}]: {n_poison} of {out.numel()} elements still hold the NaN "
            f"poison the verifier filled free GPU memory with: the kernel never wrote them; {where}",
        ), metrics
    bad = output_sanity(out, ref32)
    if bad:
        return (bad[0], f"{name} [{label}]: {bad[1]}"), metrics
    if not res["ok"]:
        return ("tolerance", f"{name} [{label}]: {rule_message(res, tol, out, ref32)}"), metrics
    return None, metrics


def rule_message(res: dict[str, Any], tol: ToleranceSpec, out: Any, ref32: Any) -> str:
    """What the first failing numerics rule of ``res`` (:func:`~coda_agent.verifier.stages.numerics.tolerance_check`
    of ``out`` against ``ref32``) says: the rule, where, and by how much, with the error diagnosis."""
    diag = lambda allowed: describe_error(out, ref32, allowed=allowed)  # noqa: E731
    if res["rule"] == "abs":
        return (
            f"max|out - ref32| = {res['max_err']:.3g} > allowed {res['allowed']:.3g} (absolute); {diag(res['allowed'])}"
        )
    rule = res["failed"][0]
    r = res["rules"][rule]
    if rule == "nonfinite":
        return (
            f"rule non-finite: {r['finite_where_ref_not']} element(s) finite where the reference is NaN/Inf "
            f"(first at {r.get('first_index')}); NaN/Inf inputs must propagate to the same elements as in the reference"
        )
    if rule == "max_abs":
        return (
            f"rule max-abs: max|out - ref32| = {res['max_err']:.3g} > allowed {res['allowed']:.3g} = {tol.factor:g} x "
            f"low-precision reference error {res['lowp_err']:.3g} + {tol.floor:g}; {diag(res['allowed'])}"
        )
    if rule == "elementwise":
        w = r["worst"]
        return (
            f"rule per-element: {r['over']} of {r['judged']} elements exceed their bound ({tol.ulps:g} ulps of "
            f"their own value + {tol.factor:g} x the low-precision reference's error there + {tol.floor_ulps:g} "
            f"low-precision ulps of their row's scale); worst at {w['index']}: got {w['got']:.6g}, expected "
            f"{w['expected']:.6g}, |err| {w['err']:.3g} = {r['ratio']:.3g} x its bound {w['bound']:.3g}. Small "
            f"elements count too: compute every element in fp32 and round once"
        )
    if rule == "quantiles":
        parts = ", ".join(
            f"p{int(q * 100)} {a:.3g} (allowed {b:.3g})" for q, a, b in zip(r["q"], r["out"], r["bound"], strict=False)
        )
        return (
            f"rule error-quantiles: |out - ref32| percentiles {parts}, at most {tol.quantile_factor:g} x the "
            f"low-precision reference's (p50/p90/p99 {', '.join(f'{x:.3g}' for x in r['lowp'])}) + one "
            f"low-precision ulp of the tensor's scale; the bulk of the elements is less precise than PyTorch's "
            f"own low-precision result ({r['ratio']:.3g} x the bound)"
        )
    return (
        f"rule sign: {r['wrong']} of {r['judged']} elements well above rounding have a zero or flipped sign "
        f"(first at {r.get('first_index')}: got {r.get('got', 0):.6g}, expected {r.get('expected', 0):.6g})"
    )


def check_outputs(
    loaded: LoadedSpec,
    run: GpuRun,
    outputs: list[OutputSpec],
    trials: list[Run],
    findings: FindingSet,
    drift: bool = False,
) -> tuple[dict[str, Any], str | None]:
    """Numerical checks of ``outputs`` over ``trials``; appends to ``findings``.

    Returns ``(metrics by trial key, error)`` where ``error`` is a verifier-side problem
    (missing reference file, ...) that makes the stage an ``error``. With ``drift`` the
    failures are reported as ``drift-after-timing``, except for outputs that already
    failed before timing (that is not drift).
    """
    already_bad = {x.output for x in findings.items} if drift else set()
    tol = loaded.spec.tolerance
    metrics: dict[str, Any] = {}
    for t in trials:
        rec = run.cand_trial(t.key)
        if rec is None:
            continue
        try:
            cand = run.load_cand(t.key)
            ref = run.load_ref(t.key)
        except (FileNotFoundError, RuntimeError, OSError) as e:
            return metrics, f"trial {t.key}: cannot load the saved tensors: {e}"
        bad_outputs = {v.get("output") for v in rec.get("violations", [])}
        label = f"{t.case}, seed {t.seed}"
        per: dict[str, Any] = {}
        for o in outputs:
            out = cand["outputs"].get(o.name)
            if o.name not in ref["ref32"]:
                return metrics, f"reference worker produced no {o.name!r} for trial {t.key}"
            if o.name in bad_outputs:
                continue  # its contract violation is already a finding
            if out is None or tuple(out.shape) != tuple(ref["ref32"][o.name].shape):
                # nothing to compare and no violation saying why: never a silent pass
                # (no run passes with "0 output(s)" compared)
                got = "nothing saved" if out is None else f"shape {tuple(out.shape)}"
                findings.add(
                    "output-missing",
                    f"[{label}] {o.name}: {got}, expected "
                    f"{tuple(ref['ref32'][o.name].shape)} to compare with the reference",
                    output=o.name,
                    case=t.case,
                )
                continue
            if o.scale is not None:  # an fp8 output: judged with its scale (numerics_fp8)
                scale = cand["outputs"].get(o.scale)
                if o.scale in bad_outputs or scale is None:
                    continue  # its scale's contract violation is already a finding
                band = ref.get("fp8_band", {}).get(o.name)
                if band is None:
                    return metrics, f"reference worker produced no fp8 band of {o.name!r} for trial {t.key}"
                if not t.sample:  # a full trial: one scale (and band) per block, spread over the block
                    scale, band = expand_blocks(scale, tuple(out.shape)), expand_blocks(band, tuple(out.shape))
                bad, m = check_fp8_output(o.name, out, scale, ref["ref32"][o.name], band, o.dtype, label)
            else:
                bad, m = check_output(
                    o.name,
                    out,
                    ref["ref32"][o.name],
                    ref["ref_lowp"].get(o.name),
                    tol.for_output(o.name),
                    label,
                    o.dtype,
                    loaded.spec.low_precision,
                )
            per[o.name] = m
            if bad and o.name not in already_bad:
                kind, msg = bad
                if drift:
                    msg = f"after timing, with a fresh seed ({kind}): {msg}"
                    kind = "drift-after-timing"
                findings.add(kind, msg, output=o.name, case=t.case)
        metrics[t.key] = per
    return metrics, None


def worst(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per output, the trial with the largest ``ratio`` (max_err / allowed)."""
    out: dict[str, Any] = {}
    for key, per in metrics.items():
        for name, m in per.items():
            if name not in out or m["ratio"] > out[name]["ratio"]:
                out[name] = {"max_err": m["max_err"], "allowed": m["allowed"], "ratio": m["ratio"], "trial": key}
    return out


def _contract_checks(loaded: LoadedSpec, run: GpuRun, f: FindingSet, trials: list[Run]) -> str | None:
    """Steps 2-3 for ``trials``; returns a verifier error or None."""
    for t in trials:
        rec = run.cand_trial(t.key)
        if rec is None:
            continue
        for v in rec.get("violations", []):
            f.add(
                v.get("kind", "output-contract"),
                f"[{t.case}, seed {t.seed}] {v.get('message')}",
                output=v.get("output"),
                case=t.case,
            )
        if run.ref_trial(t.key) is None:
            why = run.ref.message() if run.ref is not None else "it did not run"
            return f"the reference worker produced no trial {t.key} (verifier problem): {why}"
        try:
            cand = run.load_cand(t.key)
            ref = run.load_ref(t.key)
        except (FileNotFoundError, RuntimeError, OSError) as e:
            return f"trial {t.key}: cannot load the saved tensors: {e}"
        for name, ref_in in ref["inputs"].items():
            before, after = cand["inputs_before"].get(name), cand["inputs_after"].get(name)
            if before is None or not bitwise_equal(before, ref_in):
                return (
                    f"input {name!r} of trial {t.key} differs between the two workers before the call: "
                    "input generation is not deterministic (verifier bug)"
                )
            if after is None or not bitwise_equal(after, ref_in):
                n = int((after != ref_in).sum()) if after is not None and after.shape == ref_in.shape else -1
                f.add(
                    "input-mutated",
                    f"input {name!r} [{t.case}, seed {t.seed}] was modified by the call "
                    f"({n if n >= 0 else 'all'} of {ref_in.numel()} elements changed); inputs are read-only",
                    output=name,
                    case=t.case,
                )
    return None


def _launch_check(loaded: LoadedSpec, run: GpuRun, f: FindingSet, metrics: dict[str, Any]) -> str | None:
    """Judge the worker's launch counts: one ``launches`` record per correctness shape (one
    in older workers); ``metrics.launches`` is the first shape's count, ``launches_by_case``
    every shape's. Returns why the counts could not be taken (a verifier problem), or None."""
    recs = run.cand_part("launches")
    if not recs:
        return None
    limit, gemm_limit = loaded.spec.entry.max_launches, loaded.spec.entry.max_gemm_launches
    first = recs[0]
    metrics.update(
        launches=first.get("count"),
        max_launches=limit,
        kernels=first.get("kernels", []),
        gemm_launches=gemm_launches(first.get("kernels") or []),
        max_gemm_launches=gemm_limit,
    )
    if first.get("count") is None:
        if str(first.get("reason", "")).startswith("CPU"):
            return None
        return f"cannot count kernel launches: {first.get('reason')}"
    metrics["launches_by_case"] = {str(r.get("case") or r.get("key")): r.get("count") for r in recs}
    for r in recs:
        count, at = r.get("count"), f" at {r['case']}" if r.get("case") else ""
        if count == 0:
            f.add(
                "no-launches",
                f"the profiler saw no GPU kernel in one call of the entry point{at}: outputs "
                "were not computed on the GPU by this call (cached or computed elsewhere)",
                case=r.get("case"),
            )
        elif isinstance(count, int) and count > limit:
            names = ", ".join(r.get("kernels", [])[:8])
            f.add(
                "too-many-launches",
                f"one call{at} launched {count} GPU kernels, at most {limit} allowed "
                f"(a fused op is one kernel); kernels: {names}",
                case=r.get("case"),
            )
        unnamed, over = gemm_problems(loaded, count, r.get("kernels") or [], at)
        if unnamed:
            return f"cannot count GEMM launches: {unnamed} (verifier bug)"
        if over:
            f.add("too-many-gemm-launches", over, case=r.get("case"))
    return None


def gemm_problems(
    loaded: LoadedSpec, count: Any, names: list[str], where: str, kept: int | None = None
) -> tuple[str | None, str | None]:
    """``(unnamed, over)`` for one counted call: why the GEMMs among its launches cannot be
    counted (its record names fewer than ``count`` kernels, or than ``kept`` when the record
    keeps only that many), and why they exceed ``entry.max_gemm_launches``; None each when
    fine. ``where`` is put after "one call" (e.g. " at aligned"). Shared by the correctness
    stage and the bench stage (``launches-at-bench-shape``)."""
    limit = loaded.spec.entry.max_gemm_launches
    need = count if kept is None or not isinstance(count, int) else min(count, kept)
    unnamed = (
        (
            f"the launch record of one call{where} names {len(names)} of its {count} kernels: the GEMMs among "
            "them cannot be counted"
        )
        if isinstance(need, int) and len(names) < need
        else None
    )
    gemms = gemm_launches(names)
    over = (
        (
            f"one call{where} launched {gemms} GEMM kernels, at most {limit} allowed (entry.max_gemm_launches, "
            "judged at every correctness and benchmark shape): the epilogue must do its work on the GEMM's own "
            "output tile, not in a second pass over a stored result"
        )
        if gemms > limit
        else None
    )
    return unnamed, over


def _workspace_check(loaded: LoadedSpec, run: GpuRun, f: FindingSet, metrics: dict[str, Any]) -> None:
    """Judge the workspace (``verifier/gpu/device_memory.py``) of every correctness trial and
    fresh-seed recheck (``trial``/``recheck`` records) and of the counted calls
    (``launches`` records) against the spec's budget at the trial's dims: one
    ``workspace-over-budget`` finding per shape case, at its largest workspace.
    ``metrics.workspace_by_case`` keeps that largest value per case."""
    runs = {t.key: t for t in (*run.plan.correctness_runs, *run.plan.recheck_runs) if not t.sample}
    worst: dict[str, tuple[int, Any]] = {}
    for r in (*run.cand_part("launches"), *run.cand_part("trial"), *run.cand_part("recheck")):
        t, ws = runs.get(str(r.get("key"))), r.get("workspace_bytes")
        if t is None or not isinstance(ws, int):
            continue
        if t.case not in worst or ws > worst[t.case][0]:
            worst[t.case] = (ws, t)
    for case, (ws, t) in worst.items():
        msg = workspace_problem(loaded, t.dims, ws, f"one call at {case}")
        if msg:
            f.add("workspace-over-budget", msg, case=case)
    if worst:
        metrics["workspace_by_case"] = {c: ws for c, (ws, _) in worst.items()}


def workspace_problem(loaded: LoadedSpec, dims: dict[str, int], workspace: int, where: str) -> str | None:
    """Why ``workspace`` bytes (``verifier/gpu/device_memory.py``) exceed the spec's budget at
    ``dims``, or None. Shared by the correctness stage and the bench stage
    (``workspace-at-bench-shape``)."""
    budget, rule = loaded.spec.workspace_budget(dims)
    if workspace <= budget:
        return None
    return (
        f"{where} held {workspace / 2**20:.1f} MiB of device memory beyond its inputs and outputs, over the "
        f"budget of {budget / 2**20:.1f} MiB ({rule}): a fused op keeps per-tile partials, not a "
        "GEMM-sized intermediate (such as the logits or an (M, N) activation) in global memory"
    )


def store_recheck(metrics: dict[str, Any], t: Run, by_trial: dict[str, Any]) -> None:
    """File a post-timing trial's metrics: a benchmark-shape or timed-call check
    (``t.sample``) under ``bench_checks[<case>]``, the fresh-seed recheck as ``recheck``."""
    if t.sample:
        metrics.setdefault("bench_checks", {})[t.case] = by_trial.get(t.key, {})
    else:
        metrics["recheck"] = by_trial.get(t.key, {})


def _prologue(run: GpuRun, stage: Stage) -> StageResult | None:
    """Worker-level outcomes that decide the stage before any tensor is compared."""
    if run.cand.records_lost:  # the parent failed to keep the records (a full disk): nothing can be judged
        return StageResult(
            stage=stage,
            status="error",
            summary="the verifier lost the candidate worker's records",
            findings=[Finding(kind="verifier-error", message=run.cand.records_lost)],
        )
    if run.cand.record_anomalies:  # only code in the worker's process writes its records
        return StageResult(
            stage=stage,
            status="fail",
            summary="records the worker did not write",
            findings=[
                Finding(
                    kind="harness-tampered",
                    message=(
                        "the candidate worker's results hold records its own code does not write "
                        "(candidate code wrote into the results pipe): " + "; ".join(run.cand.record_anomalies[:5])
                    ),
                )
            ],
        )
    setup = run.setup
    if setup is not None and not setup.get("ok") and setup.get("error") == "not-hopper":
        return StageResult(
            stage=stage,
            status="error",
            summary="not a Hopper GPU: not verified",
            findings=[Finding(kind="not-hopper", message=str(setup.get("message")))],
        )
    if setup is None or not setup.get("ok"):
        found = (
            Finding(
                kind=str(setup.get("error")), message=f"{setup.get('message')} (worker sandbox: {setup.get('sandbox')})"
            )
            if setup is not None and setup.get("message")
            else failure_finding(run.cand)
        )
        return StageResult(
            stage=stage,
            status="error",
            summary="candidate worker failed during setup (verifier problem)",
            findings=[found],
        )
    if run.scratch_bytes > SCRATCH_BUDGET:
        return StageResult(
            stage=stage,
            status="fail",
            summary="the candidate filled its scratch folder",
            findings=[
                Finding(
                    kind="scratch-over-budget",
                    message=f"the candidate worker left {run.scratch_bytes / 2**30:.1f} GiB in its "
                    f"scratch folder (budget {SCRATCH_BUDGET / 2**30:.0f} GiB): candidate code wrote files",
                )
            ],
        )
    tampered = run.tampered_trial_files()
    if tampered:
        return StageResult(
            stage=stage,
            status="fail",
            summary="saved trial files were changed after the worker wrote them",
            findings=[
                Finding(
                    kind="tampered-trial-file",
                    message=f"the saved tensors of trial(s) {', '.join(tampered)} no longer match the "
                    "sha256 the worker recorded: candidate code rewrote them",
                )
            ],
        )
    # Inputs are drawn once for every case before the candidate is imported; only a failure
    # there is the verifier's (a later one is charged to the candidate by the worker).
    errs = run.cand_part("error")
    if errs and errs[-1].get("verifier"):
        if any(r.get("what") == "import" for r in run.cand_part("begin")):
            # the worker marks an error as the verifier's only before it imports the candidate;
            # after that, such a record is the candidate's own (a forged one would stall the
            # loop, which never charges a verifier error to the attempt)
            return StageResult(
                stage=stage,
                status="fail",
                summary="the candidate forged a verifier-error record",
                findings=[
                    Finding(
                        kind="harness-tampered",
                        message="a record claiming a verifier "
                        "problem came after the candidate was imported: only the worker's "
                        "input draw, before the import, can fail as the verifier's",
                    )
                ],
            )
        msg = f"the candidate worker could not draw the inputs (verifier/spec problem): {str(errs[-1].get('message', ''))[-1500:]}"
        return StageResult(
            stage=stage,
            status="error",
            summary="input generation failed (verifier problem)",
            findings=[Finding(kind="verifier-error", message=msg)],
        )
    imp = run.cand_part("import")
    if not imp:
        return StageResult(
            stage=stage,
            status="fail",
            summary="the candidate failed to import on the GPU",
            findings=[failure_finding(run.cand)],
        )
    if imp[-1].get("tampered"):
        return StageResult(
            stage=stage,
            status="fail",
            summary="the candidate replaced the verifier's instruments",
            findings=[
                Finding(
                    kind="harness-tampered",
                    message=f"importing the candidate replaced: {', '.join(imp[-1]['tampered'])}",
                )
            ],
        )
    return None


def correctness_stage(loaded: LoadedSpec, run: GpuRun) -> StageResult:
    """Build the ``correctness`` StageResult (see module doc). Never raises for candidate behaviour."""
    t0 = time.monotonic()
    pre = _prologue(run, "correctness")
    if pre is not None:
        pre.duration_s = time.monotonic() - t0
        return pre
    for who, recs, want in (
        ("candidate", run.cand_part("setup"), run.cand_plan_sha256 or run.plan.sha256()),
        ("reference", run.ref_part("setup"), run.plan.sha256()),
    ):
        if recs and recs[-1].get("plan_sha256") not in (None, want):
            msg = f"the {who} worker ran a different plan than the parent wrote (plan hash mismatch)"
            return stage_result("correctness", "error", msg, [Finding(kind="verifier-error", message=msg)], {}, t0)
    f = FindingSet()
    metrics: dict[str, Any] = {}
    trials = run.plan.correctness_runs
    done = [t for t in trials if run.cand_trial(t.key) is not None]
    if len(done) < len(trials):
        missing = trials[len(done)]
        f.add(*_outcome_kind_msg(run, f"trial {missing.case}, seed {missing.seed}"), case=missing.case)
    err = _contract_checks(loaded, run, f, done)
    if err:
        return stage_result(
            "correctness", "error", err, f.items + [Finding(kind="verifier-error", message=err)], metrics, t0
        )
    by_trial, err = check_outputs(loaded, run, loaded.spec.value_outputs, done, f)
    if err:
        return stage_result(
            "correctness", "error", err, f.items + [Finding(kind="verifier-error", message=err)], metrics, t0
        )
    metrics["trials"] = by_trial
    metrics["worst"] = worst(by_trial)
    metrics["cases"] = [
        {"key": t.key, "case": t.case, "dims": t.dims, "draw": t.draw, "seed": t.seed, "sampled": t.sample}
        for t in trials
    ]
    secret = {t.key for t in trials if t.key.startswith(COVERAGE_KEY_PREFIX)}
    if secret:
        metrics["coverage_s"] = run.trial_seconds(secret)
        metrics["trials_s"] = run.trial_seconds({t.key for t in trials})
    err = _launch_check(loaded, run, f, metrics)
    if err:
        return stage_result("correctness", "error", err, f.items, metrics, t0)
    _workspace_check(loaded, run, f, metrics)
    # post-timing recheck
    for t in run.plan.recheck_runs:
        rec = run.cand_trial(t.key)
        if rec is None:
            died = run.cand.died_in or ""
            if died.startswith("recheck") or (not died.startswith("bench") and run.cand.status != "ok"):
                kind, msg = _outcome_kind_msg(run, f"the post-timing recheck ({t.case}, seed {t.seed})")
                f.add(kind, msg, case=t.case)
            continue
        err = _contract_checks(loaded, run, f, [t])
        if err:
            return stage_result("correctness", "error", err, f.items, metrics, t0)
        # a bench-shape check (t.sample) is judged like any trial: its failures are the kernel
        # being wrong at a timed shape, not drift
        rm, err = check_outputs(loaded, run, loaded.spec.value_outputs, [t], f, drift=not t.sample)
        if err:
            return stage_result("correctness", "error", err, f.items, metrics, t0)
        store_recheck(metrics, t, rm)
    integ = run.cand_part("integrity")
    if integ and integ[-1].get("tampered"):
        f.add("harness-tampered", f"during the run the candidate replaced: {', '.join(integ[-1]['tampered'])}")
    status = "fail" if f.items else "pass"
    if status == "pass":
        w = metrics["worst"]
        if w:
            n_secret = sum(1 for t in done if t.key.startswith(COVERAGE_KEY_PREFIX))
            summary = (
                f"{len(done)} trials ({n_secret} secret coverage cases) x {len(w)} output(s) within every "
                f"numerics rule; worst {max(w.items(), key=lambda kv: kv[1]['ratio'])[0]} at "
                f"{max(m['ratio'] for m in w.values()):.2f} of its bound"
            )
        else:  # every output is a gradient: compared by the gradients stage
            summary = f"{len(done)} trials: outputs well-formed (all are gradients, compared in the gradients stage)"
        if metrics.get("launches") is not None:
            summary += f"; {metrics['launches']} launch(es)"
    else:
        kinds = sorted({x.kind for x in f.items})
        summary = f"{len(f.items)} problem(s): {', '.join(kinds)}"
    return stage_result("correctness", status, summary, f.items, metrics, t0)


def _outcome_kind_msg(run: GpuRun, what: str) -> tuple[str, str]:
    fd = failure_finding(run.cand)
    if run.cand.status == "ok":
        return "crash", f"the candidate worker ended without finishing {what}"
    return fd.kind, f"{what}: {fd.message}"


def stage_result(
    stage: Stage, status: Status, summary: str, findings: list[Finding], metrics: dict[str, Any], t0: float
) -> StageResult:
    return StageResult(
        stage=stage,
        status=status,
        summary=summary,
        findings=findings,
        metrics=jsonable(metrics),
        duration_s=time.monotonic() - t0,
    )

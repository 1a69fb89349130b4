"""The ``gradients`` stage: outputs declared as gradients, checked against torch.autograd.

Why a stage of its own: a backward kernel's hand-derived formula (e.g. dSwiGLU) is the
part most likely to be subtly wrong, and the reference for it is not written by hand
at all -- the reference worker differentiates ``reference.<of>`` with
``torch.autograd.grad`` (fp32-upcast for ``ref32``, low precision for ``ref_lowp``).
The comparison itself is the correctness stage's (:func:`~coda_agent.verifier.stages.correctness.check_outputs`:
stale memory, sanity, CODA tolerance with a diagnosis, and the post-timing recheck as
``drift-after-timing``); contract violations, input mutation and launches were
already judged by the correctness stage, which runs first.

A spec without gradient outputs gets ``status="skip"`` with a summary saying so.
"""

from __future__ import annotations

import time

from ..gpu.results import GpuRun
from ..spec import LoadedSpec
from ..verdict import Finding, StageResult
from .correctness import FindingSet, check_outputs, stage_result, store_recheck, worst


def gradients_stage(loaded: LoadedSpec, run: GpuRun) -> StageResult:
    """Build the ``gradients`` StageResult from the saved tensors. Never raises for candidate behaviour."""
    t0 = time.monotonic()
    outputs = loaded.spec.gradient_outputs
    if not outputs:
        return StageResult(
            stage="gradients", status="skip", summary="the spec declares no gradient outputs: nothing to check"
        )
    f = FindingSet()
    trials = [t for t in run.plan.correctness_runs if run.cand_trial(t.key) is not None]
    by_trial, err = check_outputs(loaded, run, outputs, trials, f)
    if err:
        return stage_result("gradients", "error", err, f.items + [Finding(kind="verifier-error", message=err)], {}, t0)
    metrics = {
        "trials": by_trial,
        "worst": worst(by_trial),
        "gradient_of": {o.name: o.gradient.model_dump() for o in outputs if o.gradient},
    }
    for t in run.plan.recheck_runs:
        if run.cand_trial(t.key) is None:
            continue
        rm, err = check_outputs(loaded, run, outputs, [t], f, drift=not t.sample)
        if err:
            return stage_result("gradients", "error", err, f.items, metrics, t0)
        store_recheck(metrics, t, rm)
    if f.items:
        summary = f"{len(f.items)} problem(s): {', '.join(sorted({x.kind for x in f.items}))}"
        return stage_result("gradients", "fail", summary, f.items, metrics, t0)
    w = metrics["worst"]
    summary = f"{len(trials)} trials x {len(outputs)} gradient output(s) match torch.autograd" + (
        f"; worst at {max(m['ratio'] for m in w.values()):.2f} of allowed" if w else ""
    )
    return stage_result("gradients", "pass", summary, f.items, metrics, t0)

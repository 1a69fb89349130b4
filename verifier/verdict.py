"""Structured results of the verifier: one :class:`StageResult` per stage, one :class:`Verdict`.

Every stage is a pure function ``(inputs) -> StageResult``; the pipeline stops at the
first stage that does not pass. The same objects are rendered three ways: a rich table
(the CLI's commands/), the feedback text of the repair prompt (verifier/feedback.py) and
JSON on disk (``verdict.json`` in a run directory, ``manifest.json`` of an accepted
kernel), always with sorted keys so diffs stay reviewable.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

Stage = Literal["static", "compile", "correctness", "gradients", "bench", "accept"]
STAGES: tuple[str, ...] = ("static", "compile", "correctness", "gradients", "bench", "accept")
Status = Literal["pass", "fail", "skip", "error"]


class Finding(BaseModel):
    """One problem (or observation) found by a stage.

    ``line`` is the 1-based line in the candidate file when the finding points at code;
    ``output``/``case`` name the tensor and the shape case for numerical findings.
    """

    kind: str = Field(description="machine-readable tag, e.g. 'banned-import', 'tolerance'")
    message: str
    line: int | None = None
    output: str | None = None
    case: str | None = None


class StageResult(BaseModel):
    """The outcome of one stage. ``metrics`` holds numbers (errors, times) by name."""

    stage: Stage
    status: Status
    summary: str = ""
    findings: list[Finding] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "skip")


class Environment(BaseModel):
    """Where a verdict was produced: GPU (None when CPU-only), driver and versions."""

    gpu: str | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    cutlass_dsl: str | None = None
    quack: str | None = None
    python: str | None = None
    hostname: str | None = None
    worker_sandbox: str | None = Field(
        default=None,
        description="how the candidate worker was confined (verifier/confine/landlock.py), e.g. "
        "'landlock ABI 7: writes only beneath 2 folder(s); ...', or 'unavailable: <why>'",
    )
    placement: str | None = Field(
        default=None,
        description="where the scheduler ran the GPU stages (verifier/schedule/): the GPU, alone or "
        "shared, the memory budget, and any re-run with its reason; None: not scheduled",
    )


class Verdict(BaseModel):
    """The verifier's word on one candidate for one spec.

    ``accepted_ready`` is true only when every stage through ``bench`` passed *on a GPU*;
    a CPU-only verdict can pass static + compile but is never "verified".
    """

    spec: str
    spec_hash: str
    candidate_hash: str
    stages: list[StageResult] = Field(default_factory=list)
    environment: Environment = Field(default_factory=Environment)
    cpu_only: bool = False
    started_at: str = ""
    wall_s: float = 0.0
    tuning: dict[str, dict[str, dict[str, Any]]] | None = None
    """GEMM configs the candidate ran with in place of its own, ``{epilogue: {shape bucket:
    GemmConfig fields}}`` (``coda-agent tune``'s re-verification); None: its own configs."""

    @property
    def failed_stage(self) -> StageResult | None:
        return next((s for s in self.stages if not s.ok), None)

    @property
    def verifier_error(self) -> StageResult | None:
        """The failed stage when it failed as ``error``: the verifier or the machine failed,
        not the candidate (no attempt is spent on it, ``verify`` exits 2); else None."""
        failed = self.failed_stage
        return failed if failed is not None and failed.status == "error" else None

    @property
    def passed(self) -> bool:
        return self.failed_stage is None and bool(self.stages)

    @property
    def gpu_verified(self) -> bool:
        done = {s.stage for s in self.stages if s.status == "pass"}
        return self.passed and not self.cpu_only and {"correctness", "bench"} <= done

    @property
    def gpu_correct(self) -> bool:
        """Passed, with the correctness stage run and passed on a GPU (the benchmark may be
        skipped: ``--no-bench``)."""
        c = self.stage("correctness")
        return self.passed and not self.cpu_only and c is not None and c.status == "pass"

    def done_as_asked(self, *, cpu_only: bool, bench: bool) -> bool:
        """Whether the run did what was asked of it: GPU-verified; or, under ``cpu_only``,
        every stage that ran passed; or, without ``bench``, correct on a GPU. The exit
        status 0 of ``verify`` (CLI and ``python -m coda_agent.verifier.pipeline``)."""
        if cpu_only:
            return self.passed
        return self.gpu_verified or (not bench and self.gpu_correct)

    @property
    def outcome(self) -> str:
        """One word for what this verdict establishes, for scripts (``verify --json``):
        ``verifier-error`` (the verifier or machine failed; nothing is known of the
        candidate), ``rejected`` (a stage failed), ``gpu-verified`` (every stage through the
        benchmark passed on a GPU: what acceptance needs), ``gpu-correct`` (correct on a GPU,
        benchmark not run: ``--no-bench``), ``cpu-checks-passed`` (every stage that ran
        passed but the GPU stages did not run: ``--cpu-only`` or no GPU; not verified)."""
        if self.verifier_error is not None:
            return "verifier-error"
        if not self.passed:
            return "rejected"
        if self.gpu_verified:
            return "gpu-verified"
        if self.gpu_correct:
            return "gpu-correct"
        return "cpu-checks-passed"

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    @property
    def furthest_stage(self) -> str:
        """The last stage that actually ran, skipped ones not counted (for run summaries)."""
        ran = [s.stage for s in self.stages if s.status != "skip"]
        return ran[-1] if ran else "none"

    def to_json(self, outcome: bool = False) -> str:
        """The verdict as JSON (sorted keys). ``outcome=True`` (``verify --json``) adds the
        derived top-level fields a script reads first: ``outcome`` (:attr:`outcome`),
        ``passed`` (every stage that ran passed: true for a CPU-only run too, so read
        ``outcome`` or ``gpu_verified`` to know whether the kernel was verified),
        ``gpu_verified`` and ``failed_stage`` (the first stage that did not pass, or null);
        loading ignores them."""
        d = self.model_dump(mode="json")
        if outcome:
            failed = self.failed_stage
            d.update(
                outcome=self.outcome,
                passed=self.passed,
                gpu_verified=self.gpu_verified,
                failed_stage=failed.stage if failed else None,
            )
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

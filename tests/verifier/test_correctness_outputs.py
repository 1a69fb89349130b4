"""The parent's numerical comparison never passes an output it could not compare."""

from pathlib import Path

import torch

from coda_agent.verifier.gpu.protocol import Run
from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.stages.correctness import FindingSet, check_outputs

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")


class _Run:
    """The three GpuRun methods check_outputs reads, over in-memory trial data."""

    def __init__(self, cand_outputs, ref32, violations=()):
        self.cand_outputs, self.ref32, self.violations = cand_outputs, ref32, list(violations)

    def cand_trial(self, key):
        return {"key": key, "violations": self.violations}

    def load_cand(self, key):
        return {"outputs": self.cand_outputs, "inputs_before": {}, "inputs_after": {}}

    def load_ref(self, key):
        return {"inputs": {}, "ref32": self.ref32, "ref_lowp": {}}


def test_an_output_saved_as_nothing_or_misshapen_without_a_violation_is_a_finding():
    t = Run(key="k", case="timed-loop s #0", dims={"M": 4, "K": 8, "I": 2}, seed=1, recheck=True, sample=16)
    ref = {"preact": torch.ones(16), "postact": torch.ones(16)}
    good = torch.ones(16, dtype=torch.bfloat16)
    f = FindingSet()
    metrics, err = check_outputs(FWD, _Run({"preact": None, "postact": good[:3]}, ref), FWD.spec.value_outputs, [t], f)
    assert err is None and metrics["k"] == {}
    assert sorted((x.kind, x.output) for x in f.items) == [("output-missing", "postact"), ("output-missing", "preact")]
    # an output whose contract violation is already recorded is not reported twice
    f = FindingSet()
    viol = [{"kind": "output-dtype", "output": "preact"}]
    check_outputs(FWD, _Run({"preact": None, "postact": good}, ref, viol), FWD.spec.value_outputs, [t], f)
    assert [x.kind for x in f.items] == []

"""Helpers shared by the agent tests (imported by conftest.py and the test modules).

The workspace copies the real ``kernel_specs/`` and adds fake primitive docs, accepted
kernels (one of them the target's own, which must never leak into its prompt) and a
tricks log, each carrying a unique marker string the tests look for.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from coda_agent.verifier.verdict import Environment, Finding, StageResult, Verdict

REPO = Path(__file__).resolve().parents[2]

OWN_MARKER = "OWN_KERNEL_LEAK_MARKER_7f3a"
BWD_MARKER = "BWD_EXAMPLE_MARKER_91c2"
GELU_MARKER = "GELU_EXAMPLE_MARKER_55d0"
RMS_MARKER = "RMS_EXAMPLE_MARKER_0b7e"
DOC_MARKER = "DOC_MARKER_GEMM_EPILOGUE_3e1d"
DOC2_MARKER = "DOC_MARKER_MATH_88aa"
TRICK_MARKER = "TRICK_MARKER_ragged_tiles_4411"


def _kernel(marker: str, fn: str, mode: str | None = None) -> str:
    m = f', mode="{mode}"' if mode else ""
    return (
        f"# {marker}\n"
        "from quack.epilogue import gemm_epilogue\n\n\n"
        f'@gemm_epilogue(outputs=("postact",){m})\n'
        "def epi(acc):\n"
        '    return {"postact": acc}\n\n\n'
        f"def {fn}(a, b):\n"
        "    return epi(a, b.T)\n"
    )


def build_workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(REPO / "kernel_specs", root / "kernel_specs")
    docs = root / "primitives_docs"
    docs.mkdir(parents=True)
    (docs / "10_math.md").write_text(f"# Math helpers\n\n{DOC2_MARKER}: `unpack(acc)` splits pairs.\n")
    (docs / "00_gemm_epilogue.md").write_text(
        f"# @gemm_epilogue\n\n{DOC_MARKER}\n\n```python\n@gemm_epilogue()\ndef f(acc):\n    return {{'D': acc}}\n```\n"
    )
    gk = root / "generated_kernels"
    gk.mkdir()
    (gk / "__init__.py").write_text('"""accepted kernels"""\n')
    kernels = {
        # the target's own accepted kernel: must never appear in its prompt
        "swiglu_fwd": (
            OWN_MARKER,
            "swiglu_fwd",
            "acc_pair",
            {"spec": "swiglu_fwd", "pattern": "forward", "catalogue_item": 1},
        ),
        "swiglu_bwd": (
            BWD_MARKER,
            "swiglu_bwd",
            "packed_cd_b16x2",
            {"spec": "swiglu_bwd", "pattern": "backward", "catalogue_item": 7},
        ),
        "gelu_fwd": (
            GELU_MARKER,
            "gelu_fwd",
            None,
            {
                "spec": "gelu_fwd",
                "pattern": "forward",
                "catalogue_item": 2,
                "description": "GEMM fused with a GELU activation epilogue on the accumulator.",
            },
        ),
        "rms_bwd": (
            RMS_MARKER,
            "rms_bwd",
            None,
            {
                "spec": "rms_bwd",
                "pattern": "backward",
                "description": "Backward of an RMS norm scale folded into a dgrad GEMM.",
            },
        ),
    }
    for name, (marker, fn, mode, manifest) in kernels.items():
        d = gk / name
        d.mkdir()
        (d / "kernel.py").write_text(_kernel(marker, fn, mode))
        # what accept() records and the prompt's examples require (context.gather_examples)
        manifest = {**manifest, "gpu_verified": True, "kernel_sha256": _hash(d / "kernel.py")}
        (d / "manifest.json").write_text(json.dumps(manifest))
    (root / "tricks_log.md").write_text(
        "# Tricks log\n\n"
        f"- **2026-01-10** `swiglu_fwd`: {TRICK_MARKER}: NaN in the last N tile -> write every output column.\n"
    )
    return root


def _hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


FAIL_MESSAGE = "postact: max |out - ref32| = 0.75 exceeds the bound 0.0123 (ragged N tile never written)"


def make_verdict(loaded, candidate: Path, *, passed: bool, cpu_only: bool = False) -> Verdict:
    """A real Verdict: all stages pass, or correctness fails with FAIL_MESSAGE."""
    stages = [
        StageResult(stage="static", status="pass", summary="ok"),
        StageResult(stage="compile", status="pass", summary="compiled for sm_90a"),
    ]
    if cpu_only:
        stages += [StageResult(stage="correctness", status="skip", summary="no GPU")]
    elif passed:
        stages += [
            StageResult(stage="correctness", status="pass", summary="all cases within tolerance"),
            StageResult(stage="gradients", status="skip", summary="no gradient outputs"),
            StageResult(stage="bench", status="pass", summary="0.99x bare_gemm", metrics={"ratio_bare_gemm": 0.99}),
        ]
    else:
        stages += [
            StageResult(
                stage="correctness",
                status="fail",
                summary="1 output out of tolerance",
                findings=[Finding(kind="tolerance", message=FAIL_MESSAGE, output="postact", case="ragged-all", line=9)],
            )
        ]
    return Verdict(
        spec=loaded.name,
        spec_hash=loaded.spec_hash,
        candidate_hash=_hash(candidate),
        stages=stages,
        cpu_only=cpu_only,
        # as a confined GPU worker records it (acceptance refuses unconfined verdicts)
        environment=Environment(worker_sandbox=None if cpu_only else "landlock ABI 7 (test)"),
    )


class FakeVerifier:
    """Passes a candidate containing ``# FIXED``; records every call."""

    def __init__(self, cpu_only: bool = False, raise_on_call: dict[int, BaseException] | None = None):
        self.calls: list[tuple[str, Path, Path]] = []
        self.cpu_only = cpu_only
        self.raise_on_call = raise_on_call or {}

    def __call__(self, loaded, candidate: Path, workdir: Path) -> Verdict:
        self.calls.append((loaded.name, Path(candidate), Path(workdir)))
        n = len(self.calls)
        if n in self.raise_on_call:
            raise self.raise_on_call[n]
        src = Path(candidate).read_text()
        return make_verdict(loaded, Path(candidate), passed="# FIXED" in src, cpu_only=self.cpu_only)


BAD_MODULE = _kernel("attempt one", "swiglu_fwd", "acc_pair")
GOOD_MODULE = "# FIXED: write the ragged tile\n" + _kernel("attempt two", "swiglu_fwd", "acc_pair")


def reply(module: str, prose: str = "Here is the module.") -> str:
    return f"{prose}\n\n```python\n{module}```\n\nThis fuses the epilogue.\n"

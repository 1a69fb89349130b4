"""verifier/progress.py: what long commands report while they work, and that reporting
never changes a result."""

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from verifier_helpers import stub_static_compile as stub_stages

from coda_agent.verifier import progress
from coda_agent.verifier.pipeline import verify
from coda_agent.verifier.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd")

GOOD_FWD = """
import torch

def swiglu_fwd(x, w1):
    pre = x.float() @ w1.float().T
    post = torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
    return pre.to(torch.bfloat16), post.to(torch.bfloat16)
"""


class Recorder:
    def __init__(self):
        self.events = []

    def started(self, what):
        self.events.append(("started", what))

    def ended(self, what, outcome, seconds):
        assert seconds >= 0
        self.events.append(("ended", what, outcome))

    def item(self, index, total, name):
        self.events.append(("item", index, total, name))

    def note(self, text):
        self.events.append(("note", text))


def test_steps_items_and_notes_reach_the_installed_reporter():
    rec = Recorder()
    with progress.reporting(rec):
        progress.item(2, 5, "swiglu_fwd")
        with progress.step("static"):
            pass
        with progress.step("compile") as s:
            s.outcome = "fail"
        with pytest.raises(RuntimeError), progress.step("workers"):
            raise RuntimeError("boom")
        progress.note("done")
    assert rec.events == [
        ("item", 2, 5, "swiglu_fwd"),
        ("started", "static"),
        ("ended", "static", "done"),
        ("started", "compile"),
        ("ended", "compile", "fail"),
        ("started", "workers"),
        ("ended", "workers", "interrupted"),
        ("note", "done"),
    ]


def test_nothing_is_reported_without_a_reporter_and_the_previous_one_comes_back():
    outer, inner = Recorder(), Recorder()
    with progress.reporting(outer):
        with progress.reporting(None):
            progress.note("unseen")
        with progress.reporting(inner):
            progress.note("inner")
        progress.note("outer")
    progress.note("after")  # no reporter: nothing, no error
    assert inner.events == [("note", "inner")] and outer.events == [("note", "outer")]


def test_a_failing_reporter_is_switched_off_not_raised():
    class Broken(Recorder):
        def started(self, what):
            raise OSError("terminal gone")

    b = Broken()
    with progress.reporting(b):
        with progress.step("static") as s:
            s.outcome = "pass"
        progress.note("later")
    assert b.events == []  # switched off at the first failure; the block still ran


@pytest.mark.slow
def test_verify_reports_each_stage_with_its_outcome(tmp_path, monkeypatch):
    stub_stages(monkeypatch)
    cand = tmp_path / "cand.py"
    cand.write_text(textwrap.dedent(GOOD_FWD))
    rec = Recorder()
    with progress.reporting(rec):
        v = verify(
            FWD, cand, device="cpu", bench=False, baselines=["torch_eager"], workdir=tmp_path / "w", timeout_s=120
        )
    ended = {e[1]: e[2] for e in rec.events if e[0] == "ended"}
    assert ended["static"] == "pass" and ended["compile (sm_90a)"] == "pass"
    cand_step = next(k for k in ended if k.startswith("candidate worker"))
    ref_step = next(k for k in ended if k.startswith("reference worker"))
    assert ended[cand_step] == "ok" and ended[ref_step] == "ok"
    judged = ended["judging correctness, gradients, benchmark"]
    assert "correctness pass" in judged, judged
    # every step that started ended, in order
    starts = [e[1] for e in rec.events if e[0] == "started"]
    assert starts == [e[1] for e in rec.events if e[0] == "ended"]
    assert v.passed


def test_rich_reporter_leaves_one_line_per_finished_step():
    from rich.console import Console

    buf = io.StringIO()
    with progress.RichReporter(Console(file=buf, force_terminal=False, width=120)) as r, progress.reporting(r):
        progress.item(1, 2, "gemm_rmsnorm")
        with progress.step("compile (sm_90a)") as s:
            s.outcome = "pass"
    text = buf.getvalue()
    assert "[1/2] gemm_rmsnorm" in text
    assert "compile (sm_90a): pass" in text and " s" in text


def test_cli_is_quiet_when_stderr_is_not_a_terminal_or_with_quiet():
    from coda_agent import cli

    assert cli.build_parser().parse_args(["verify", "a", "b.py", "--quiet"]).quiet
    assert cli.build_parser().parse_args(["regress", "-q"]).quiet
    # a piped run of a command with steps prints no progress lines
    out = subprocess.run(
        [sys.executable, "-m", "coda_agent", "verify", "swiglu_fwd", "missing.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "candidate file not found" in out.stderr
    assert "static:" not in out.stderr and "\x1b[" not in out.stderr

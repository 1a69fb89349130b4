"""`coda-agent verify SPEC FILE FILE ...` (several candidates, one verdict each) and the
flags of the scheduler (`--ray`), without a GPU. The scheduler itself:
tests/verifier/test_schedule_*.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coda_agent.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ws(tmp_path, monkeypatch):
    for d in ("kernel_specs", "primitives_docs", "generated_kernels"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tricks_log.md", tmp_path / "tricks_log.md")
    monkeypatch.setenv("CODA_ROOT", str(tmp_path))
    return tmp_path


def _bad(ws: Path, name: str, body: str) -> Path:
    p = ws / name
    p.write_text(body)
    return p


def test_several_files_one_verdict_each_and_a_json_list(ws, capsys):
    a = _bad(ws, "a.py", "import os\n")  # a banned import: the static stage rejects it
    b = _bad(ws, "b.py", "import torch\ndef f(:\n")  # a syntax error
    out = ws / "verdicts.json"
    assert main(["verify", "swiglu_fwd", str(a), str(b), "--cpu-only", "--json", str(out)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "verdicts (CPU stages only)" in text
    assert "a.py" in text and "b.py" in text and text.count("rejected") >= 2
    items = json.loads(out.read_text())
    assert [Path(i["file"]).name for i in items] == ["a.py", "b.py"]
    assert [i["outcome"] for i in items] == ["rejected", "rejected"]
    assert [i["failed_stage"] for i in items] == ["static", "static"]
    # its own earlier output is replaced; a list that is not verdicts is not
    assert main(["verify", "swiglu_fwd", str(a), str(b), "--cpu-only", "--json", str(out)]) == 1
    other = ws / "other.json"
    other.write_text('[{"x": 1}]')
    assert main(["verify", "swiglu_fwd", str(a), str(b), "--cpu-only", "--json", str(other)]) == 2
    assert other.read_text() == '[{"x": 1}]'


def test_several_files_usage_errors(ws, capsys):
    a = _bad(ws, "a.py", "import os\n")
    b = _bad(ws, "b.py", "import os\n")
    assert main(["verify", "swiglu_fwd", str(a), str(b), "--accept"]) == 2
    assert "--accept takes one candidate file" in capsys.readouterr().err
    assert main(["verify", "swiglu_fwd", str(a), str(ws / "." / "a.py"), "--cpu-only"]) == 2
    assert "given twice" in capsys.readouterr().err
    assert main(["verify", "swiglu_fwd", str(a), str(ws / "missing.py"), "--cpu-only"]) == 2
    assert "not found" in capsys.readouterr().err


def test_ray_without_ray_or_a_cluster_is_a_usage_error(ws, capsys, monkeypatch):
    import sys

    a = _bad(ws, "a.py", "import os\n")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    assert main(["verify", "swiglu_fwd", str(a), "--ray", "auto"]) == 2
    assert "--ray needs Ray: pip install -e '.[ray]'" in capsys.readouterr().err


def test_generate_with_candidates_writes_one_prompt_per_candidate(ws, capsys):
    assert main(["generate", "swiglu_fwd", "--llm", "manual", "--cpu-only", "--no-accept", "--candidates", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "waiting for 2 answers" in out
    (run,) = (ws / "runs").iterdir()
    assert all((run / "attempt-1" / f"candidate-{j}" / "prompt.md").is_file() for j in (1, 2))
    assert json.loads((run / "run.json").read_text())["candidates"] == 2
    assert main(["generate", "swiglu_fwd", "--llm", "manual", "--cpu-only", "--candidates", "0"]) == 2
    assert "--candidates 0: expected an integer >= 1" in capsys.readouterr().err

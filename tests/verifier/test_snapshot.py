"""verifier/confine/snapshot.py: the candidate is judged, compiled and run from one snapshot of its bytes."""

from __future__ import annotations

import hashlib
import inspect
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from coda_agent.verifier.confine.snapshot import CandidateChanged, load_module, take

HONEST = "def entry(x):\n    return x * 0  # what static and the verdict's hash judge\n"
PLANTED = "def entry(x):\n    return x + 1  # what the bytecode beside it says\n"


def _plant_unchecked_pyc(folder: Path, name: str, source: str) -> Path:
    """An unchecked-hash pyc for ``folder/name`` compiled from ``source``: the import
    system runs it without comparing it with the .py file."""
    src = folder / "_planted_src.py"
    src.write_text(source)
    tag = sys.implementation.cache_tag
    dest = folder / "__pycache__" / f"{Path(name).stem}.{tag}.pyc"
    dest.parent.mkdir(exist_ok=True)
    py_compile.compile(str(src), cfile=str(dest), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    src.unlink()
    return dest


def test_the_import_system_runs_a_planted_pyc_which_is_why_workers_do_not_use_it(tmp_path):
    """The threat, shown with plain Python: importing candidate.py by file location runs
    the planted bytecode. load_module runs the source's bytes."""
    (tmp_path / "candidate.py").write_text(HONEST)
    _plant_unchecked_pyc(tmp_path, "candidate.py", PLANTED)
    code = (
        "import importlib.util as u; s = u.spec_from_file_location('c', 'candidate.py'); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.entry(1))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "2"  # the planted bytecode ran
    mod = load_module(tmp_path / "candidate.py", "coda_snapshot_test", None)
    assert mod.entry(1) == 0


def test_take_copies_once_and_load_checks_the_hash(tmp_path):
    orig = tmp_path / "run" / "candidate.py"
    orig.parent.mkdir()
    orig.write_text(HONEST)
    _plant_unchecked_pyc(orig.parent, "candidate.py", PLANTED)
    private = tmp_path / "private"
    private.mkdir()
    snap = take(orig, private)
    assert snap.path == private / "candidate.py" and snap.text == HONEST
    assert snap.sha256 == hashlib.sha256(HONEST.encode()).hexdigest()
    assert not (private / "__pycache__").exists() and not (snap.path.stat().st_mode & 0o222)
    orig.write_text(PLANTED)  # the original changes after the snapshot: what runs does not
    mod = load_module(snap.path, "coda_snapshot_test2", snap.sha256)
    assert mod.entry(3) == 0 and inspect.getsource(mod.entry).startswith("def entry(x):\n    return x * 0")
    assert not (private / "__pycache__").exists()  # nothing cached either
    with pytest.raises(CandidateChanged, match="is not the judged candidate's"):
        load_module(orig, "coda_snapshot_test3", snap.sha256)
    with pytest.raises(FileExistsError):
        take(orig, private)  # never over an existing snapshot


def test_load_module_reports_the_candidate_line_of_an_error(tmp_path):
    p = tmp_path / "candidate.py"
    p.write_text("x = 1\nraise ValueError('line two')\n")
    with pytest.raises(ValueError) as ei:
        load_module(p, "coda_snapshot_test4", hashlib.sha256(p.read_bytes()).hexdigest())
    tb = ei.value.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_filename == str(p) and tb.tb_lineno == 2


def test_getsource_sees_the_compiled_lines_despite_exotic_line_breaks(tmp_path):
    """str.splitlines breaks at form feeds and U+2028 where the compiler does not, and the
    primed linecache would then give inspect.getsource another function's text."""
    p = tmp_path / "candidate.py"
    p.write_text("# a\fb\u2028c\x1cd\n\ndef decoy():\n    return 1\n\n\ndef real():\n    return 2\n", encoding="utf-8")
    mod = load_module(p, "coda_snapshot_test5", hashlib.sha256(p.read_bytes()).hexdigest())
    assert inspect.getsource(mod.real) == "def real():\n    return 2\n"
    assert inspect.getsource(mod.decoy) == "def decoy():\n    return 1\n"

"""Shared test helpers for the verifier tests: throw-away spec folders and the static/compile
stub that lets pure-torch candidates run the worker protocol on the CPU test device."""

import fcntl
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def write_spec(root: Path, name: str, toml: str, ref: str) -> Path:
    """Write ``root/name/{spec.toml, reference.py}`` and return the folder (not loaded, so a
    test can expect ``load_spec`` to raise)."""
    d = Path(root) / name
    d.mkdir()
    (d / "spec.toml").write_text(toml)
    (d / "reference.py").write_text(ref)
    return d


def stub_static_compile(monkeypatch) -> None:
    """Make the pipeline's static and compile stages pass: CPU-device candidates use torch math
    on purpose (those stages have their own tests)."""
    import coda_agent.verifier.pipeline as pipeline
    from coda_agent.verifier.verdict import StageResult

    monkeypatch.setattr(
        pipeline, "run_static", lambda loaded, cand: StageResult(stage="static", status="pass", summary="stub")
    )
    monkeypatch.setattr(
        pipeline,
        "run_compile",
        lambda loaded, cand, timeout_s=300: StageResult(stage="compile", status="pass", summary="stub"),
    )


def landlock_or_skip() -> int:
    """The kernel's Landlock ABI version; skips the test (never fakes it) where there is none."""
    import pytest

    from coda_agent.verifier.confine.landlock import SandboxUnavailable, abi_version

    try:
        return abi_version()
    except SandboxUnavailable as e:
        pytest.skip(f"this kernel has no Landlock: {e}")


def run_child(code: str) -> list[str]:
    """Run ``code`` (dedented) in a fresh Python process and return its stdout lines; the
    confinement tests need one because Landlock and seccomp are irreversible."""
    import subprocess
    import sys
    import textwrap

    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


# Rationale: module fixtures that compile run once per worker otherwise (xdist's
# ``loadgroup`` does not group under pytest 9.2, whose node ids it cannot rewrite), and the
# compiles already load every core, so a waiting worker costs little.
def once_per_run(tmp_path_factory, name: str, compute: Callable[[], T]) -> T:
    """``compute()`` once per pytest run, shared by every xdist worker: the first caller
    computes under a file lock and pickles the result; the others wait and load it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own basetemp
    data = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if data.exists():
            return pickle.loads(data.read_bytes())
        value = compute()
        data.write_bytes(pickle.dumps(value))
        return value

"""Fixtures for the agent tests: a throw-away workspace, its swiglu_fwd spec, a fake verifier."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import FakeVerifier, build_workspace

from coda_agent.verifier.spec import load_spec


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return build_workspace(tmp_path)


@pytest.fixture
def fwd_spec(workspace: Path):
    return load_spec(workspace / "kernel_specs" / "swiglu_fwd")


@pytest.fixture
def fake_verifier() -> FakeVerifier:
    return FakeVerifier()

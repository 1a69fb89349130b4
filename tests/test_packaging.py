"""Packaging: everything installs under the one import name `coda_agent`.

Builds the wheel exactly as `pip install .` would (no build isolation, so no network),
checks it leaks no generic top-level names (`agent`, `verifier`, `cli`, `generated_kernels`),
then installs it into an empty folder and imports it from a process whose working
directory is elsewhere -- the plain (non-editable) install path.
"""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Rationale: only the interpreter's own site directories. Entries that libraries add to
# sys.path at import time (cutlass-dsl adds its package folders) would shadow the standard
# library in a child process (a `typing.py` inside cutlass) once an earlier test imported them.
_SITE_DIRS = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


@pytest.mark.slow
def test_wheel_layout_and_plain_install(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheel_dir.glob("coda_agent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"coda_agent"}, tops
    for must in (
        "coda_agent/cli.py",
        "coda_agent/commands/__init__.py",
        "coda_agent/commands/verify.py",
        "coda_agent/agent/__init__.py",
        "coda_agent/verifier/spec/__init__.py",
        "coda_agent/kernels/__init__.py",
    ):
        assert must in names, must
    assert any(n.startswith("coda_agent/agent/prompts/") and n.endswith(".j2") for n in names) or not list(
        (ROOT / "agent" / "prompts").glob("*.j2")
    )
    # accepted kernels ship with the package (kernel.py + manifest)
    for k in (ROOT / "generated_kernels").glob("*/kernel.py"):
        assert f"coda_agent/kernels/{k.parent.name}/kernel.py" in names
        assert f"coda_agent/kernels/{k.parent.name}/manifest.json" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "coda-agent = coda_agent.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    code = (
        "import coda_agent.cli, coda_agent.verifier.spec, coda_agent.agent, coda_agent.kernels, sys;"
        "import importlib.util as u;"
        "assert u.find_spec('agent') is None and u.find_spec('verifier') is None;"
        "print(coda_agent.cli.__file__)"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(target)!r}); " + "sys.path.extend(" + repr(_SITE_DIRS) + "); " + code,
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip().startswith(str(target))
    # `python -m coda_agent` is the command (the package's __main__ ships in the wheel)
    assert "coda_agent/__main__.py" in names
    env_path = [str(target), *_SITE_DIRS]
    ver = subprocess.run(
        [sys.executable, "-m", "coda_agent", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": ":".join(env_path), "PATH": "/usr/bin:/bin"},
    )
    assert ver.returncode == 0 and ver.stdout.startswith("coda-agent"), (ver.stdout, ver.stderr)


def test_ci_and_readme_install_from_the_tested_versions():
    """constraints.txt records the versions CI tested: CI and the README's install both use
    it, it pins every direct dependency except torch (installed on its own, CPU or CUDA
    build), and each pin satisfies pyproject's range for that package."""
    import re
    import tomllib

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[1]
    pins = {}
    for line in (root / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt: {line!r} is not name==version"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = ver
    assert "torch" not in pins
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("cpu-compile", "dev", "hf"):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    for req in reqs:
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name == "torch":
            continue
        assert name in pins, f"constraints.txt has no pin for {req.name}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} not in {req.specifier}"
    assert "-c constraints.txt" in (root / ".ci" / "run").read_text()
    assert "-c constraints.txt" in (root / "README.md").read_text()

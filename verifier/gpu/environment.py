"""Where a verdict was produced: GPU, driver, CUDA and library versions.

Why: a benchmark number or an accepted kernel means little without the machine and
the versions it was measured with (quack and cutlass-dsl change codegen between
releases). :func:`collect_environment` is safe on a CPU-only machine (GPU fields are
``None``) and never raises: every probe is guarded. Versions come from
``importlib.metadata`` so nothing heavy (quack, cutlass) is imported to read them.
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import shutil
import socket
import subprocess

from ..verdict import Environment


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[:1]
    return line[0].strip() if out.returncode == 0 and line else None


def collect_environment(probe_gpu: bool = True) -> Environment:
    """Describe this machine.

    ``probe_gpu=False`` skips CUDA queries (they create a CUDA context). Returns an
    :class:`~coda_agent.verifier.verdict.Environment`; GPU fields are ``None`` without
    a CUDA device. Never raises.
    """
    env = Environment(
        torch=_version("torch"),
        cutlass_dsl=_version("nvidia-cutlass-dsl"),
        quack=_version("quack-kernels"),
        python=platform.python_version(),
        hostname=socket.gethostname(),
    )
    try:
        import torch

        env.cuda = torch.version.cuda
        if probe_gpu and torch.cuda.is_available():
            idx = torch.cuda.current_device()
            env.gpu = torch.cuda.get_device_name(idx)
            major, minor = torch.cuda.get_device_capability(idx)
            env.compute_capability = f"{major}.{minor}"
            env.driver = _driver_version()
    except Exception:  # noqa: BLE001 -- an environment probe must never fail a verification
        pass
    return env


def cuda_available() -> bool:
    """True when torch sees a CUDA device (does not create a context). Never raises."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False

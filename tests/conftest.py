"""Test configuration: GPU tests (marked ``gpu``) run only on an sm_90 CUDA device.

They are skipped -- never faked -- elsewhere (CI has no GPU). ``compile`` tests need
quack + nvidia-cutlass-dsl + triton importable (they compile for sm_90a on the CPU).
``slow`` tests (a worker subprocess, an sm_90a compile, a model run: seconds each on a
2-core machine) are left out of the everyday subset ``pytest -m "not slow"``; every
``compile`` test is ``slow`` too. CI runs them all.

The ``compile`` tests (real sm_90a compiles on the CPU: minutes on a 2-core machine) run
only with ``--compile`` or when ``-m`` names them; CI passes ``--compile`` and so runs
everything. Module fixtures that compile run once per test run, whichever xdist worker
asks first (``verifier_helpers.once_per_run``).
"""

import importlib.util

import pytest


def _hopper() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)


def _can_compile() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("quack", "cutlass", "triton"))


def pytest_addoption(parser):
    parser.addoption(
        "--compile",
        action="store_true",
        help="also run the tests marked compile (real sm_90a compiles on the CPU; CI runs them)",
    )


def pytest_collection_modifyitems(config, items):
    hopper = _hopper()
    compile_ok = _can_compile()
    compile_asked = config.getoption("--compile") or "compile" in (config.getoption("markexpr") or "")
    skip_gpu = pytest.mark.skip(reason="needs an sm_90 (Hopper) CUDA GPU")
    skip_compile = pytest.mark.skip(reason="needs quack, nvidia-cutlass-dsl and triton installed")
    skip_unasked = pytest.mark.skip(reason="an sm_90a compile test: run with --compile (CI does)")
    for item in items:
        if "gpu" in item.keywords and not hopper:
            item.add_marker(skip_gpu)
        if "compile" in item.keywords:
            item.add_marker(pytest.mark.slow)
            if not compile_ok:
                item.add_marker(skip_compile)
            elif not compile_asked:
                item.add_marker(skip_unasked)

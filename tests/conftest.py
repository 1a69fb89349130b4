"""Test configuration: GPU tests (marked ``gpu``) run only on an sm_90 CUDA device.

They are skipped -- never faked -- elsewhere (CI has no GPU). ``compile`` tests need
quack + nvidia-cutlass-dsl + triton importable (they compile for sm_90a on the CPU).
``slow`` tests (a worker subprocess, an sm_90a compile, a model run: seconds each on a
2-core machine) are left out of the everyday subset ``pytest -m "not slow"``; every
``compile`` test is ``slow`` too. CI runs them all.

``-n N`` (pytest-xdist) distributes with ``loadgroup``: a module marked ``xdist_group``
runs on one worker, so its module-scoped compile fixture runs once. It is set here rather
than in pyproject's ``addopts`` so that ``pytest`` works where xdist is not installed (the
GPU machine).
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


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") in ("no", "load"):
        config.option.dist = "loadgroup"


def pytest_collection_modifyitems(config, items):
    hopper = _hopper()
    compile_ok = _can_compile()
    skip_gpu = pytest.mark.skip(reason="needs an sm_90 (Hopper) CUDA GPU")
    skip_compile = pytest.mark.skip(reason="needs quack, nvidia-cutlass-dsl and triton installed")
    for item in items:
        if "gpu" in item.keywords and not hopper:
            item.add_marker(skip_gpu)
        if "compile" in item.keywords:
            item.add_marker(pytest.mark.slow)
            if not compile_ok:
                item.add_marker(skip_compile)

"""benchmarks/host_probe.kernel_profile, the dev probes' GPU-time-by-kernel helper, on fake
profiler events (CPU): which device events count as kernels, per-step busy time, idle gaps.

The rule it must keep (on the H200 both kinds of event occur): a GPU-side
annotation of a ``record_function`` range is not a kernel, but a triton kernel whose launch
also has a CPU event of the same name is.
"""

from __future__ import annotations

import types

import torch
from glue_helpers import ROOT, module_from_file

host_probe = module_from_file(ROOT / "benchmarks" / "probes/host_time_by_layer.py", "coda_test_host_probe")
CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def _event(name, start, end, device=CUDA, annotation=False):
    return types.SimpleNamespace(
        name=name,
        device_type=device,
        time_range=types.SimpleNamespace(start=start, end=end),
        is_user_annotation=annotation,
    )


def _profile_of(events, monkeypatch, steps):
    class FakeProfile:
        def __init__(self, *a, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return host_probe.kernel_profile(lambda: None, steps)


def test_annotations_are_left_out_and_named_triton_kernels_kept(monkeypatch):
    events = [
        _event("step", 0, 100, CPU, annotation=True),
        _event("step", 0, 90, annotation=True),
        _event("triton_poi_fused_add_0", 1, 2, CPU),  # Inductor's launcher, CPU side
        _event("triton_poi_fused_add_0", 0, 10),
        _event("nvjet_gemm", 15, 45),
        _event("Memcpy HtoD (Pageable -> Device)", 45, 50),  # not a launch (protocol rule)
        _event("triton_poi_fused_add_0", 60, 70),
        _event("nvjet_gemm", 70, 90),
    ]
    got = _profile_of(events, monkeypatch, steps=2)
    assert got["gpu us/step"] == 35.0 and got["kernels/step"] == 2.0
    assert [(t["kernel"], t["us/step"], t["calls/step"]) for t in got["top"]] == [
        ("nvjet_gemm", 25.0, 1.0),
        ("triton_poi_fused_add_0", 10.0, 1.0),
    ]
    assert got["span us/step"] == 45.0 and got["idle us/step"] == 10.0
    assert [g["us"] for g in got["gaps"]] == [15, 5]
    assert got["gaps"][0] == {"us": 15, "after": "nvjet_gemm", "before": "triton_poi_fused_add_0"}

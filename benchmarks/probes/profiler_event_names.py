"""What the profiler records on the CUDA device for kernels, copies, fills and syncs (dev tool; H200).

Why: the launch count (``protocol.gpu_kernels``) tells kernel launches from the other
CUDA-device events of a profiler session *by name*. A rule dropping any name containing
``Sync`` would let a kernel named like a marker through (a quack kernel is named after its
epilogue fn: tests/verifier/corpus/sync_named_kernel.py). This probe measured which names the
markers really have (copies: ``Memcpy HtoD (Pinned -> Device)``...; synchronizations: no
device event at all on torch 2.11), so the rule could become exact names and prefixes.

The probe profiles, one scenario at a time, the way the candidate worker does (CPU + CUDA
activities, a device synchronize inside the session): a quack GEMM whose epilogue fn is
named ``probe_Sync_epi`` (trusted code, here only to see how such a kernel is recorded),
host<->device and device<->device copies, a ``cudaMemsetAsync`` (``torch.Tensor.zero_``
on a byte tensor may be a kernel: the probe reports what it is), stream/event/device
synchronization, a stream wait and ``.item()``. For every non-CPU event it prints the
name, ``device_type`` and ``activity_type`` (where this torch has it) of both the
``FunctionEvent`` list (``prof.events()``, what the worker reads) and the raw Kineto
events, and every event of the exported Chrome trace but CPU ops with its category and
correlation id (runtime/driver API calls included: they link a launch to its kernel).
Writes ``profiler_events.json`` under ``--out``. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def _attr(e, name: str) -> str:
    """``e.<name>`` (called when it is a method), or ``"-"`` where this torch lacks it."""
    v = getattr(e, name, None)
    if v is None:
        return "-"
    return str(v() if callable(v) else v)


def _events(prof, trace_path: Path) -> dict[str, list[dict[str, str]]]:
    """Every non-CPU event of one session: the FunctionEvent list, the raw Kineto events and
    the exported Chrome trace's device events with their category (``cat``)."""
    cpu = torch.autograd.DeviceType.CPU
    fe = [
        dict(name=e.name, device_type=str(e.device_type), activity_type=_attr(e, "activity_type"))
        for e in prof.events()
        if e.device_type != cpu
    ]
    raw = [
        dict(
            name=e.name(),
            device_type=str(e.device_type()),
            activity_type=_attr(e, "activity_type"),
            correlation_id=_attr(e, "correlation_id"),
        )
        for e in prof.profiler.kineto_results.events()
        if e.device_type() != cpu
    ]
    prof.export_chrome_trace(str(trace_path))
    trace = json.loads(trace_path.read_text()).get("traceEvents", [])
    cats = [
        dict(name=str(t.get("name")), cat=str(t.get("cat")), correlation=str((t.get("args") or {}).get("correlation")))
        for t in trace
        if t.get("ph") == "X" and str(t.get("cat")) not in ("cpu_op", "python_function", "user_annotation")
    ]
    return {"function_events": fe, "kineto_events": raw, "trace_events": cats}


def _scenarios():
    """(name, zero-argument callable) pairs; each runs once before it is profiled."""
    from quack.epilogue import gemm_epilogue

    def probe_Sync_epi(acc):  # noqa: N802 - the name is the point
        return {"D": acc}

    epi = gemm_epilogue()(probe_Sync_epi)
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    host = torch.randn(1 << 16, pin_memory=True)
    pageable = torch.randn(1 << 16)
    dev = torch.randn(1 << 16, device="cuda")
    raw = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    ev = torch.cuda.Event()

    def stream_wait():
        ev.record()
        side.wait_event(ev)
        with torch.cuda.stream(side):
            dev.add_(1.0)
        torch.cuda.current_stream().wait_stream(side)

    def event_sync():
        ev.record()
        ev.synchronize()

    return [
        ("quack GEMM, epilogue fn named probe_Sync_epi", lambda: epi(a, b, tuned=False)),
        ("torch.mm", lambda: a @ b),
        ("copy pinned HtoD", lambda: dev.copy_(host, non_blocking=True)),
        ("copy pageable HtoD", lambda: dev.copy_(pageable)),
        ("copy DtoH (.cpu())", lambda: dev.cpu()),
        ("copy DtoD (clone)", lambda: dev.clone()),
        ("zero_ on uint8", lambda: raw.zero_()),
        ("torch.cuda.synchronize", torch.cuda.synchronize),
        ("stream synchronize", lambda: torch.cuda.current_stream().synchronize()),
        ("event record + synchronize", event_sync),
        ("side stream wait_event", stream_wait),
        (".item()", lambda: dev[0].item()),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profiler_event_probe: needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    rows = []
    for name, call in _scenarios():
        call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=acts) as prof:
            res = call()
            torch.cuda.synchronize()
        del res
        ev = _events(prof, args.out / "trace.json")
        rows.append(dict(scenario=name, **ev))
        print(f"== {name}")
        for kind in ("function_events", "kineto_events"):
            for e in ev[kind]:
                print(f"   {kind[:8]:8s} {e['activity_type']:14s} {e['device_type']:22s} {e['name'][:90]}")
        for e in ev["trace_events"]:
            print(f"   trace    {e['cat']:14s} corr={e['correlation']:8s} {e['name'][:90]}")
    (args.out / "trace.json").unlink(missing_ok=True)
    (args.out / "profiler_events.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

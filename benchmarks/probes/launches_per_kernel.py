"""How many GPU kernels one call of each accepted kernel launches at every shape (dev tool; H200).

Why: the correctness stage enforces a spec's ``entry.max_launches`` at the first
correctness shape only; the bench stage records the count at every benchmark shape and
reports an excess as the warning ``launches-at-bench-shape`` (verifier/stages/bench.py). Before
that warning becomes a failure, every accepted kernel must be shown to stay within its
budget at every shape, correctness and benchmark: a torch op in a kernel's host glue
could launch a different number of kernels at another size.

For each ``generated_kernels/<k>/kernel.py`` and each of its spec's shapes: draw the inputs
(seed 0, ``verifier.inputs.make_inputs``), call the entry once to compile, then count the
CUDA kernels of one call under ``torch.profiler`` the way the candidate worker does
(memcpys, memsets and syncs are not launches), and the call's workspace (device memory
held beyond inputs and outputs, ``verifier/gpu/device_memory.py``) against the spec's
``workspace_budget`` (the evidence that the default budget fits every honest
kernel). Prints one line per (kernel, shape) and a summary; writes
``launch_census.json`` under ``--out``. Exit status 1 when any count is 0 or over the
spec's ``max_launches``, or a workspace is over its budget. Runs the accepted code in this process: it is
reviewed, not untrusted. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def count(call) -> tuple[int, list[str], int]:
    """(kernel count, kernel names, workspace bytes) of one ``call()``: the candidate
    worker's rules (``protocol.gpu_kernels``, ``verifier/gpu/device_memory.py``)."""
    from coda_agent.verifier.gpu import device_memory
    from coda_agent.verifier.gpu.protocol import gpu_kernels

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    dev = torch.device("cuda", torch.cuda.current_device())
    start = device_memory.mark(dev)
    with torch.profiler.profile(activities=acts) as prof:
        res = call()
        torch.cuda.synchronize()
    workspace = device_memory.workspace_since(dev, start, res)
    del res
    kernels = gpu_kernels([e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA])
    return len(kernels), kernels, workspace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("kernels", nargs="*", help="kernel names (default: every accepted kernel)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("launch_census: needs a CUDA device")
    from coda_agent.verifier.gpu.inputs import make_inputs
    from coda_agent.verifier.spec import load_spec

    names = args.kernels or sorted(p.parent.name for p in (REPO / "generated_kernels").glob("*/kernel.py"))
    args.out.mkdir(parents=True, exist_ok=True)
    rows, bad = [], 0
    for name in names:
        loaded = load_spec(REPO / "kernel_specs" / name)
        spec, ref = loaded.spec, loaded.load_reference()
        mod_spec = importlib.util.spec_from_file_location(
            f"census_{name}", REPO / "generated_kernels" / name / "kernel.py"
        )
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        fn = getattr(mod, spec.entry.function)
        cases = [("correctness", c) for c in spec.shapes.correctness] + [
            ("benchmark", c) for c in spec.shapes.benchmark
        ]
        for kind, case in cases:
            row = {"kernel": name, "shape": case.name, "kind": kind, "max_launches": spec.entry.max_launches}
            try:
                inputs = make_inputs(loaded, case.dims, 0, "cuda", reference=ref)
                consts = spec.constants_of(case.dims)
                call = functools.partial(fn, *[inputs[t.name] for t in spec.entry.inputs], **consts)
                call()
                torch.cuda.synchronize()
                n, kernels, workspace = count(call)
                budget, _rule = spec.workspace_budget(case.dims)
                row.update(
                    launches=n,
                    workspace_mib=round(workspace / 2**20, 3),
                    budget_mib=round(budget / 2**20, 3),
                    ok=1 <= n <= spec.entry.max_launches and workspace <= budget,
                )
                if not row["ok"]:
                    row["kernel_names"] = kernels[:20]
                del inputs, call
            except Exception as e:  # noqa: BLE001 - one failing case is a result, not the end
                row.update(error=f"{type(e).__name__}: {str(e)[:300]}", ok=False)
            bad += not row["ok"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            (args.out / "launch_census.json").write_text(json.dumps(rows, indent=1))
            torch.cuda.empty_cache()
    by_kernel: dict[str, set] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"], set()).add(r.get("launches"))
    print("\nkernel: launch counts over all shapes (max_launches)")
    for r in {r["kernel"]: r for r in rows}.values():
        print(f"  {r['kernel']}: {sorted(by_kernel[r['kernel']], key=str)} ({r['max_launches']})")
    print("\nkernel: largest workspace / its budget over all shapes (MiB)")
    for k in by_kernel:
        w = [r for r in rows if r["kernel"] == k and "workspace_mib" in r]
        if w:
            top = max(w, key=lambda r: r["workspace_mib"] / r["budget_mib"])
            print(f"  {k}: {top['workspace_mib']} / {top['budget_mib']} at {top['shape']}")
    print(f"{bad} case(s) out of budget (launches or workspace) or failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

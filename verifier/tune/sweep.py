"""The tuner's GPU worker: times one accepted kernel's entry per GEMM config and shape.

Run by :mod:`.tune` as ``python -m coda_agent.verifier.tune.sweep REQUEST.json RESULTS.jsonl``
in its own process (a config that crashes the process ends only this kernel's sweep; the
parent restarts it without that config). The kernel is trusted (accepted, verified): it is
imported under its package name, like training imports it, and called through launchers
(:func:`coda_agent.runtime.launch.bind_entry`) whose ``config_for`` pins one epilogue's
config at a time.

Per shape: the spec's inputs, several sets rotated call by call (``rotation_count``, as
the bench stage does), timed with ``triton.testing.do_bench(..., return_mode="median")``
(L2 flushed before each call). Measured: the kernel with its own configs (``default``),
each candidate config, and cuBLAS (``torch.mm``) on each epilogue's own A and B operands.
Each candidate's outputs are compared with the default's on the first input set (a config
whose results differ by more than :data:`MISMATCH` of the output's scale is dropped): a
cheap filter before the full re-verification, never instead of it.

Also timed, same inputs and run: the spec's standard path and bare GEMM
(:func:`_baselines`), the dispatcher's and the page's references.

Records (one JSON object per line, flushed as written): ``sites`` (the epilogue GEMM calls
of one shape and the entry call's bucket), ``default``, ``baseline``, ``cublas``, ``try`` (written before a candidate runs: the
crash marker), ``time``, ``fail``.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

MISMATCH = 0.02
"""Largest max |candidate - default| / max |default| per output before a config is dropped."""


def _emit(fh, **rec: Any) -> None:
    fh.write(json.dumps(rec) + "\n")
    fh.flush()


def _outputs(res: Any) -> list:
    import torch

    seq = res if isinstance(res, (tuple, list)) else (res,)
    return [t for t in seq if isinstance(t, torch.Tensor)]


def _mismatch(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if not x.is_floating_point():
            x, y = x.float(), y.float()
        x32, y32 = x.float(), y.float()
        scale = float(y32.abs().max()) or 1.0
        worst = max(worst, float((x32 - y32).abs().max()) / scale)
    return worst


class _Shape:
    """One benchmark shape's inputs, reference outputs and timer (see the module docstring)."""

    def __init__(self, loaded: Any, dims: dict[str, int]):
        import torch

        from ..gpu.inputs import make_inputs, rotation_count, tensor_bytes

        spec = loaded.spec
        self.n = rotation_count(tensor_bytes(loaded, dims, "inputs"))
        sets = [make_inputs(loaded, dims, 1000 + k, "cuda") for k in range(self.n)]
        self.args = [[s[t.name] for t in spec.entry.inputs] for s in sets]
        self.consts = spec.constants_of(dims)
        self.sync = torch.cuda.synchronize

    def first(self, f: Any) -> list:
        out = _outputs(f(*self.args[0], **self.consts))
        self.sync()
        return out

    def time(self, f: Any) -> float:
        """Median ms of ``f`` over the rotated input sets (``do_bench``, L2 flushed)."""
        import triton.testing

        i = [0]

        def call():
            k = i[0] % self.n
            i[0] += 1
            return f(*self.args[k], **self.consts)

        call()
        self.sync()
        ms = triton.testing.do_bench(call, return_mode="median")
        assert isinstance(ms, float)
        return ms


def _baselines(loaded: Any) -> dict[str, Any]:
    """The spec's standard path (``torch.compile`` of ``reference.baseline``: cuBLAS + the
    compiled elementwise pass, as the bench stage's ``torch_compile`` baseline) and bare GEMM
    (``reference.bare_gemm``: cuBLAS alone), called with the entry's positional inputs."""
    import torch

    ref = loaded.load_reference()
    names = [t.name for t in loaded.spec.entry.inputs]
    out = {}
    for label, fn in (("standard", torch.compile(ref.baseline, dynamic=False)), ("bare_gemm", ref.bare_gemm)):
        out[label] = lambda *a, _f=fn, **c: _f(**dict(zip(names, a, strict=True)), **c)
    return out


def _pin(cfg: Any, epi: str, b: str):
    """A ``config_for`` that gives ``cfg`` to epilogue ``epi`` at bucket ``b`` only."""
    from ...runtime.tuning import bucket

    def config_for(e, m, n, k, device):
        return cfg if e == epi and bucket(m, n, k) == b else None

    return config_for


def run(req: dict[str, Any], out: Path) -> int:
    import torch

    kernels = importlib.import_module("coda_agent.kernels")
    from ...runtime import cache
    from ...runtime.launch import bind_entry
    from ...runtime.tuning import bucket, call_bucket, config_from_dict, config_name, config_to_dict
    from ..spec import load_spec
    from .space import stage1, stage2

    cache.configure()
    loaded = load_spec(req["spec_dir"])
    kernel = req["kernel"]
    module = kernels.load(kernel)
    skip = set(req.get("skip", []))
    top = int(req.get("dyn_top", 3))
    with open(out, "a") as fh:
        for shape in req["shapes"]:
            name = shape["name"]
            sh = _Shape(loaded, shape["dims"])
            sites: dict[tuple[str, str], dict[str, Any]] = {}

            def observe(epi, A, B, cfg, sites=sites):
                m, n, k = A.numel() // A.shape[-1], B.shape[-1], A.shape[-1]
                sites.setdefault(
                    (epi, bucket(m, n, k)), dict(epilogue=epi, M=m, N=n, K=k, default=config_to_dict(cfg), A=A, B=B)
                )

            fn, _ = bind_entry(module, kernel, None, observe)
            ref = sh.first(fn)
            _emit(
                fh,
                kind="sites",
                shape=name,
                call=call_bucket(sh.args[0]),
                sites=[
                    {k: v for k, v in s.items() if k not in ("A", "B")} | {"bucket": b} for (_, b), s in sites.items()
                ],
            )
            _emit(fh, kind="default", shape=name, ms=sh.time(fn))
            for label, f in _baselines(loaded).items():
                try:
                    _emit(fh, kind="baseline", shape=name, baseline=label, ms=sh.time(f))
                except Exception as e:  # noqa: BLE001 -- a baseline that cannot run is recorded, not fatal
                    _emit(fh, kind="baseline", shape=name, baseline=label, error=f"{type(e).__name__}: {e}"[:300])
            for (epi, b), s in sites.items():
                A, B = s["A"], s["B"]
                ms = sh.time(lambda *a, _A=A, _B=B, **k: torch.mm(_A, _B))
                _emit(fh, kind="cublas", shape=name, epilogue=epi, bucket=b, ms=ms)
            for (epi, b), s in sites.items():
                rec = dict(shape=name, epilogue=epi, bucket=b)
                results: list[tuple[float, Any]] = []
                default = config_from_dict(s["default"])
                stage = stage1(vars(module)[epi], req.get("space", "full"))
                for round_ in (1, 2):
                    for cfg in stage:
                        label = config_name(cfg)
                        if f"{epi}:{label}" in skip:
                            continue
                        _emit(fh, kind="try", config=label, **rec)
                        t0 = time.monotonic()
                        try:
                            f, _ = bind_entry(module, kernel, _pin(cfg, epi, b))
                            err = _mismatch(sh.first(f), ref)
                            if not err <= MISMATCH:
                                raise ValueError(f"outputs differ from the default's by {err:.3g} of their scale")
                            ms = sh.time(f)
                        except Exception as e:  # noqa: BLE001 -- quack refuses some configs at plan time
                            _emit(fh, kind="fail", config=label, error=f"{type(e).__name__}: {str(e)[:300]}", **rec)
                            continue
                        results.append((ms, cfg))
                        _emit(
                            fh,
                            kind="time",
                            config=label,
                            config_fields=config_to_dict(cfg),
                            ms=ms,
                            mismatch=err,
                            seconds=round(time.monotonic() - t0, 2),
                            **rec,
                        )
                    if round_ == 1:
                        leaders = [c for _, c in sorted(results, key=lambda r: r[0])[:top]]
                        stage = stage2(leaders + ([default] if default not in leaders else []))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m coda_agent.verifier.tune.sweep REQUEST.json RESULTS.jsonl", file=sys.stderr)
        return 2
    return run(json.loads(Path(argv[0]).read_text()), Path(argv[1]))


if __name__ == "__main__":
    raise SystemExit(main())

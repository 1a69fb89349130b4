"""Calibration of the fp8 rule (verifier/stages/numerics_fp8.py): honest quantizers must
pass with margin, wrong ones fail. Called by ``numerics_rule_calibration.py`` for
every spec with an fp8 output.

Each candidate is an fp32 value of the fp8 output's real value ``y`` from another
computation than the reference's, quantized with the 1x128 recipe of gemm_fp8_quant
(per block of the scale: scale = max(amax, eps) / the format's largest value, codes y /
scale rounded to nearest even with saturation by torch's cast):

* honest: ``ideal`` (the fp32 reference's own y), ``cpu_fp32_flip`` (fp32 on the CPU with
  K reversed, small cases), on a GPU ``cublas_tc`` (cuBLAS bf16 x bf16 -> fp32 on tensor
  cores: truncating accumulation) and ``quack_fp32`` (quack's identity-epilogue GEMM
  with an fp32 D: the accumulation an accepted kernel has);
* apart: ``baseline_bf16`` (the spec's unfused baseline: y rounded to bf16 before the
  block maxima; less precise than the reference, so it fails the rule);
* wrong: ``fp8_truncated`` (round toward zero), ``fp8_e5m2_grid`` (e5m2's grid in an
  e4m3 tensor).

The scale output of each candidate is judged by its CODA rules as the verifier does.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FP8_HONEST = ("ideal", "cpu_fp32_flip", "cublas_tc", "quack_fp32")
FP8_APART = ("baseline_bf16",)
FP8_WRONG = ("fp8_truncated", "fp8_e5m2_grid")
CPU_FLOPS = 4e9
"""Largest GEMM whose K-reversed fp32 product is also computed on the CPU."""


def quantize(
    y: torch.Tensor, scale_shape: tuple[int, ...], dtype: str, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scale)``: the block-amax recipe on an fp32 ``y`` (scale of ``scale_shape``)."""
    from coda_agent.verifier.gpu.samples import block_max, expand_blocks

    fp8 = getattr(torch, dtype)
    scale = block_max(y.float().abs(), scale_shape).clamp_min(eps) / torch.finfo(fp8).max
    return (y.float() / expand_blocks(scale, tuple(y.shape))).to(fp8), scale


def _truncate(v: torch.Tensor, dtype: str) -> torch.Tensor:
    from coda_agent.verifier.stages.numerics_fp8 import FORMATS, fp8_spacing

    fmt = FORMATS[dtype]
    a = v.double().abs().clamp(max=fmt.max)
    return torch.copysign(torch.floor(a / fp8_spacing(a, fmt)) * fp8_spacing(a, fmt), v.double()).float()


def _gemm_values(spec: Any, inputs: dict[str, torch.Tensor], ref32_y: torch.Tensor, device: str, flops: float):
    """The honest fp32 values of y (the spec's two GEMM operands are its first two inputs)."""
    a, b = (inputs[t.name] for t in spec.entry.inputs[:2])
    out = {"ideal": ref32_y.float()}
    if flops <= CPU_FLOPS:
        out["cpu_fp32_flip"] = (a.float().cpu().flip(-1) @ b.float().cpu().flip(-1).T).to(ref32_y.device)
    if device == "cuda":
        out["cublas_tc"] = torch.mm(a, b.T, out_dtype=torch.float32)
        from quack.epilogue.library import identity_epi

        out["quack_fp32"] = identity_epi(a, b.T, tuned=False, out_dtype=torch.float32)["D"]
    return out


def fp8_rows(spec: Any, ref: Any, inputs: dict[str, torch.Tensor], run: Any, ref32, lowp, device: str) -> list[dict]:
    """Rows (the calibration's format) for every fp8 output of ``spec`` and its scale at one run."""
    from coda_agent.verifier.gpu.samples import expand_blocks
    from coda_agent.verifier.gpu.worker_reference import fp8_bands
    from coda_agent.verifier.spec import eval_expr
    from coda_agent.verifier.stages.numerics import tolerance_check
    from coda_agent.verifier.stages.numerics_fp8 import fp8_check

    consts = spec.constants_of(run.dims)
    eps = float(consts.get("eps", 0.0))
    bands = fp8_bands(spec, ref, inputs, run.dims, ref32)
    flops = float(eval_expr(spec.bench.flops, run.dims))
    rows: list[dict] = []
    for o in spec.fp8_outputs:
        assert o.scale is not None
        shape = tuple(ref32[o.name].shape)
        scale_shape = tuple(ref32[o.scale].shape)
        band = expand_blocks(bands[o.name], shape)
        dev = inputs[spec.entry.inputs[0].name].device
        cands: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
            name: quantize(y.cpu(), scale_shape, o.dtype, eps)
            for name, y in _gemm_values(spec, inputs, ref32[o.name].to(dev), device, flops).items()
        }
        codes, scale = cands["ideal"]
        x = ref32[o.name].float() / expand_blocks(scale, shape)
        cands["fp8_truncated"] = (_truncate(x, o.dtype).to(codes.dtype), scale)
        cands["fp8_e5m2_grid"] = (x.to(torch.float8_e5m2).float().to(codes.dtype), scale)
        with torch.no_grad():
            base = ref.baseline(**inputs, **consts)
        cands["baseline_bf16"] = (base[o.name].cpu(), base[o.scale].float().cpu())
        tol = spec.tolerance.for_output(o.scale)
        for name, (c, s) in cands.items():
            j = fp8_check(c, expand_blocks(s, shape), ref32[o.name], band, o.dtype)
            js = tolerance_check(s, ref32[o.scale], lowp[o.scale], tol, "float32", spec.low_precision)
            for out_name, res in ((o.name, j), (o.scale, js)):
                rows.append(
                    dict(
                        spec=spec.name,
                        run=run.key,
                        case=run.case,
                        draw=run.draw,
                        candidate=name,
                        output=out_name,
                        ok=res["ok"],
                        failed=res.get("failed", []),
                        ratios={k: v["ratio"] for k, v in res.get("rules", {}).items()},
                        flips=res.get("rules", {}).get("fp8_rounding", {}).get("flips"),
                    )
                )
    return rows


def summarize_fp8(rows: list[dict]) -> str:
    """Per fp8 candidate: outputs judged, failed, the largest fp8-rounding ratio (1 is the
    bound) and the honest margin."""
    lines = [
        "| fp8 candidate | judged | failed | max fp8-rounding | max scale rule | margin |",
        "|---|---|---|---|---|---|",
    ]
    for cand in (*FP8_HONEST, *FP8_APART, *FP8_WRONG):
        rs = [r for r in rows if r.get("candidate") == cand and "flips" in r]
        if not rs:
            continue
        fp8 = max((r["ratios"].get("fp8_rounding", 0.0) for r in rs), default=0.0)
        sc = max((v for r in rs if "fp8_rounding" not in r["ratios"] for v in r["ratios"].values()), default=0.0)
        top = max(fp8, sc)
        margin = f"{1 / top:.2f}x" if cand in FP8_HONEST and top > 0 and math.isfinite(top) else "-"
        failed = sum(1 for r in rs if not r["ok"])
        lines.append(f"| {cand} | {len(rs)} | {failed} | {fp8:.3g} | {sc:.3g} | {margin} |")
    return "\n".join(lines)

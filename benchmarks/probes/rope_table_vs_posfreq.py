"""Would a cos/sin-table RoPE spec make the RoPE kernels meet their targets? (dev tool; H200.)

Why: the three RoPE specs (gemm_rope, gemm_rmsnorm_rope, rope_bwd) hand the kernel
``positions`` and ``inv_freq``, so every call rebuilds quack's float-float frequency table
(10 small launches). At llama3-1b the host time of that prep is as large as the 0.15 ms GEMM
and the kernels miss their bars there (host-bound). A model computes its rotation table
once per forward and shares it across layers (Meta's ``freqs_cis``, HF's
``position_embeddings``), so a spec could take that table instead. This probe measures, in
one plain process, before any spec changes:

* ``posfreq``: the accepted gemm_rope kernel (positions + inv_freq, 11 launches);
* ``table+mask``: an epilogue over quack's ``rotary_cos_sin_load`` table op (the (M, HD)
  interleaved cos/sin table, cos at even columns, sin at odd) plus a per-column fp32 mask
  (1 over the Q/K columns, 0 over V) built per call (2 launches), so V passes through:
  ``c' = m*c + (1-m)``, ``s' = m*s`` are exact;
* ``quack table``: quack's ``rope_table_epi`` with a zero bias (rotates V too; the same
  traffic, the candidate baseline);
* the bare cuBLAS GEMM and quack's identity GEMM.

For each shape and tile config: do_bench median ms and host us per call (pipelined). Checks
the table+mask output against an fp32 torch rotation (max abs error printed). Prints one
JSON line per measurement and writes ``rope_table_probe.json`` under ``--out``. Never
scores or changes a kernel. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SHAPES = {  # name: (M, K, HQ, HKV, HD)
    "llama3-1b-qkv/M8192": (8192, 2048, 32, 8, 64),
    "llama3-8b-qkv/M8192": (8192, 4096, 32, 8, 128),
    "llama3-70b-qkv/M16384": (16384, 8192, 64, 8, 128),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("rope_table_probe: needs a CUDA device")
    from host_time_by_layer import load_kernel, pipelined_host_us
    from quack.epilogue import gemm_epilogue, pack, unpack
    from quack.epilogue.library import identity_epi
    from quack.epilogue.ops import RowVecLoad
    from quack.epilogue.rotary import rope_table_epi, rotary_cos_sin_load
    from quack.gemm_config import GemmConfig
    from triton.testing import do_bench

    @gemm_epilogue(ops={"cs": rotary_cos_sin_load("cs"), "mask": RowVecLoad("mask")}, mode="acc_pair")
    def table_mask_epi(acc, cs, mask):
        x, y = unpack(acc)
        c, s = unpack(cs)
        m, _ = unpack(mask)
        c = m * c + (1.0 - m)
        s = m * s
        return {"D": pack(x * c - y * s, x * s + y * c)}

    rope = load_kernel("gemm_rope")
    configs = {
        "128x192pp": GemmConfig(
            tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=False
        ),
        "128x128pp": GemmConfig(
            tile_m=128, tile_n=128, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=False
        ),
        "128x128pp-c12": GemmConfig(
            tile_m=128, tile_n=128, pingpong=True, cluster_m=1, cluster_n=2, is_dynamic_persistent=False
        ),
        "128x256coop": GemmConfig(
            tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1, is_dynamic_persistent=False
        ),
        "256x128coop": GemmConfig(
            tile_m=256, tile_n=128, pingpong=False, cluster_m=2, cluster_n=1, is_dynamic_persistent=False
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []

    def record(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "rope_table_probe.json").write_text(json.dumps(rows, indent=1))

    for shape, (m, k, hq, hkv, hd) in SHAPES.items():
        n, n_rot = (hq + 2 * hkv) * hd, (hq + hkv) * hd
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(torch.bfloat16)
        positions = torch.randint(0, 8192, (m,), device="cuda", generator=g)
        inv_freq = (1.0 / 500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float().cuda()
        theta = positions.double()[:, None] * inv_freq.double()[None, :]
        cs = torch.stack((theta.cos(), theta.sin()), dim=-1).flatten(1).float().contiguous()  # (M, HD)

        def mask_of():
            mk = x.new_zeros(n, dtype=torch.float32)
            mk[:n_rot] = 1.0
            return mk

        # the rotation in fp32 of an fp32 GEMM of the same bf16 operands
        acc = x.float() @ w.float().T
        pr = acc[:, :n_rot].unflatten(1, (n_rot // hd, hd // 2, 2))
        c, s = cs[:, 0::2][:, None, :], cs[:, 1::2][:, None, :]
        ref = torch.cat(
            (
                torch.stack((pr[..., 0] * c - pr[..., 1] * s, pr[..., 0] * s + pr[..., 1] * c), -1).flatten(1),
                acc[:, n_rot:],
            ),
            1,
        )
        calls = {
            "bare_gemm": (None, lambda: x @ w.T),
            "quack_identity(default)": (None, lambda: identity_epi(x, w.T, tuned=False)["D"]),
            "posfreq(accepted gemm_rope)": (None, lambda: rope.gemm_rope(x, w, positions, inv_freq, HQ=hq, HKV=hkv)),
        }
        for cname, cfg in configs.items():
            if cfg.tile_n % hd and hd % cfg.tile_n:
                continue
            calls[f"table+mask {cname}"] = (
                cfg,
                lambda cfg=cfg: table_mask_epi(x, w.T, tuned=False, config=cfg, cs=cs, mask=mask_of().view(1, -1))["D"],
            )
            calls[f"quack table {cname}"] = (
                cfg,
                lambda cfg=cfg: rope_table_epi(
                    x, w.T, tuned=False, config=cfg, cs=cs, bias=x.new_zeros(1, n, dtype=torch.float32)
                )["D"],
            )
        for label, (_cfg, call) in calls.items():
            try:
                out = call()
                torch.cuda.synchronize()
                err = None
                if label.startswith(("table+mask", "posfreq")):
                    err = float((out.float() - ref).abs().max())
                ms = float(do_bench(call, return_mode="median", warmup=25, rep=200))
                record(
                    shape=shape,
                    call=label,
                    ms=round(ms, 4),
                    host_us=round(pipelined_host_us(call), 1),
                    max_abs_err_vs_fp32=err,
                )
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a result
                record(shape=shape, call=label, error=f"{type(e).__name__}: {str(e)[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

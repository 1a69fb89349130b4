"""Mainloop tile-config sweep of accepted kernels' epilogues (dev tool; H200 only).

Why: three targets are missed on shapes where the accepted kernel runs quack's default
SM90 tile (128x192 pingpong) or a tile picked by a rule measured at other K
(gemm_rmsnorm and gemm_cross_entropy at 70B, swiglu_bwd at 8B). Whether another
``GemmConfig`` closes the gap is a measurement question; this script answers it and the
answer goes into ``tricks_log.md`` (a lesson the next author reads), never into an accepted
kernel by hand.

What it times, per case (a spec, one benchmark shape): the accepted kernel's own epilogue
mod (imported from ``generated_kernels/<spec>/kernel.py``, called as the kernel calls it)
under each candidate ``GemmConfig``, quack's identity-epilogue GEMM under the same configs,
and cuBLAS (``torch.mm``) on the same operands, all in one process, in ``--rounds``
interleaved rounds. Times are medians of ``triton.testing.do_bench`` (L2 flushed before
each call) in ms; the table's ratio is ``ms / cuBLAS ms`` of the same round.

Also (``--rope-host``): the host cost of gemm_rope's per-call table preparation against the
mod call itself, in us per call (no synchronisation inside the timed loop).

Usage (device machine, after ``source .device-bundle/p2/install.sh && source
benchmarks/device_env.sh``)::

    python3 benchmarks/probes/tile_configs_vs_cublas.py --out $OUT/sweep [--case NAME ...] [--rounds 2]

Writes ``sweep.json`` and ``sweep.md`` under ``--out``. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from host_time_by_layer import env_line, load_kernel, load_reference, pipelined_host_us  # noqa: E402  (sibling dev script)
from host_time_by_layer import randn_bf16 as _randn  # noqa: E402

_CFG_NAME = re.compile(r"^(\d+)x(\d+)(pp|co)(?:-c(\d)x(\d))?(?:-sw(\d+))?(-dyn)?$")


def _cfg(name: str):
    """``GemmConfig`` from a variant name ``<tile_m>x<tile_n><pp|co>[-c<cm>x<cn>][-sw<s>][-dyn]``.

    pp = pingpong, co = cooperative; cluster defaults to 2x1 (quack's SM90 default),
    ``-sw`` sets ``max_swizzle_size`` (default 8), ``-dyn`` the dynamic persistent scheduler.
    Raises ValueError on any other name."""
    from quack.gemm_config import GemmConfig

    m = _CFG_NAME.match(name)
    if not m:
        raise ValueError(f"config name {name!r}: expected <tile_m>x<tile_n><pp|co>[-c<cm>x<cn>][-sw<s>][-dyn]")
    tm, tn, kind, cm, cn, sw, dyn = m.groups()
    return GemmConfig(
        tile_m=int(tm),
        tile_n=int(tn),
        pingpong=kind == "pp",
        cluster_m=int(cm or 2),
        cluster_n=int(cn or 1),
        max_swizzle_size=int(sw or 8),
        is_dynamic_persistent=bool(dyn),
    )


def _configs(names: list[str]):
    return {n: _cfg(n) for n in names}


# Each case: build(configs) -> (a, b) of the GEMM plus {config name: call}.
def case_gemm_rmsnorm_70b(cfgs):
    m, n, k = 16384, 10240, 8192
    kern = load_kernel("gemm_rmsnorm")
    a, w = _randn(m, k), _randn(n, k, std=k**-0.5)
    rstd = torch.rand(m, device="cuda") * 1.5 + 0.5
    calls = {
        c: (lambda cfg=cfg: kern.rstd_scale_epi(a, w.T, tuned=False, config=cfg, rstd=rstd.view(1, -1)))
        for c, cfg in cfgs.items()
    }
    return (a, w.T), calls


def _ce_case(m, v, k):
    def build(cfgs):
        kern = load_kernel("gemm_cross_entropy")
        h, w = _randn(m, k), _randn(v, k, std=k**-0.5)
        target = torch.randint(0, v, (m,), device="cuda")
        tgt = torch.empty(m, dtype=torch.float32, device="cuda")
        calls = {}
        for c, cfg in cfgs.items():
            part = torch.empty(m, math.ceil(v / cfg.tile_n), dtype=torch.float32, device="cuda")
            calls[c] = lambda cfg=cfg, part=part: kern.ce_epi(
                h, w.T, tuned=False, store_d=False, config=cfg, target=target, lse=part, tgt=tgt
            )
        return (h, w.T), calls

    return build


def _swiglu_bwd_case(m, k, i):
    """swiglu_bwd's dgrad GEMM with its epilogue; also times torch.compile of the spec's
    ``baseline`` (the unfused code the catalogue's 1.3x backward target is judged against)."""

    def build(cfgs):
        kern = load_kernel("swiglu_bwd")
        dout, w_down = _randn(m, k), _randn(k, i, std=i**-0.5)
        preact = _randn(m, 2 * i)
        calls = {
            c: (lambda cfg=cfg: kern.dswiglu_epi(dout, w_down, preact, tuned=False, config=cfg))
            for c, cfg in cfgs.items()
        }
        ref = load_reference("swiglu_bwd")
        compiled = torch.compile(ref.baseline, dynamic=False)  # as the verifier's baseline
        extras = {"torch_compile": lambda: compiled(dout=dout, w_down=w_down, preact=preact)}
        return (dout, w_down), calls, extras

    return build


def _rms_bwd_case(m, n, d):
    """rms_bwd's dgrad GEMM dy (M, N) @ W (N, D) with its epilogue (dgamma partials sized per tile_m)."""

    def build(cfgs):
        kern = load_kernel("rms_bwd")
        dy, w = _randn(m, n), _randn(n, d, std=n**-0.5)
        h, dresid = _randn(m, d), _randn(m, d)
        gamma = torch.randn(d, device="cuda").view(1, -1)
        rstd = torch.rand(m, device="cuda").add_(0.5).view(1, -1)
        zdz = torch.randn(m, device="cuda").view(1, -1)
        parts = {c: torch.empty(-(-m // cfg.tile_m), d, dtype=torch.float32, device="cuda") for c, cfg in cfgs.items()}
        calls = {
            c: (
                lambda c=c, cfg=cfg: kern.rms_bwd_epi(
                    dy, w, dresid, tuned=False, config=cfg, h=h, gamma=gamma, rstd=rstd, zdz=zdz, dgamma=parts[c]
                )
            )
            for c, cfg in cfgs.items()
        }
        return (dy, w), calls

    return build


_GATED = [
    "128x192pp",
    "128x160pp",
    "128x128pp",
    "192x128pp",
    "256x128co",
    "256x160co",
    "256x192co",
    "128x224co",
    "128x256co",
]
GATED_SPACE = _GATED + [f"{c}-c1x2" for c in _GATED]


CASES = {
    "gemm_rmsnorm/llama3-70b-qkv/M16384": (
        case_gemm_rmsnorm_70b,
        ["128x192pp", "128x256co", "256x128co", "128x128pp", "128x256co-c1x2"],
    ),
    "gemm_cross_entropy/llama3-70b/M8192": (
        _ce_case(8192, 128256, 8192),
        ["128x256co", "128x192pp", "256x128co", "128x256co-c1x2"],
    ),
    "gemm_cross_entropy/llama3-8b/M8192": (_ce_case(8192, 128256, 4096), ["128x256co", "128x192pp", "256x128co"]),
    "swiglu_bwd/llama3-8b/M8192": (_swiglu_bwd_case(8192, 4096, 14336), GATED_SPACE),
    "swiglu_bwd/llama3-8b/M16384": (_swiglu_bwd_case(16384, 4096, 14336), GATED_SPACE),
    "swiglu_bwd/llama3-1b/M8192": (_swiglu_bwd_case(8192, 2048, 8192), GATED_SPACE),
    "swiglu_bwd/llama3-70b/M8192": (_swiglu_bwd_case(8192, 8192, 28672), GATED_SPACE),
    # rms_bwd read 0.92x torch.compile at 8B, with quack_gemm/bare_gemm 1.06 there
    "rms_bwd/llama3-8b/M8192": (_rms_bwd_case(8192, 28672, 4096), ["128x192pp", "128x256co", "256x128co", "128x128pp"]),
}


def _bench(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=150, return_mode="median"))


def run_case(name: str, rounds: int, only: list[str] | None = None, identity: str = "first") -> dict:
    """Time one case's variants in ``rounds`` interleaved rounds; returns its JSON record.

    ``only``: config names to time instead of the case's list; ``identity``: time quack's
    identity-epilogue GEMM under the ``first`` config only, under ``all``, or ``none``.
    A variant that fails to compile or run is recorded under ``failed`` and skipped."""
    from quack.epilogue.library import identity_epi

    build, cfg_names = CASES[name]
    cfgs = _configs(only or cfg_names)
    built = build(cfgs)
    (a, b), calls = built[0], built[1]
    extras = built[2] if len(built) > 2 else {}
    id_names = {"first": list(cfgs)[:1], "all": list(cfgs), "none": []}[identity]
    ident = {c: (lambda cfg=cfgs[c]: identity_epi(a, b, tuned=False, config=cfg)) for c in id_names}
    out = {"case": name, "configs": {c: asdict(cfg) for c, cfg in cfgs.items()}, "rounds": [], "failed": {}}
    variants = {**{f"epi:{c}": f for c, f in calls.items()}, **{f"identity:{c}": f for c, f in ident.items()}, **extras}
    t0 = time.time()
    for key, fn in list(variants.items()):  # compile + warm every variant first
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # an invalid tile for this epilogue must not lose the others
            out["failed"][key] = f"{type(e).__name__}: {str(e)[:300]}"
            del variants[key]
    out["compile_s"] = round(time.time() - t0, 1)
    for _ in range(rounds):
        r = {"cublas": _bench(lambda: torch.mm(a, b))}
        for key, fn in variants.items():
            r[key] = _bench(fn)
        out["rounds"].append(r)
        print(name, json.dumps({k: round(v, 4) for k, v in r.items()}), flush=True)
    return out


def rope_host(n_calls: int = 200) -> dict:
    """Host us per call of gemm_rope's table prep vs its mod call (llama3-1b-qkv/M8192)."""
    from quack.epilogue.rotary import make_interleaved_inv_freq

    kern = load_kernel("gemm_rope")
    m, k, hq, hkv, hd = 8192, 2048, 32, 8, 64
    n = (hq + 2 * hkv) * hd
    x, w = _randn(m, k), _randn(n, k, std=k**-0.5)
    positions = torch.arange(m, device="cuda") % 4096
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    freq = make_interleaved_inv_freq(inv_freq, (hq + hkv) * hd, hkv * hd)
    pos = positions.float()
    cfg = kern.CFG_192 if n % 192 == 0 else kern.CFG_256
    pieces = {
        "table(make_interleaved_inv_freq)": lambda: make_interleaved_inv_freq(inv_freq, (hq + hkv) * hd, hkv * hd),
        "positions.float()": lambda: positions.float(),
        "mod call": lambda: kern.rope_epi(x, w.T, tuned=False, config=cfg, pos=pos.view(1, -1), freq=freq.view(1, -1)),
        "whole entry": lambda: kern.gemm_rope(x, w, positions, inv_freq, HQ=hq, HKV=hkv),
        "torch.mm (cuBLAS)": lambda: torch.mm(x, w.T),
    }
    res = {label: round(pipelined_host_us(fn, per_round=n_calls // 5, warm=20), 1) for label, fn in pieces.items()}
    res["gpu ms: whole entry (do_bench)"] = round(_bench(pieces["whole entry"]), 4)
    res["gpu ms: mod call (do_bench)"] = round(_bench(pieces["mod call"]), 4)
    res["gpu ms: torch.mm (do_bench)"] = round(_bench(pieces["torch.mm (cuBLAS)"]), 4)
    print("rope host us/call:", json.dumps(res), flush=True)
    return res


def _markdown(results: list[dict], rope: dict | None, env: str) -> str:
    lines = [
        "# Mainloop config sweep",
        "",
        env,
        "",
        "Median ms (triton do_bench, L2 flushed); ratio = ms / cuBLAS ms of the same round; "
        "`epi` = the accepted kernel's epilogue mod, `identity` = quack's identity-epilogue GEMM; "
        "`N.NNNx tc` (where timed) = torch.compile of the spec's baseline ms / this ms, same round.",
        "",
    ]
    for r in results:
        lines += [
            f"## {r['case']}",
            "",
            f"compile + first call of all variants: {r['compile_s']} s",
            "",
            "| variant | " + " | ".join(f"round {i + 1} ms (ratio)" for i in range(len(r["rounds"]))) + " |",
            "|---|" + "---|" * len(r["rounds"]),
        ]
        tc = "torch_compile" in r["rounds"][0]
        for key in r["rounds"][0]:
            cells = [
                f"{rd[key]:.4f} ({rd[key] / rd['cublas']:.3f})"
                + (f" {rd['torch_compile'] / rd[key]:.3f}x tc" if tc and key.startswith("epi:") else "")
                for rd in r["rounds"]
            ]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        for key, why in r.get("failed", {}).items():
            lines.append(f"| {key} | failed: {why[:120]} |" + " |" * (len(r["rounds"]) - 1))
        lines.append("")
    if rope:
        lines += (
            [
                "## gemm_rope host cost at llama3-1b-qkv/M8192 (us per call, no sync in the loop)",
                "",
                "| piece | value |",
                "|---|---|",
            ]
            + [f"| {k} | {v} |" for k, v in rope.items()]
            + [""]
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="default: every case")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--config", action="append", help="config names to time instead of each case's list")
    ap.add_argument(
        "--identity",
        choices=["first", "all", "none"],
        default="first",
        help="quack identity-epilogue GEMM under which configs (default: the first)",
    )
    ap.add_argument("--rope-host", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("config_sweep: needs a CUDA (Hopper) device")
    env = env_line()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.case or list(CASES):
        try:
            results.append(run_case(name, args.rounds, args.config, args.identity))
        except Exception as e:  # one failing variant must not lose the other cases
            print(f"{name}: FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        (args.out / "sweep.json").write_text(json.dumps({"env": env, "cases": results}, indent=1))
    rope = rope_host() if args.rope_host else None
    (args.out / "sweep.json").write_text(json.dumps({"env": env, "cases": results, "rope_host": rope}, indent=1))
    (args.out / "sweep.md").write_text(_markdown(results, rope, env))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

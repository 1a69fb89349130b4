"""A whole Llama-3 decoder layer from the coda_agent.kernels ops, against the standard layer.

Why: the ops are judged one at a time (``op_training_probe.py``); a user wires them into a
layer, where the deferred-RMSNorm ops hand ``normed_w`` / ``rstd`` from one GEMM to the
next (CODA's rewrite of a Transformer block as GEMM-epilogue programs, paper section 3).
This file is that wiring, written once, checked against the standard definition and
timed. It is the worked example the README points to.

The layer (pre-norm, Meta's interleaved RoPE, grouped-query attention, SwiGLU MLP with
gate/up rows interleaved in ``w1``), for a residual stream ``x`` (M, D) bf16, M = B * S:

* standard (:func:`standard_layer`): ``h = RMSNorm(x) * g1``; ``qkv = RoPE(h W_qkv^T)``;
  ``x2 = x + SDPA(qkv) W_o^T``; ``h2 = RMSNorm(x2) * g2``; ``x3 = x2 + SwiGLU(h2 W1^T) W_down^T``.
* CODA (:func:`coda_layer`): rstd of x in torch, ``deferred_rmsnorm_qkv_rope(x * g1, rstd,
  ...)`` (gemm_rmsnorm_rope: rstd and RoPE in the QKV GEMM's epilogue); attention is
  PyTorch's SDPA (not a GEMM epilogue); ``residual_rmsnorm(attn, W_o, x, g2)``
  (gemm_residual_partial_rms: residual add + RMSNorm statistics in the out-projection's
  epilogue); then the MLP, three ways (``mlp=``):
  ``"swiglu"``: ``h2 = normed_w * rstd`` in torch, then ``swiglu`` (swiglu_fwd forward,
  swiglu_bwd backward); ``"deferred"``: ``deferred_rmsnorm_swiglu`` (gemm_rmsnorm_swiglu:
  rstd + SwiGLU in the gate/up epilogue, plain torch backward), down projection in torch;
  ``"deferred_mlp"``: ``deferred_rmsnorm_swiglu_mlp`` (gemm_rmsnorm_swiglu forward,
  swiglu_bwd backward: neither h2 nor a torch SwiGLU backward).

:func:`check` compares both with the standard layer in fp32 from the same bf16 inputs
(outputs and the gradients of x and every weight; error budget 2 x the standard bf16
layer's error, as the verifier's). :func:`main` times one training step (forward +
gradients), eager, ``torch.compile`` and CUDA graphs (``mode="reduce-overhead"``), in
rounds that each time every variant (:func:`time_step`).

Usage (device, after ``source .device-bundle/p2/install.sh && source benchmarks/device_env.sh``)::

    python3 benchmarks/llama_layer.py --out $OUT/layer [--check-only | --time-only] [--shape llama3-8b]
        [--layers N] [--profile N]

Writes ``llama_layer.json``. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

EPS = 1e-5  # Llama-3's rms_norm_eps


@dataclass(frozen=True)
class LayerShape:
    """Llama-3 layer dims: D model width, I MLP width, heads of HD columns; S tokens per sequence."""

    name: str
    D: int
    I: int  # noqa: E741 (the field's name for the MLP width)
    HQ: int
    HKV: int
    HD: int


LLAMA3_1B = LayerShape("llama3-1b", D=2048, I=8192, HQ=32, HKV=8, HD=64)
LLAMA3_8B = LayerShape("llama3-8b", D=4096, I=14336, HQ=32, HKV=8, HD=128)
SHAPES = {s.name: s for s in (LLAMA3_1B, LLAMA3_8B)}
MLPS = ("swiglu", "deferred", "deferred_mlp")
"""The MLP wirings of :func:`coda_layer` (module docstring)."""
PARAMS = ("g1", "w_qkv", "w_o", "g2", "w1", "w_down")
"""The layer's weights, in the order the layer functions take them after x."""


def make_inputs(shape: LayerShape, M: int, *, device: str, dtype=torch.bfloat16, seed: int = 0) -> list:
    """[x, g1, w_qkv, w_o, g2, w1, w_down] with nn.Linear-like scales (x (M, D) N(0, 1),
    weights N(0, 1/fan_in), RMSNorm gammas in [0.5, 1.5])."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*s, std=1.0):
        return (torch.randn(*s, generator=g, device=device) * std).to(dtype)

    def gamma(n):
        return (torch.rand(n, generator=g, device=device) + 0.5).to(dtype)

    D, n_qkv = shape.D, (shape.HQ + 2 * shape.HKV) * shape.HD
    return [randn(M, D), gamma(D), randn(n_qkv, D, std=D ** -0.5), randn(D, shape.HQ * shape.HD, std=D ** -0.5),
            gamma(D), randn(2 * shape.I, D, std=D ** -0.5), randn(D, shape.I, std=shape.I ** -0.5)]


def rope_tables(M: int, S: int, head_dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (M,) int64 (0..S-1 per sequence) and Llama-3's inv_freq (HD/2,) fp32 (theta
    500000, unscaled: Llama-3.1/3.2 checkpoints rescale it, "llama3" rope scaling; the
    rotation is the same op, only the table differs)."""
    positions = torch.arange(M, device=device) % S
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    return positions, inv_freq.float()


def _rmsnorm(x, gamma):
    rstd = torch.rsqrt(x.to(torch.promote_types(x.dtype, torch.float32)).pow(2).mean(-1, keepdim=True) + EPS)
    return (x * rstd).to(x.dtype) * gamma


def rope_interleaved(qkv, positions, inv_freq, n_q_heads: int, n_kv_heads: int, head_dim: int):
    """Meta's interleaved RoPE, the standard definition: pair (2j, 2j+1) of every query and
    key head of ``qkv`` (M, (n_q_heads + 2 n_kv_heads) head_dim) turns by positions[m] *
    inv_freq[j] (angles and rotation in fp32, float64 for float64 input); value heads pass
    through. Also ``op_training_probe.py``'s standard ``qkv_rope``."""
    n_rot = (n_q_heads + n_kv_heads) * head_dim
    theta = positions.to(torch.float64 if qkv.dtype == torch.float64 else torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = theta.cos()[:, None, :], theta.sin()[:, None, :]
    pairs = qkv[:, :n_rot].to(cos.dtype).unflatten(1, (n_q_heads + n_kv_heads, head_dim // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(1).to(qkv.dtype)
    return torch.cat((rot, qkv[:, n_rot:]), dim=1)


def _attention(qkv, S: int, s: LayerShape):
    """Causal grouped-query SDPA over sequences of S tokens: qkv (M, (HQ + 2 HKV) HD) -> (M, HQ HD)."""
    M = qkv.shape[0]
    q, k, v = qkv.split((s.HQ * s.HD, s.HKV * s.HD, s.HKV * s.HD), dim=1)
    heads = lambda t, h: t.reshape(M // S, S, h, s.HD).transpose(1, 2)  # noqa: E731
    o = F.scaled_dot_product_attention(heads(q, s.HQ), heads(k, s.HKV), heads(v, s.HKV), is_causal=True,
                                       enable_gqa=True)
    return o.transpose(1, 2).reshape(M, s.HQ * s.HD)


def standard_layer(x, g1, w_qkv, w_o, g2, w1, w_down, *, positions, inv_freq, S: int, shape: LayerShape):
    """The Llama-3 decoder layer in plain PyTorch (the definition the CODA layer is checked against)."""
    qkv = rope_interleaved(_rmsnorm(x, g1) @ w_qkv.T, positions, inv_freq, shape.HQ, shape.HKV, shape.HD)
    x2 = x + _attention(qkv, S, shape) @ w_o.T
    pre = _rmsnorm(x2, g2) @ w1.T
    return x2 + (F.silu(pre[:, 0::2]) * pre[:, 1::2]) @ w_down.T


def coda_layer(x, g1, w_qkv, w_o, g2, w1, w_down, *, positions, inv_freq, S: int, shape: LayerShape,
               mlp: str = "swiglu"):
    """The same layer through coda_agent.kernels (see the module docstring for the wiring)."""
    import coda_agent.kernels as K

    heads = {"n_q_heads": shape.HQ, "n_kv_heads": shape.HKV, "head_dim": shape.HD}
    rstd = torch.rsqrt(x.to(torch.promote_types(x.dtype, torch.float32)).pow(2).mean(-1) + EPS)
    qkv = K.deferred_rmsnorm_qkv_rope(x * g1, rstd, w_qkv, positions, inv_freq, **heads)
    x2, normed_w, rstd2 = K.residual_rmsnorm(_attention(qkv, S, shape), w_o, x, g2, eps=EPS)
    if mlp == "swiglu":
        h2 = (normed_w.to(rstd2.dtype) * rstd2[:, None]).to(x.dtype)
        return x2 + K.swiglu(h2, w1, w_down)
    if mlp == "deferred":
        _, postact = K.deferred_rmsnorm_swiglu(normed_w, rstd2, w1)
        return x2 + postact @ w_down.T
    if mlp == "deferred_mlp":
        return x2 + K.deferred_rmsnorm_swiglu_mlp(normed_w, rstd2, w1, w_down)
    raise ValueError(f"mlp must be one of {MLPS}, got {mlp!r}")


def _grads(fn, args, dy):
    xs = [a.detach().requires_grad_() for a in args]
    out = fn(*xs)
    return (out, *torch.autograd.grad(out, xs, dy))


def check(shape: LayerShape, M: int, S: int, *, device: str = "cuda", mlp: str = "swiglu", seed: int = 0) -> dict:
    """Max abs error of the CODA layer's output and gradients (x, then :data:`PARAMS`) against
    the standard layer in fp32 from the same bf16 inputs, next to the standard bf16 layer's
    error (the budget is twice that). Returns ``{name: {"coda": err, "standard_bf16": err}}``."""
    args = make_inputs(shape, M, device=device, seed=seed)
    positions, inv_freq = rope_tables(M, S, shape.HD, device)
    kw = dict(positions=positions, inv_freq=inv_freq, S=S, shape=shape)
    dy = make_inputs(shape, M, device=device, seed=seed + 1)[0]
    ref = _grads(lambda *a: standard_layer(*a, **kw), [a.float() for a in args], dy.float())
    low = _grads(lambda *a: standard_layer(*a, **kw), args, dy)
    got = _grads(lambda *a: coda_layer(*a, mlp=mlp, **kw), args, dy)
    names = ("out", "dx", *(f"d{p}" for p in PARAMS))
    return {n: {"coda": (g.float() - r).abs().max().item(), "standard_bf16": (b.float() - r).abs().max().item()}
            for n, g, r, b in zip(names, got, ref, low)}


def _bench(fn) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=50, rep=1000, return_mode="median"))


def time_step(shape: LayerShape, M: int, S: int, rounds: int = 3, profile: int = 0, layers: int = 1) -> dict:
    """Median ms of one training step (forward + gradients of x and every weight) per
    implementation: standard / coda (each MLP wiring) x eager / compile / cudagraphs.

    The weights are ``nn.Parameter`` s, as in a model: CUDA graph trees keep them in place
    (a plain tensor input is copied into the graph's memory on every replay). Every step
    is compiled, recorded and run a few times first; then ``rounds`` rounds time every
    variant in turn (each a ``do_bench`` median over about 1 s), so the variants of one
    round share the machine's state. Returns ``{variant: {"median": ms, "rounds": [ms]}}``
    and, per CUDA-graph variant, the cudagraph skips Inductor counted (0: it ran as graphs).
    ``layers`` > 1: a stack of that many layers (own weights each; gradients of x and every
    weight), standard and the ``deferred_mlp`` wiring only: whether the per-layer gain
    holds when layers follow each other, as in a model (in one layer's step the GPU starts
    idle and waits for the host's first launches). ``profile`` > 0: afterwards,
    ``profile:<variant>`` for the compiled and graphed variants (except the ``deferred
    swiglu`` wiring's), GPU time per step by kernel and the GPU's idle gaps over that many
    steps (``host_probe.kernel_profile``, top 30 kernels).
    """
    from torch._dynamo.utils import counters

    x, *weights = make_inputs(shape, M, device="cuda")
    for i in range(1, layers):
        weights += make_inputs(shape, M, device="cuda", seed=i)[1:]
    x = x.requires_grad_()
    params = [torch.nn.Parameter(w) for w in weights]
    args = [x, *params]
    positions, inv_freq = rope_tables(M, S, shape.HD, "cuda")
    kw = dict(positions=positions, inv_freq=inv_freq, S=S, shape=shape)
    dy = torch.randn_like(x)
    n = len(PARAMS)

    def stacked(layer):
        def run(x, *ws):
            for i in range(layers):
                x = layer(x, *ws[i * n:(i + 1) * n])
            return x
        return run
    impls = {"standard": lambda *a: standard_layer(*a, **kw),
             "coda (swiglu op)": lambda *a: coda_layer(*a, mlp="swiglu", **kw),
             "coda (deferred swiglu)": lambda *a: coda_layer(*a, mlp="deferred", **kw),
             "coda (deferred swiglu mlp)": lambda *a: coda_layer(*a, mlp="deferred_mlp", **kw)}
    if layers > 1:
        impls = {k: v for k, v in impls.items() if k in ("standard", "coda (deferred swiglu mlp)")}
    steps, res = {}, {}
    for name, layer in impls.items():
        fn = stacked(layer)
        for mode, f in (("eager", fn), ("compile", torch.compile(fn, dynamic=False)),
                        ("cudagraphs", torch.compile(fn, dynamic=False, mode="reduce-overhead"))):
            key = f"{name} ({mode})"
            if mode == "cudagraphs":   # a new training step: earlier replays' outputs may be overwritten
                step = (lambda f=f: (torch.compiler.cudagraph_mark_step_begin(),
                                     torch.autograd.grad(f(*args), args, dy)))
            else:
                step = (lambda f=f: torch.autograd.grad(f(*args), args, dy))
            skips = counters["inductor"]["cudagraph_skips"]
            try:
                for _ in range(3):          # compile, warm up, record
                    step()
                torch.cuda.synchronize()
            except Exception as e:  # one failing variant must not lose the others
                res[key] = f"failed: {type(e).__name__}: {str(e)[:300]}"
                continue
            if mode == "cudagraphs":
                res[f"cudagraph skips: {key}"] = counters["inductor"]["cudagraph_skips"] - skips
            steps[key] = step
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            times[key].append(round(_bench(step), 4))
    for key, ts in times.items():
        res[key] = {"median": round(statistics.median(ts), 4), "rounds": ts}
    if profile:
        from host_probe import kernel_profile
        for key, step in steps.items():
            if key.endswith(("(compile)", "(cudagraphs)")) and not key.startswith("coda (deferred swiglu) "):
                res[f"profile:{key}"] = kernel_profile(step, profile, top=30)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--check-only", action="store_true", help="numerics only, no timing")
    ap.add_argument("--time-only", action="store_true", help="timing only, no numerics")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: both")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (each times every variant once)")
    ap.add_argument("--layers", type=int, default=1,
                    help="time a stack of this many layers (standard and the deferred_mlp wiring only)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile N steps of every compiled and graphed variant except the deferred "
                         "swiglu wiring's: GPU time by kernel, idle gaps")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.rounds < 1 or args.profile < 0:
        ap.error("--layers and --rounds must be >= 1, --profile >= 0")
    shapes = [SHAPES[n] for n in (args.shape or sorted(SHAPES))]
    if not torch.cuda.is_available():
        raise SystemExit("llama_layer: needs a CUDA (Hopper) device")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_probe import env_line

    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"env": env_line(), "eps": EPS, "check": {}, "step_ms": {}}

    def save():
        (args.out / "llama_layer.json").write_text(json.dumps(results, indent=1))

    for shape in ([] if args.time_only else shapes):
        for mlp in MLPS:
            key = f"{shape.name} M=1024 (2 x 512) mlp={mlp}"
            results["check"][key] = check(shape, 1024, 512, mlp=mlp)
            worst = max(v["coda"] / (2 * v["standard_bf16"] + 1e-6) for v in results["check"][key].values())
            print(key, f"worst error / budget {worst:.3f}", flush=True)
            save()
    if not args.check_only:
        for shape in shapes:
            key = f"{shape.name} M=8192 (1 x 8192)" + (f", {args.layers} layers" if args.layers > 1 else "")
            results["step_ms"][key] = time_step(shape, 8192, 8192, rounds=args.rounds, profile=args.profile,
                                                layers=args.layers)
            print(key, json.dumps({k: v for k, v in results["step_ms"][key].items() if not k.startswith("profile:")}),
                  flush=True)
            save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

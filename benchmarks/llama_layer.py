"""A whole Llama-3 decoder layer from the coda_agent.kernels ops, against the standard layer.

Why: the ops are judged one at a time (``probes/op_training_step.py``); a user wires them into a
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
* chained (:func:`chained_layer`): ``coda_agent.kernels.chained_layer`` (``_chain``: the
  backward inherits the forward's structure, paper section 3: every RMSNorm backward is
  rms_bwd in its consumer's dgrad GEMM, its per-row correction emitted by swiglu_bwd_rms or
  reduced with the RoPE backward; the residual gradient routed into the QKV dgrad), the
  first layer's deferred norm from ``chain_start``; a stack hands ``(x3, normed_w3,
  rstd3)`` from layer to layer (``g_next``), the last layer passes ``g_next=None``.

:func:`check` compares each with the standard layer in fp32 from the same bf16 inputs
(outputs and the gradients of x and every weight; error budget 2 x the standard bf16
layer's error, as the verifier's). :func:`main` times one training step (forward +
gradients), eager, ``torch.compile`` and CUDA graphs (``mode="reduce-overhead"``), in
rounds that each time every variant (:func:`time_step`); with ``--profile N`` (default 2)
it splits every variant's GPU time into GEMM / attention / everything else
(:func:`split_profile`) and states the targets (:func:`targets`: everything else <= 2 % of
the chained step at llama3-8b; compiled chained >= 6 % (8b) / 7 % (1b) faster than
compiled standard; reported, not asserted). Both shapes, defaults: about 5 minutes on one
H200.

Usage (device, after ``source .device-bundle/p2/install.sh && source benchmarks/device_env.sh``)::

    python3 benchmarks/llama_layer.py --out $OUT/layer [--check-only | --time-only] [--shape llama3-8b]
        [--layers N] [--profile N] [--rounds N]

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
VARIANTS = (*MLPS, "chained")
"""What :func:`check` compares with the standard layer: the coda_layer wirings and the chained layer."""
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
    return [
        randn(M, D),
        gamma(D),
        randn(n_qkv, D, std=D**-0.5),
        randn(D, shape.HQ * shape.HD, std=D**-0.5),
        gamma(D),
        randn(2 * shape.I, D, std=D**-0.5),
        randn(D, shape.I, std=shape.I**-0.5),
    ]


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
    through. Also ``probes/op_training_step.py``'s standard ``qkv_rope``."""
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
    o = F.scaled_dot_product_attention(
        heads(q, s.HQ), heads(k, s.HKV), heads(v, s.HKV), is_causal=True, enable_gqa=True
    )
    return o.transpose(1, 2).reshape(M, s.HQ * s.HD)


def standard_layer(x, g1, w_qkv, w_o, g2, w1, w_down, *, positions, inv_freq, S: int, shape: LayerShape):
    """The Llama-3 decoder layer in plain PyTorch (the definition the CODA layer is checked against)."""
    qkv = rope_interleaved(_rmsnorm(x, g1) @ w_qkv.T, positions, inv_freq, shape.HQ, shape.HKV, shape.HD)
    x2 = x + _attention(qkv, S, shape) @ w_o.T
    pre = _rmsnorm(x2, g2) @ w1.T
    return x2 + (F.silu(pre[:, 0::2]) * pre[:, 1::2]) @ w_down.T


def coda_layer(
    x, g1, w_qkv, w_o, g2, w1, w_down, *, positions, inv_freq, S: int, shape: LayerShape, mlp: str = "swiglu"
):
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


def chained_stack(x, *weights, positions, inv_freq, S: int, shape: LayerShape):
    """``len(weights) / 6`` layers (weights in :data:`PARAMS` order per layer) through
    ``coda_agent.kernels.chained_layer``: ``chain_start`` once, then each layer hands
    ``(x3, normed_w3, rstd3)`` to the next (``g_next`` = the next layer's g1); the last
    layer passes ``g_next=None``. Returns the last layer's x3."""
    import coda_agent.kernels as K

    n = len(PARAMS)
    layers = [weights[i : i + n] for i in range(0, len(weights), n)]
    heads = {"n_q_heads": shape.HQ, "n_kv_heads": shape.HKV, "head_dim": shape.HD}
    normed_w, rstd = K.chain_start(x, layers[0][0], eps=EPS)
    for i, ws in enumerate(layers):
        g_next = layers[i + 1][0] if i + 1 < len(layers) else None
        x, normed_w, rstd = K.chained_layer(
            x, normed_w, rstd, *ws, g_next, positions=positions, inv_freq=inv_freq, seq_len=S, eps=EPS, **heads
        )
    return x


def chained_layer(x, g1, w_qkv, w_o, g2, w1, w_down, *, positions, inv_freq, S: int, shape: LayerShape):
    """One layer through the chained ops (a stack of one: ``chain_start`` included)."""
    return chained_stack(x, g1, w_qkv, w_o, g2, w1, w_down, positions=positions, inv_freq=inv_freq, S=S, shape=shape)


def layer_fn(variant: str, **kw):
    """``fn(x, *weights) -> out`` of a stack of ``len(weights) / 6`` layers: ``"standard"``,
    a :data:`MLPS` wiring of :func:`coda_layer`, or ``"chained"`` (:func:`chained_stack`)."""
    if variant == "chained":
        return lambda x, *ws: chained_stack(x, *ws, **kw)
    one = (
        (lambda *a: standard_layer(*a, **kw))
        if variant == "standard"
        else (lambda *a: coda_layer(*a, mlp=variant, **kw))
    )
    n = len(PARAMS)

    def run(x, *ws):
        for i in range(0, len(ws), n):
            x = one(x, *ws[i : i + n])
        return x

    return run


def _grads(fn, args, dy):
    xs = [a.detach().requires_grad_() for a in args]
    out = fn(*xs)
    return (out, *torch.autograd.grad(out, xs, dy))


def check(
    shape: LayerShape,
    M: int,
    S: int,
    *,
    device: str = "cuda",
    mlp: str = "swiglu",
    seed: int = 0,
    layers: int = 1,
    compiled: bool = False,
) -> dict:
    """Max abs error of a CODA variant's output and gradients (x, then :data:`PARAMS` per
    layer) against the standard layer (a stack of ``layers``) in fp32 from the same bf16
    inputs, next to the standard bf16 layer's error (the budget is twice that). ``mlp``: a
    :data:`VARIANTS` name; ``compiled``: the variant under ``torch.compile(fullgraph=True)``.
    Returns ``{name: {"coda": err, "standard_bf16": err}}``."""
    args = make_inputs(shape, M, device=device, seed=seed)
    for i in range(1, layers):
        args += make_inputs(shape, M, device=device, seed=seed + 10 * i)[1:]
    positions, inv_freq = rope_tables(M, S, shape.HD, device)
    kw = dict(positions=positions, inv_freq=inv_freq, S=S, shape=shape)
    dy = make_inputs(shape, M, device=device, seed=seed + 1)[0]
    ref = _grads(layer_fn("standard", **kw), [a.float() for a in args], dy.float())
    low = _grads(layer_fn("standard", **kw), args, dy)
    fn = layer_fn(mlp, **kw)
    got = _grads(torch.compile(fn, fullgraph=True) if compiled else fn, args, dy)
    names = ("out", "dx", *(f"d{p}" + (f"[{i}]" if layers > 1 else "") for i in range(layers) for p in PARAMS))
    return {
        n: {"coda": (g.float() - r).abs().max().item(), "standard_bf16": (b.float() - r).abs().max().item()}
        for n, g, r, b in zip(names, got, ref, low, strict=False)
    }


def _bench(fn, rep: int = 1000) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=50, rep=rep, return_mode="median"))


ATTENTION_WORDS = ("flash", "fmha", "sdpa", "attention", "cudnn::fusion")
"""Attention kernels by name (lower case): FlashAttention / cuDNN SDPA forward and backward,
and cuDNN's SDPA helpers (``cudnn::fusion::compute_dot_do_o``, ``convert_dq_to_16bits``,
``fmha_reduce_head``)."""
GEMM_WORDS = ("gemmmod", "gemm", "xmma", "nvjet", "cutlass")
"""GEMM kernels by name (lower case): quack's ``GemmMod`` kernels (the accepted kernels) and
cuBLAS / cuBLASLt. Inductor's triton kernels (``triton_*``) are never GEMMs here (no
max-autotune templates), though their names may carry a custom op's name."""


def kernel_class(name: str) -> str:
    """``"attention"``, ``"gemm"`` or ``"other"`` for a profiled kernel name (attention first:
    SDPA kernel names may also say wgmma / xmma)."""
    low = name.lower()
    if any(w in low for w in ATTENTION_WORDS):
        return "attention"
    if not low.startswith("triton_") and any(w in low for w in GEMM_WORDS):
        return "gemm"
    return "other"


def split_profile(prof: dict, top_other: int = 15) -> dict:
    """GPU time per step of a ``host_probe.kernel_profile`` result (with every kernel in its
    ``top``) by class: ``{"gemm us", "attention us", "other us", "other %"}`` (% of the
    busy GPU time) and ``"other top"``: the ``top_other`` costliest other kernels."""
    by = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    others = []
    for k in prof["top"]:
        c = kernel_class(k["kernel"])
        by[c] += k["us/step"]
        if c == "other":
            others.append(k)
    busy = sum(by.values()) or 1.0
    return {
        "gemm us": round(by["gemm"], 1),
        "attention us": round(by["attention"], 1),
        "other us": round(by["other"], 1),
        "other %": round(100 * by["other"] / busy, 2),
        "other top": others[:top_other],
    }


def down_proj_choice(shape: LayerShape, M: int) -> dict:
    """ms of the last layer's down projection with its residual (``chained_mlp`` without
    g_next): cuBLAS addmm with x2 as C (what it runs), the gemm_residual_partial_rms kernel
    with gamma = ones (the alternative), and mm + add."""
    import coda_agent.kernels as K

    g = torch.Generator(device="cuda").manual_seed(0)
    post = torch.randn(M, shape.I, generator=g, device="cuda").to(torch.bfloat16)
    w_down = (torch.randn(shape.D, shape.I, generator=g, device="cuda") * shape.I**-0.5).to(torch.bfloat16)
    x2 = torch.randn(M, shape.D, generator=g, device="cuda").to(torch.bfloat16)
    ones = torch.ones(shape.D, device="cuda", dtype=torch.bfloat16)
    cases = {
        "addmm (x2 as C)": lambda: torch.addmm(x2, post, w_down.T),
        "gemm_residual_partial_rms (gamma = ones)": lambda: K.gemm_residual_partial_rms_op(post, w_down, x2, ones),
        "mm + add": lambda: x2 + post @ w_down.T,
    }
    res = {}
    for name, fn in cases.items():
        try:
            fn()
            res[name] = round(_bench(fn, rep=300), 4)
        except Exception as e:  # a kernel not accepted must not lose the others
            res[name] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return res


def time_step(shape: LayerShape, M: int, S: int, rounds: int = 2, profile: int = 0, layers: int = 1) -> dict:
    """Median ms of one training step (forward + gradients of x and every weight) per
    implementation: standard / coda (each MLP wiring) / chained x eager / compile / cudagraphs.

    The weights are ``nn.Parameter`` s, as in a model: CUDA graph trees keep them in place
    (a plain tensor input is copied into the graph's memory on every replay). Every step
    is compiled, recorded and run a few times first; then ``rounds`` rounds time every
    variant in turn (each a ``do_bench`` median over about 1 s), so the variants of one
    round share the machine's state. Returns ``{variant: {"median": ms, "rounds": [ms]}}``
    and, per CUDA-graph variant, the cudagraph skips Inductor counted (0: it ran as graphs).
    ``layers`` > 1: a stack of that many layers (own weights each; gradients of x and every
    weight; the chained stack hands normed_w / rstd from layer to layer), standard, the
    ``deferred_mlp`` wiring and chained only. ``profile`` > 0: afterwards, for every variant,
    ``profile:<variant>``: GPU time per step by kernel and the GPU's idle gaps over that
    many steps (``host_probe.kernel_profile``, top 30 kernels) and ``split``: GEMM /
    attention / other (:func:`split_profile`).
    """
    from torch._dynamo.utils import counters

    # the variants' step functions share code objects (layer_fn's run): dynamo's per-code
    # recompile limit (8) would send the later ones back to eager without an error
    torch._dynamo.reset()
    for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))
    x, *weights = make_inputs(shape, M, device="cuda")
    for i in range(1, layers):
        weights += make_inputs(shape, M, device="cuda", seed=i)[1:]
    x = x.requires_grad_()
    params = [torch.nn.Parameter(w) for w in weights]
    args = [x, *params]
    positions, inv_freq = rope_tables(M, S, shape.HD, "cuda")
    kw = dict(positions=positions, inv_freq=inv_freq, S=S, shape=shape)
    dy = torch.randn_like(x)
    impls = {
        "standard": "standard",
        "coda (swiglu op)": "swiglu",
        "coda (deferred swiglu)": "deferred",
        "coda (deferred swiglu mlp)": "deferred_mlp",
        "chained": "chained",
    }
    if layers > 1:
        impls = {k: v for k, v in impls.items() if v in ("standard", "deferred_mlp", "chained")}
    steps, res = {}, {}
    for name, variant in impls.items():
        fn = layer_fn(variant, **kw)
        for mode, f in (
            ("eager", fn),
            ("compile", torch.compile(fn, dynamic=False)),
            ("cudagraphs", torch.compile(fn, dynamic=False, mode="reduce-overhead")),
        ):
            key = f"{name} ({mode})"
            if mode == "cudagraphs":  # a new training step: earlier replays' outputs may be overwritten

                def step(f=f):
                    torch.compiler.cudagraph_mark_step_begin()
                    return torch.autograd.grad(f(*args), args, dy)
            else:

                def step(f=f):
                    return torch.autograd.grad(f(*args), args, dy)

            skips = counters["inductor"]["cudagraph_skips"]
            try:
                for _ in range(3):  # compile, warm up, record
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
        from host_time_by_layer import kernel_profile

        for key, step in steps.items():
            prof = kernel_profile(step, profile, top=10**6)
            res[f"split:{key}"] = split_profile(prof)
            res[f"profile:{key}"] = {**prof, "top": prof["top"][:30]}
    return res


TARGETS = {"llama3-8b": {"other %": 2.0, "compile speedup %": 6.0}, "llama3-1b": {"compile speedup %": 7.0}}
"""Targets of the chained layer (reported, not asserted): GPU time outside GEMM + attention
as a share of the chained step's busy GPU time; compiled chained step vs compiled standard."""


def targets(shape_name: str, res: dict) -> dict:
    """The chained layer against :data:`TARGETS` from one :func:`time_step` result, per mode
    (compile, cudagraphs, eager): the step's speedup over the standard one
    (``100 (t_std / t_chained - 1)``) and, when profiled, the other kernels' share of the
    busy GPU time (``other %``, the target's measure) and of the timed step."""

    def ms(key):
        v = res.get(key)
        return v["median"] if isinstance(v, dict) else None

    out = {"targets": TARGETS.get(shape_name, {})}
    for mode in ("compile", "cudagraphs", "eager"):
        std, ch = ms(f"standard ({mode})"), ms(f"chained ({mode})")
        if std and ch:
            out[f"{mode} speedup %"] = round(100 * (std / ch - 1), 2)
        sp = res.get(f"split:chained ({mode})")
        if sp:
            out[f"{mode} other %"] = sp["other %"]
            if ch:
                out[f"{mode} other % of step time"] = round(sp["other us"] / (10 * ch), 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--check-only", action="store_true", help="numerics only, no timing")
    ap.add_argument("--time-only", action="store_true", help="timing only, no numerics")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: both")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds (each times every variant once)")
    ap.add_argument(
        "--layers",
        type=int,
        default=1,
        help="time a stack of this many layers (standard, the deferred_mlp wiring and chained)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=2,
        metavar="N",
        help="profile N steps of every variant (0: none): GPU time by kernel, idle gaps, the "
        "GEMM / attention / other split",
    )
    args = ap.parse_args(argv)
    if args.layers < 1 or args.rounds < 1 or args.profile < 0:
        ap.error("--layers and --rounds must be >= 1, --profile >= 0")
    shapes = [SHAPES[n] for n in (args.shape or sorted(SHAPES))]
    if not torch.cuda.is_available():
        raise SystemExit("llama_layer: needs a CUDA (Hopper) device")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_time_by_layer import env_line

    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "env": env_line(),
        "eps": EPS,
        "command": " ".join(sys.argv),
        "check": {},
        "step_ms": {},
        "targets": {},
        "down_proj_ms": {},
    }

    def save():
        (args.out / "llama_layer.json").write_text(json.dumps(results, indent=1))

    for shape in [] if args.time_only else shapes:
        for variant, n in (*((v, 1) for v in VARIANTS), ("chained", 2)):  # + a chained stack: the hand-offs
            key = f"{shape.name} M=1024 (2 x 512) mlp={variant}" + (f", {n} layers" if n > 1 else "")
            try:
                results["check"][key] = check(shape, 1024, 512, mlp=variant, layers=n)
            except Exception as e:  # a kernel not accepted yet must not lose the others
                results["check"][key] = f"failed: {type(e).__name__}: {str(e)[:300]}"
                print(key, results["check"][key], flush=True)
                continue
            worst = max(v["coda"] / (2 * v["standard_bf16"] + 1e-6) for v in results["check"][key].values())
            print(key, f"worst error / budget {worst:.3f}", flush=True)
            save()
    if not args.check_only:
        for shape in shapes:
            key = f"{shape.name} M=8192 (1 x 8192)" + (f", {args.layers} layers" if args.layers > 1 else "")
            res = results["step_ms"][key] = time_step(
                shape, 8192, 8192, rounds=args.rounds, profile=args.profile, layers=args.layers
            )
            results["targets"][key] = targets(shape.name, res)
            results["down_proj_ms"][shape.name] = down_proj_choice(shape, 8192)
            print(
                key, json.dumps({k: v for k, v in res.items() if not k.startswith(("profile:", "split:"))}), flush=True
            )
            print(
                key,
                "split (us/step: gemm, attention, other, other %):",
                json.dumps(
                    {
                        k[6:]: [v["gemm us"], v["attention us"], v["other us"], v["other %"]]
                        for k, v in res.items()
                        if k.startswith("split:")
                    }
                ),
                flush=True,
            )
            print(
                key,
                "targets:",
                json.dumps(results["targets"][key]),
                "down projection + residual (ms):",
                json.dumps(results["down_proj_ms"][shape.name]),
                flush=True,
            )
            save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train a random-init Hugging Face Llama or Qwen3 with and without ``apply_coda``: loss parity and speed.

Why: ``apply_coda`` (``coda_agent.kernels.hf``) is the one-line way to use the library in a
real model; this is its end-to-end check on the H200 (the CPU tests check the patching
logic, ``tests/kernels/test_hf_patch.py``'s GPU tests the numerics of one step).

``--parity``: a Llama of ``--layers`` (default 4) layers at llama3-1b widths (hidden 2048,
MLP 8192, 32 query / 8 key-value heads of 64), vocabulary 128256, bf16 weights, trained
``--steps`` (default 100) AdamW steps (lr 3e-4 after 10 warm-up steps, betas (0.9, 0.95),
weight decay 0.1, gradients clipped to norm 1 with the norm in fp32) on fixed synthetic
batches (``--batch`` x 2048 tokens from a random Markov chain with 4 successors per token,
so the loss falls from ~ln(128256) towards ln 4). Four runs from one initialization over
the same batches: unpatched eager, unpatched ``torch.compile``, patched eager, patched
compiled. The band is what reduction order alone does: |unpatched eager - unpatched
compiled| per step (Inductor fuses and reduces in another order); the patched runs are
compared with the unpatched run of the same mode. Losses and gradient norms per step are
written; the summary gives max |difference| over all steps and over the last 20.

``--speed``: tokens/s (CUDA events; median over ``--rounds`` rounds of ``--steps-timed``
training steps: forward, backward, AdamW step) and peak memory
(``torch.cuda.max_memory_allocated`` over the timed steps: weights, gradients, optimizer
state, activations) for: unpatched eager, unpatched compiled, coda (``apply_coda``), coda
compiled, coda with ``fused_lm_head=True`` compiled (the memory option; eager too with
``--all``), Liger Kernel's ``apply_liger_kernel_to_llama`` (its defaults, incl. its fused
linear cross-entropy) eager and compiled -- Liger patches transformers' modules globally,
so its variants run in a child process. At llama3-1b widths (``--layers``, default 4,
tied embeddings) and llama3-8b widths (2 layers), 4 x 2048 tokens per step. Also the LM
head + loss alone (compiled plain, and ``linear_cross_entropy``), to say how much of a step
the unchanged head is.

``--profile``: where a step's GPU time goes, unpatched compiled against coda compiled (and
its ``mlp="swiglu"`` wiring): GEMM, attention, other and idle time per step over two
profiled steps, with the costliest kernels of each class.

``--model qwen3``: the same for Qwen3 (QK-norm: per-head RMSNorm of q and k before RoPE),
at qwen3-1.7b widths (hidden 2048, MLP 6144, 16 query / 8 key-value heads of 128, tied
embeddings; ``--parity`` and the first ``--speed`` shape, 4 layers) and qwen3-8b widths
(hidden 4096, MLP 12288, 32 / 8 heads of 128; 2 layers), vocabulary 151936, rope_theta
1e6, rms_norm_eps 1e-6; Liger's ``apply_liger_kernel_to_qwen3``. The QK-norm projection
runs on ``gemm_qknorm_rope`` where that kernel is accepted, else on ``gemm_rmsnorm`` with
the per-head norm and RoPE in torch (``versions.accepted_kernels`` says which); with the
kernel accepted ``--speed`` also times the torch path ("coda, QK-norm in torch + compile").

Usage (device, from the repo root, after ``source .device-bundle/p2/install.sh && source
benchmarks/device_env.sh``; transformers and liger-kernel travel as wheels in the
git-ignored ``.device-bundle/hf`` and ``.device-bundle/liger`` (``benchmarks/hf_bundle.sh``
downloads them) and device_env.sh puts them on the path)::

    python3 benchmarks/hf_train.py --parity --speed --profile --out $OUT/hf [--quick] [--shape llama3-8b]
    python3 benchmarks/hf_train.py --model qwen3 --parity --speed --out $OUT/hf-qwen3 [--quick]

Writes ``hf_train.json`` under ``--out`` (copy it to ``benchmarks/results/dev/``) and prints
markdown tables. Wall time on one H200, compiles included: ``--parity`` ~110 s, ``--speed``
264 s (both shapes, Liger included), ``--profile`` (both shapes) 151 s; run each as its own
command under a 10-minute limit. Results: ``benchmarks/results/2026-12-02-nvidia-h200-hf-llama.md``. A failing variant or
run is reported (``failed: ...``), never fatal. Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "llama3-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
}
DEFAULT_LAYERS = {"llama3-1b": 4, "llama3-8b": 2, "qwen3-1.7b": 4, "qwen3-8b": 2}
FAMILIES = {
    # model: transformers config / model classes, Liger's patch, vocabulary, norm eps, RoPE
    # base, its shapes (the first is --parity's)
    "llama": dict(
        config="LlamaConfig",
        model="LlamaForCausalLM",
        liger="apply_liger_kernel_to_llama",
        vocab=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        shapes=("llama3-1b", "llama3-8b"),
    ),
    "qwen3": dict(
        config="Qwen3Config",
        model="Qwen3ForCausalLM",
        liger="apply_liger_kernel_to_qwen3",
        vocab=151936,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        shapes=("qwen3-1.7b", "qwen3-8b"),
    ),
}
SEQ = 2048
NO_RPR = "unpatched eager, no reduced-precision GEMM reduction"
"""The second band's run: ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False``
(cuBLAS reduces split-K partial sums in fp32 instead of bf16: another reduction order)."""
DEVICE = "cuda"
"""Where models and batches live (the CPU smoke test sets "cpu", with tiny SHAPES)."""
COMPILE = torch.compile
"""How a variant is compiled (the CPU smoke test uses the aot_eager backend)."""


# --------------------------------------------------------------------------- models and data


def family(shape: str) -> dict:
    """The :data:`FAMILIES` entry whose shapes include ``shape``."""
    return next(f for f in FAMILIES.values() if shape in f["shapes"])


def make_config(shape: str, layers: int):
    import transformers

    fam = family(shape)
    return getattr(transformers, fam["config"])(
        **SHAPES[shape],
        num_hidden_layers=layers,
        vocab_size=fam["vocab"],
        max_position_embeddings=8192,
        rms_norm_eps=fam["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": fam["rope_theta"]},
        attn_implementation="sdpa",
        use_cache=False,
    )


def _model_class(config):
    import transformers

    fam = next(f for f in FAMILIES.values() if f["config"] == type(config).__name__)
    return getattr(transformers, fam["model"])


def init_state(config, seed: int = 0) -> dict:
    """The initial weights (bf16, on :data:`DEVICE`) every run of a shape starts from."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = _model_class(config)._from_config(config, dtype=torch.bfloat16)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    return state


def build(
    config,
    state: dict,
    *,
    coda: bool = False,
    fused_lm_head: bool = False,
    liger: bool = False,
    mlp: str | None = None,
    qk_norm_torch: bool = False,
):
    """A fresh model holding ``state``, optionally patched (apply_coda with ``mlp`` or its
    default wiring, ``qk_norm_torch``: a QK-norm model's projection on the torch path even
    where gemm_qknorm_rope is accepted / Liger's patch of the model's family), in training
    mode."""
    with torch.device(DEVICE):
        model = _model_class(config)._from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(state, strict=True)
    if coda:
        import coda_agent.kernels as K

        ready = K.qknorm_kernel_ready
        K.qknorm_kernel_ready = (lambda head_dim, eps: False) if qk_norm_torch else ready
        try:
            K.apply_coda(model, fused_lm_head=fused_lm_head, **({"mlp": mlp} if mlp else {}))
        finally:
            K.qknorm_kernel_ready = ready
    if liger:
        import liger_kernel.transformers as lt

        fam = next(f for f in FAMILIES.values() if f["config"] == type(config).__name__)
        getattr(lt, fam["liger"])(model=model)
    model.train()
    return model


def markov_batches(n: int, batch: int, vocab: int, seq: int | None = None, seed: int = 1) -> list[torch.Tensor]:
    """``n`` fixed (batch, seq) int64 batches (default seq :data:`SEQ`) over ``vocab`` tokens
    on :data:`DEVICE`: a random Markov chain in which each token has 4 equally likely
    successors (entropy ln 4)."""
    seq = seq or SEQ
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(vocab, (vocab, 4), generator=g)
    tok = torch.empty(n * batch, seq, dtype=torch.int64)
    tok[:, 0] = torch.randint(vocab, (n * batch,), generator=g)
    for i in range(1, seq):
        tok[:, i] = succ[tok[:, i - 1], torch.randint(4, (n * batch,), generator=g)]
    return [t.to(DEVICE) for t in tok.split(batch)]


def _free():
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()  # one model's compiled code must not count against the next's recompile limit


def grad_norm_fp32(params) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]))


def train_step(fn, model, opt, ids, max_norm: float | None = 1.0):
    """One step: loss, backward, fp32 grad norm + clipping, AdamW. Returns (loss, grad norm) tensors."""
    loss = fn(input_ids=ids, labels=ids).loss
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = grad_norm_fp32(params)
    if max_norm is not None:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([p.grad for p in params], coef)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach(), norm.detach()


def adamw(model, lr=3e-4):
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)


# --------------------------------------------------------------------------- parity


def parity(args, res: dict) -> None:
    """The four runs of the module docstring into ``res["parity"]``: per-step losses and grad
    norms of each, and :func:`parity_summary`."""
    shape = FAMILIES[args.model]["shapes"][0]
    config = make_config(shape, args.layers or DEFAULT_LAYERS[shape])
    state = init_state(config)
    batches = markov_batches(args.n_batches, args.batch, config.vocab_size)
    runs = {}
    for name, coda, compiled in (
        ("unpatched eager", False, False),
        ("unpatched compile", False, True),
        (NO_RPR, False, False),
        ("coda eager", True, False),
        ("coda compile", True, True),
    ):
        rpr = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = rpr and name != NO_RPR
        try:
            model = build(config, state, coda=coda)
            opt = adamw(model)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
            fn = COMPILE(model) if compiled else model
            losses, norms = [], []
            t0 = time.perf_counter()
            for step in range(args.steps):
                loss, norm = train_step(fn, model, opt, batches[step % len(batches)])
                sched.step()
                losses.append(loss)
                norms.append(norm)
            runs[name] = {
                "loss": [x.item() for x in losses],
                "grad_norm": [x.item() for x in norms],
                "wall_s": round(time.perf_counter() - t0, 1),
            }
            print(
                f"parity: {name}: loss {runs[name]['loss'][0]:.4f} -> {runs[name]['loss'][-1]:.4f} "
                f"({runs[name]['wall_s']} s)",
                flush=True,
            )
        except Exception as e:  # one failing run must not lose the others
            runs[name] = f"failed: {type(e).__name__}: {str(e)[:500]}"
            traceback.print_exc()
        finally:
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = rpr
            model = opt = fn = None
            _free()
    res["parity"] = {
        "config": {
            "shape": shape,
            "layers": config.num_hidden_layers,
            "vocab": config.vocab_size,
            "seq": SEQ,
            "batch": args.batch,
            "steps": args.steps,
            "lr": 3e-4,
            "n_batches": args.n_batches,
        },
        "runs": runs,
        "summary": parity_summary(runs),
    }


def _diff(a: list, b: list, tail: int = 20) -> dict:
    d = [abs(x - y) for x, y in zip(a, b, strict=False)]
    return {
        "max": max(d),
        "mean": statistics.fmean(d),
        "max_last": max(d[-tail:]),
        "mean_last": statistics.fmean(d[-tail:]),
    }


def parity_summary(runs: dict) -> dict:
    """Per metric: the bands (unpatched eager against unpatched compiled, and against unpatched
    eager with cuBLAS's reduced-precision bf16 GEMM reduction off) and each patched run
    against the unpatched run of its mode: max / mean |difference| over all steps and the
    last 20; a patched run is within the band when its max is at most the larger band's."""
    ok = {k: v for k, v in runs.items() if isinstance(v, dict)}
    out = {}
    for metric in ("loss", "grad_norm"):
        m = {}
        for other in ("unpatched compile", NO_RPR):
            if {"unpatched eager", other} <= ok.keys():
                m[f"band: unpatched eager vs {other.removeprefix('unpatched ')}"] = _diff(
                    ok["unpatched eager"][metric], ok[other][metric]
                )
        for mode in ("eager", "compile"):
            if {f"coda {mode}", f"unpatched {mode}"} <= ok.keys():
                m[f"coda {mode} vs unpatched {mode}"] = _diff(
                    ok[f"coda {mode}"][metric], ok[f"unpatched {mode}"][metric]
                )
        band = max((v["max"] for k, v in m.items() if k.startswith("band")), default=None)
        if band is not None:
            for k, v in m.items():
                if not k.startswith("band"):
                    v["within_band (max)"] = v["max"] <= band
                    v["ratio_to_band (max)"] = v["max"] / band if band else math.inf
        out[metric] = m
    return out


def print_parity(p: dict) -> None:
    print("\n### Loss parity (" + ", ".join(f"{k} {v}" for k, v in p["config"].items()) + ")\n")
    print("| metric | comparison | max abs diff | mean abs diff | max, last 20 | mean, last 20 | within band |")
    print("|---|---|---|---|---|---|---|")
    for metric, m in p["summary"].items():
        for k, v in m.items():
            print(
                f"| {metric} | {k} | {v['max']:.3e} | {v['mean']:.3e} | {v['max_last']:.3e} | {v['mean_last']:.3e} | "
                f"{v.get('within_band (max)', '')} |"
            )
    for k, v in p["runs"].items():
        if isinstance(v, str):
            print(f"\n{k}: {v}")


# --------------------------------------------------------------------------- speed


def time_training(model, compiled: bool, batches, warmup: int, steps: int, rounds: int) -> dict:
    """Median ms per training step over ``rounds`` rounds of ``steps`` steps (CUDA events),
    tokens/s from it, and the peak allocated memory over the timed steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
    fn = COMPILE(model) if compiled else model
    for i in range(warmup):  # compile, autotune, allocator warm-up
        train_step(fn, model, opt, batches[i % len(batches)])
    cuda = DEVICE == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    per_round = []
    for _ in range(rounds):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for i in range(steps):
            train_step(fn, model, opt, batches[i % len(batches)])
        if cuda:
            end.record()
            end.synchronize()
        per_round.append(start.elapsed_time(end) / steps if cuda else (time.perf_counter() - t0) * 1e3 / steps)
    ms = statistics.median(per_round)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    return {
        "ms_per_step": round(ms, 3),
        "tokens_per_s": round(batches[0].numel() / ms * 1e3),
        "rounds_ms": [round(x, 3) for x in per_round],
        "peak_mem_gib": round(peak, 3),
    }


def head_only(shape: str, tokens: int, rounds: int) -> dict:
    """LM head + loss alone, forward and backward (dh, dW), compiled plain vs
    linear_cross_entropy: median ms of ``rounds`` do_bench medians (CUDA only; {} elsewhere)."""
    if DEVICE != "cuda":
        return {}
    import torch.nn.functional as F
    from triton.testing import do_bench

    import coda_agent.kernels as K

    D, V = SHAPES[shape]["hidden_size"], family(shape)["vocab"]
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(tokens, D, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = torch.nn.Parameter((torch.randn(V, D, device="cuda", generator=g) * D**-0.5).to(torch.bfloat16))
    t = torch.randint(V, (tokens,), device="cuda", generator=g)
    fns = {
        "plain (compile)": torch.compile(lambda h, w, t: F.cross_entropy((h @ w.T).float(), t)),
        "linear_cross_entropy (compile)": torch.compile(lambda h, w, t: K.linear_cross_entropy(h, w, t).mean()),
    }
    out = {}
    for name, f in fns.items():
        try:
            step = lambda f=f: torch.autograd.grad(f(h, w, t), (h, w))  # noqa: E731
            for _ in range(3):
                step()
            out[name] = {
                "ms": round(
                    statistics.median(do_bench(step, warmup=25, rep=300, return_mode="median") for _ in range(rounds)),
                    3,
                )
            }
        except Exception as e:
            out[name] = f"failed: {type(e).__name__}: {str(e)[:300]}"
    _free()
    return out


def speed_variants(args) -> list[tuple[str, dict, bool]]:
    """(name, build kwargs, compiled) of the main-process variants."""
    v = [
        ("unpatched eager", {}, False),
        ("unpatched compile", {}, True),
        ("coda", {"coda": True}, False),
        ("coda + compile", {"coda": True}, True),
        ("coda, fused LM head + compile", {"coda": True, "fused_lm_head": True}, True),
    ]
    if args.all:
        v.append(("coda, fused LM head", {"coda": True, "fused_lm_head": True}, False))
    if args.model == "qwen3" and _qknorm_kernel_accepted():
        v.append(("coda, QK-norm in torch + compile", {"coda": True, "qk_norm_torch": True}, True))
    if args.quick:
        keep = (
            "unpatched compile",
            "coda + compile",
            "coda, fused LM head + compile",
            "coda, QK-norm in torch + compile",
        )
        v = [x for x in v if x[0] in keep]
    return v


def _qknorm_kernel_accepted() -> bool:
    import coda_agent.kernels as K

    return "gemm_qknorm_rope" in K.accepted()


def speed_shape(args, shape: str, variants, liger_only: bool = False, profile: bool = False) -> dict:
    """:func:`time_training` of each ``(name, build kwargs, compiled)`` variant at ``shape``, each
    model fresh from one initialization and freed afterwards: ``{name: result or "failed: ..."}``.
    ``profile``: each result is the step time and :func:`class_profile` of the model instead."""
    config = make_config(shape, args.layers or DEFAULT_LAYERS[shape])
    state = init_state(config)
    batches = markov_batches(2, 4, config.vocab_size)
    res = {"layers": config.num_hidden_layers, "tokens_per_step": batches[0].numel()}
    what = "profile" if profile else "speed"
    for name, kw, compiled in variants:
        model = None
        try:
            model = build(config, state, **kw)
            res[name] = shown = time_training(model, compiled, batches, args.warmup, args.steps_timed, args.rounds)
            if profile:
                res[name] = {"ms_per_step": shown["ms_per_step"], **class_profile(model, compiled, batches[0])}
                shown = {k: res[name][k] for k in PROFILE_SHOWN}
            print(f"{what}: {shape}: {name}: {shown}", flush=True)
        except Exception as e:
            res[name] = f"failed: {type(e).__name__}: {str(e)[:500]}"
            print(f"{what}: {shape}: {name}: {res[name]}", flush=True)
            if not liger_only:
                traceback.print_exc()
        finally:
            model = None
            _free()
    return res


def liger_child(args) -> dict:
    """Liger's variants of every shape, in a child process (Liger patches transformers globally)."""
    out = ROOT / f".hf_train_liger_{os.getpid()}.json"
    cmd = [
        sys.executable,
        __file__,
        "--_liger-worker",
        str(out),
        "--steps-timed",
        str(args.steps_timed),
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        "--model",
        args.model,
    ]
    for s in args.shape:
        cmd += ["--shape", s]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    if args.quick:
        cmd.append("--quick")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.liger_timeout)
        sys.stdout.write(proc.stdout[-4000:])
        if proc.returncode or not out.exists():
            return {s: {"liger": f"failed: child exit {proc.returncode}: {proc.stderr[-800:]}"} for s in args.shape}
        return json.loads(out.read_text())
    except subprocess.TimeoutExpired:
        return {s: {"liger": f"failed: child timed out after {args.liger_timeout} s"} for s in args.shape}
    finally:
        out.unlink(missing_ok=True)


def liger_worker(args) -> int:
    try:
        import liger_kernel  # noqa: F401
    except Exception as e:
        res = {s: {"liger": f"n/a: liger_kernel does not import ({type(e).__name__}: {e})"} for s in args.shape}
    else:
        variants = [("liger", {"liger": True}, False), ("liger + compile", {"liger": True}, True)]
        if args.quick:
            variants = variants[1:]
        res = {s: speed_shape(args, s, variants, liger_only=True) for s in args.shape}
    Path(args._liger_worker).write_text(json.dumps(res))
    return 0


def speed(args, res: dict, save=lambda: None) -> None:
    """Every shape's variants, then Liger's (child process) into ``res["speed"]``; ``save()``
    after each part, so a run cut short by a time limit keeps the parts that finished."""
    res["speed"] = {}
    for shape in args.shape:
        res["speed"][shape] = speed_shape(args, shape, speed_variants(args))
        res["speed"][shape]["lm head + loss only, ms"] = head_only(shape, 4 * SEQ, args.rounds)
        print(f"speed: {shape}: lm head + loss only: {res['speed'][shape]['lm head + loss only, ms']}", flush=True)
        save()
    if not args.no_liger:
        for shape, r in liger_child(args).items():
            res["speed"].setdefault(shape, {}).update(
                {k: v for k, v in r.items() if k not in ("layers", "tokens_per_step")}
            )


def print_speed(sp: dict) -> None:
    for shape, r in sp.items():
        print(
            f"\n### Training step, {shape} widths, {r.get('layers')} layers, {r.get('tokens_per_step')} tokens "
            f"(forward + backward + AdamW)\n"
        )
        base = r.get("unpatched compile")
        print("| variant | ms / step | tokens / s | vs unpatched compile | peak memory GiB |")
        print("|---|---|---|---|---|")
        for name, v in r.items():
            if name in ("layers", "tokens_per_step", "lm head + loss only, ms"):
                continue
            if not isinstance(v, dict):
                print(f"| {name} | {v} | | | |")
                continue
            rel = f"{base['ms_per_step'] / v['ms_per_step']:.3f}x" if isinstance(base, dict) else ""
            print(f"| {name} | {v['ms_per_step']:.2f} | {v['tokens_per_s']:,} | {rel} | {v['peak_mem_gib']:.2f} |")
        head = r.get("lm head + loss only, ms")
        if head:
            print(
                f"\nLM head + loss alone (fwd + bwd, {r.get('tokens_per_step')} tokens): "
                + "; ".join(f"{k}: {v['ms'] if isinstance(v, dict) else v} ms" for k, v in head.items())
            )
        verdict(shape, r)


def verdict(shape: str, r: dict) -> None:
    """The issue's target: coda + compile >= 1.05x unpatched compile (8B widths) and faster than
    Liger (+ compile); where not, how much of the step is the unchanged LM head."""
    u, c, lg = r.get("unpatched compile"), r.get("coda + compile"), r.get("liger + compile")
    if not (isinstance(u, dict) and isinstance(c, dict)):
        return
    sp = u["ms_per_step"] / c["ms_per_step"]
    line = f"{shape}: coda + compile is {sp:.3f}x unpatched compile"
    if isinstance(lg, dict):
        line += f", {lg['ms_per_step'] / c['ms_per_step']:.3f}x Liger + compile"
    head = (r.get("lm head + loss only, ms") or {}).get("plain (compile)")
    if isinstance(head, dict):
        stack_u = u["ms_per_step"] - head["ms"]
        saved = u["ms_per_step"] - c["ms_per_step"]
        line += (
            f"; the LM head + loss (unchanged by default) is ~{head['ms']:.1f} of {u['ms_per_step']:.1f} ms; "
            f"on the rest (decoder stack, embeddings, optimizer) coda saves {saved:.2f} ms of ~{stack_u:.1f} "
            f"({saved / stack_u:.1%})"
        )
    print(line)


# --------------------------------------------------------------------------- profile

PROFILE_VARIANTS = (
    ("unpatched compile", {}, True),
    ("coda + compile", {"coda": True}, True),
    ("coda, mlp=swiglu + compile", {"coda": True, "mlp": "swiglu"}, True),
)
"""``--profile``'s variants: the default patch, the other MLP wiring, and their baseline."""
PROFILE_SHOWN = ("ms_per_step", "gemm us", "attention us", "other us", "idle us", "kernels/step")
"""The keys of a ``--profile`` result printed as it finishes (all of it goes to the JSON)."""


def _kernel_profile(run, steps: int) -> dict:
    """``host_probe.kernel_profile`` of ``run`` with every kernel ranked (CUDA only)."""
    from host_time_by_layer import kernel_profile

    return kernel_profile(run, steps, top=100_000)


def class_profile(model, compiled: bool, ids) -> dict:
    """GPU time per training step of ``model`` on ``ids`` by kernel class
    (``llama_layer.split_profile``: GEMM, attention, other; idle = span - busy) over 2
    profiled steps, with the costliest GEMM and other kernels."""
    from llama_layer import kernel_class, split_profile

    opt, fn = adamw(model, lr=1e-5), COMPILE(model) if compiled else model
    prof = _kernel_profile(functools.partial(train_step, fn, model, opt, ids), 2)
    return {
        **split_profile(prof, top_other=12),
        "idle us": prof.get("idle us/step"),
        "kernels/step": prof["kernels/step"],
        "gemm top": [k for k in prof["top"] if kernel_class(k["kernel"]) == "gemm"][:12],
    }


def profile_shape(args, shape: str) -> dict:
    """:func:`class_profile` and the step time of each :data:`PROFILE_VARIANTS` entry at
    ``shape``: where a patched step's time goes against the unpatched one's."""
    return speed_shape(args, shape, PROFILE_VARIANTS, profile=True)


def print_profile(pr: dict) -> None:
    for shape, r in pr.items():
        print(f"\n### GPU time per training step by kernel class, {shape} widths, {r.get('layers')} layers (us)\n")
        print("| variant | ms / step | GEMM | attention | other | idle | kernels |")
        print("|---|---|---|---|---|---|---|")
        for name, *_ in PROFILE_VARIANTS:
            v = r.get(name)
            if not isinstance(v, dict):
                print(f"| {name} | {v} | | | | | |")
                continue
            print(
                f"| {name} | {v['ms_per_step']:.2f} | {v['gemm us']:.0f} | {v['attention us']:.0f} | "
                f"{v['other us']:.0f} | {v['idle us'] or 0:.0f} | {v['kernels/step']:.0f} |"
            )


# --------------------------------------------------------------------------- main


def versions() -> dict:
    import importlib.metadata as md

    def ver(d):
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            return "not installed"

    import coda_agent.kernels as K

    out = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **{d: ver(d) for d in ("transformers", "liger-kernel", "quack-kernels", "nvidia-cutlass-dsl", "triton")},
        "accepted_kernels": K.accepted(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:

        def git(*a: str) -> subprocess.CompletedProcess:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)

        sha = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
        # Rationale: a device machine gets a copy of the working tree whose .git may be older
        # than the tree; "+dirty" says the code run is not the commit named.
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        out["commit"] = sha + ("+dirty" if dirty and sha != "unknown" else "")
    except OSError:
        out["commit"] = "unknown"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for hf_train.json (required unless --_liger-worker)")
    ap.add_argument("--parity", action="store_true", help="loss / grad-norm parity run (module docstring)")
    ap.add_argument("--speed", action="store_true", help="tokens/s and peak memory per variant")
    ap.add_argument("--profile", action="store_true", help="GPU time by kernel class, patched vs unpatched")
    ap.add_argument("--model", choices=sorted(FAMILIES), default="llama", help="model family (default llama)")
    ap.add_argument(
        "--shape", action="append", choices=sorted(SHAPES), help="--speed shapes (default: both of --model)"
    )
    ap.add_argument("--layers", type=int, help="decoder layers (default: 4 at the 1b widths, 2 at the 8b widths)")
    ap.add_argument("--steps", type=int, default=100, help="--parity AdamW steps (default 100)")
    ap.add_argument("--batch", type=int, default=4, help="--parity sequences of 2048 tokens per step (default 4)")
    ap.add_argument("--n-batches", type=int, default=8, help="--parity: distinct batches, cycled (default 8)")
    ap.add_argument("--steps-timed", type=int, default=10, help="--speed steps per timing round (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="--speed timing rounds (default 3)")
    ap.add_argument("--warmup", type=int, default=3, help="--speed warm-up steps incl. compile (default 3)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="compiled variants only, the 8b widths only unless --shape, --parity 40 steps",
    )
    ap.add_argument("--all", action="store_true", help="--speed: also the fused LM head eager")
    ap.add_argument("--no-liger", action="store_true", help="--speed: skip Liger's variants")
    ap.add_argument("--liger-timeout", type=int, default=300, help="seconds for Liger's child process")
    ap.add_argument("--_liger-worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("hf_train: needs a CUDA (Hopper) device")
    sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))  # host_time_by_layer.kernel_profile
    shapes = FAMILIES[args.model]["shapes"]
    if args.quick and not args.shape:
        args.shape = [shapes[-1]]
    args.shape = args.shape or list(shapes)
    if any(s not in shapes for s in args.shape):
        ap.error(f"--shape {args.shape}: --model {args.model} has shapes {list(shapes)}")
    if args._liger_worker:
        return liger_worker(args)
    if not (args.parity or args.speed or args.profile) or args.out is None:
        ap.error("give --out and at least one of --parity, --speed, --profile")
    if args.quick and args.steps == 100:
        args.steps = 40
    try:
        import transformers  # noqa: F401
    except ModuleNotFoundError as e:
        raise SystemExit(
            "hf_train: needs transformers 5.x (pip install 'coda-agent[hf]'; on the device: "
            "benchmarks/hf_bundle.sh, then source benchmarks/device_env.sh)"
        ) from e
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"versions": versions()}
    print("versions:", json.dumps(res["versions"]), flush=True)

    def save():
        (args.out / "hf_train.json").write_text(json.dumps(res, indent=1))

    if args.parity:
        parity(args, res)
        save()
        print_parity(res["parity"])
    if args.speed:
        speed(args, res, save)
        save()
        print_speed(res["speed"])
    if args.profile:
        res["profile"] = {}
        for shape in args.shape:
            res["profile"][shape] = profile_shape(args, shape)
            save()
        print_profile(res["profile"])
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One training step through the coda_agent.kernels ops vs the same math in PyTorch (dev tool; H200 only).

Why: the results page scores kernels one at a time against their specs' baselines. A user
calls the ops, whose backward may add glue around the kernel. A ``rmsnorm_linear``
backward that computes the RMSNorm correction ``zdz = sum_n dy * out / D`` with one torch
pass over dy and the saved out, both (M, N), before the fused ``rms_bwd`` kernel costs
more than the unfused backward's extra traffic (dz written and read back, (M, D)): for
every consumer of a Llama RMSNorm (QKV, gate/up) N >= D
(``benchmarks/results/dev/2026-12-01-h200-op-training-probe.json``: that glue's
``step:ops (compile)`` 6-16 % over ``step:compile``; its ``deferred composition`` rows are
the glue the ops use). This probe keeps measuring the ops.

Per case, median ms of ``triton.testing.do_bench`` (L2 flushed), all in one process:

* ``step:<impl>``: forward + backward (``torch.autograd.grad`` w.r.t. every input, one
  random upstream gradient) through ``ops`` (coda_agent.kernels, eager), ``ops (compile)``
  (the op under ``torch.compile(dynamic=False)``: the glue's torch code around the kernels
  is then traced and fused by Inductor), ``eager`` (the standard definition in PyTorch),
  ``compile`` (the same, ``torch.compile(dynamic=False)``);
* for qkv_rope also the backward's rotation alone, each compiled: ``R^T glue pass
  (compile)`` (the op's glue, ``_rope.rope_rotate(inverse=True)``) and ``standard rotation
  pass (compile)`` (the standard definition's rotation, the same arithmetic with fp32
  angles);
* for rmsnorm_linear also the backward's pieces: ``zdz pass`` (the glue's torch code),
  ``rms_bwd kernel`` (``rms_bwd_op``), and ``unfused dgrad + RMSNorm bwd (compile)``
  (``torch.compile`` of the rms_bwd spec's baseline: dgrad GEMM then the standard backward).

Usage (device, after ``source .device-bundle/p2/install.sh && source benchmarks/device_env.sh``)::

    python3 benchmarks/probes/op_training_step.py --out $OUT/ops [--cudagraphs] [--profile N] [--case NAME ...]

``--profile N`` adds ``profile:<impl>`` per variant: GPU time per step by kernel (N steps
under ``torch.profiler``). Writes ``op_training.json`` and prints one line per case
(without the profiles). Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from host_time_by_layer import env_line, kernel_profile, load_reference  # noqa: E402  (sibling dev script)
from host_time_by_layer import randn_bf16 as _randn  # noqa: E402
from llama_layer import rope_interleaved  # noqa: E402  (the standard RoPE, written once)


def _bench(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _step(fn, args, dy):
    """forward + backward w.r.t. every floating input (leaves made once; grads returned, not
    accumulated)."""
    xs = [a.detach().requires_grad_() if a.is_floating_point() else a for a in args]
    leaves = [x for x in xs if x.requires_grad]

    def run():
        out = fn(*xs)
        return torch.autograd.grad(out, leaves, dy)

    return run


CUDAGRAPHS = False
"""``--cudagraphs``: also time both under ``torch.compile(mode="reduce-overhead")``."""

PROFILE_STEPS = 0
"""``--profile N``: after timing, also run N steps of each variant under ``torch.profiler``
and record where the GPU time goes (``host_probe.kernel_profile``)."""


def _steps(op, standard, args, dy) -> dict:
    """``step:ops``, ``step:ops (compile)``, ``step:eager``, ``step:compile`` ms for the op and
    the standard definition, eager and under ``torch.compile(dynamic=False)``; with
    :data:`CUDAGRAPHS` also ``... (cudagraphs)`` (``mode="reduce-overhead"``: CUDA graph
    trees replay forward and backward, so host launch time drops out), the number of graph
    skips Inductor counted for each (0: the step really ran as graphs) and the largest
    gradient difference of the graphed op from the eager op (relative to the eager max)."""
    impls = [
        ("ops", op),
        ("ops (compile)", torch.compile(op, dynamic=False)),
        ("eager", standard),
        ("compile", torch.compile(standard, dynamic=False)),
    ]
    if CUDAGRAPHS:
        impls += [
            ("ops (cudagraphs)", torch.compile(op, dynamic=False, mode="reduce-overhead")),
            ("compile (cudagraphs)", torch.compile(standard, dynamic=False, mode="reduce-overhead")),
        ]
    res = {}
    for k, f in impls:
        from torch._dynamo.utils import counters

        skips = counters["inductor"]["cudagraph_skips"]
        run = _step(f, args, dy)
        res[f"step:{k}"] = _bench(run)
        if PROFILE_STEPS:
            res[f"profile:{k}"] = kernel_profile(run, PROFILE_STEPS)
        if "cudagraphs" in k:
            res[f"cudagraph skips:{k}"] = counters["inductor"]["cudagraph_skips"] - skips
        if k == "ops (cudagraphs)":
            want = _step(op, args, dy)()
            got = [g.clone() for g in run()]
            res["grad max rel diff:ops (cudagraphs) vs ops"] = max(
                float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
                for a, b in zip(got, want, strict=False)
            )
    return res


def rmsnorm_linear_case(m, d, n):
    import coda_agent.kernels as K

    ref = load_reference("rms_bwd")
    h, gamma, w = (
        _randn(m, d, std=2.0),
        (torch.rand(d, device="cuda") + 0.5).to(torch.bfloat16),
        _randn(n, d, std=d**-0.5),
    )
    dy = _randn(m, n)
    standard = lambda h, gamma, w: ref.forward(w=w, h=h, gamma=gamma)  # noqa: E731
    res = _steps(K.rmsnorm_linear, standard, (h, gamma, w), dy)
    out = K.rmsnorm_linear(h, gamma, w)
    rstd = ref.saved_rstd(h=h)
    zdz_pass = lambda: (dy.float() * out.float()).sum(dim=-1) / d  # noqa: E731
    zdz = zdz_pass()
    dresid = torch.zeros_like(h)
    res["zdz pass (glue, eager)"] = _bench(zdz_pass)
    res["rms_bwd kernel"] = _bench(lambda: K.rms_bwd_op(dy, w, h, gamma, rstd, zdz, dresid))
    unfused = torch.compile(ref.baseline, dynamic=False)
    res["unfused dgrad + RMSNorm bwd (compile)"] = _bench(
        lambda: unfused(dy=dy, w=w, h=h, gamma=gamma, rstd=rstd, zdz=zdz, dresid=dresid)
    )
    res["dgrad GEMM (cuBLAS)"] = _bench(lambda: dy @ w)
    return res


def swiglu_case(m, k, i):
    import coda_agent.kernels as K

    x, w1, w_down = _randn(m, k), _randn(2 * i, k, std=k**-0.5), _randn(k, i, std=i**-0.5)
    dy = _randn(m, k)

    def standard(x, w1, w_down):
        pre = x @ w1.T
        return (F.silu(pre[:, 0::2]) * pre[:, 1::2]) @ w_down.T

    return _steps(K.swiglu, standard, (x, w1, w_down), dy)


def qkv_rope_case(m, k, hq, hkv, hd):
    import coda_agent.kernels as K

    n = (hq + 2 * hkv) * hd
    x, w = _randn(m, k), _randn(n, k, std=k**-0.5)
    positions = torch.arange(m, device="cuda") % 8192
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    dy = _randn(m, n)

    def standard(x, w):  # Meta's interleaved RoPE on Q and K heads, V passes through
        return rope_interleaved(x @ w.T, positions, inv_freq, hq, hkv, hd)

    def ops(x, w):
        return K.qkv_rope(x, w, positions, inv_freq, n_q_heads=hq, n_kv_heads=hkv, head_dim=hd)

    res = _steps(ops, standard, (x, w), dy)
    # the rotation passes alone, each compiled: the op's glue (R^T, float64 angles) and the
    # standard definition's rotation (fp32 angles; what its backward computes, by other kernels)
    from coda_agent.kernels._rope import rope_rotate

    n_rot = (hq + hkv) * hd
    glue = torch.compile(lambda d: rope_rotate(d, positions, inv_freq, n_rot, inverse=True), dynamic=False)
    std_rot = torch.compile(lambda d: rope_interleaved(d, positions, inv_freq, hq, hkv, hd), dynamic=False)
    res["R^T glue pass (compile)"] = _bench(lambda: glue(dy))
    res["standard rotation pass (compile)"] = _bench(lambda: std_rot(dy))
    return res


def linear_cross_entropy_case(m, k, v):
    import coda_agent.kernels as K

    h, w = _randn(m, k), _randn(v, k, std=k**-0.5)
    target = torch.randint(0, v, (m,), device="cuda")
    dloss = torch.rand(m, device="cuda")

    def standard(h, w, target):
        return F.cross_entropy((h @ w.T).float(), target, reduction="none")

    return _steps(K.linear_cross_entropy, standard, (h, w, target), dloss)


CASES = {
    "rmsnorm_linear llama3-8b gate/up (M=8192, D=4096, N=28672)": lambda: rmsnorm_linear_case(8192, 4096, 28672),
    "rmsnorm_linear llama3-8b qkv (M=8192, D=4096, N=6144)": lambda: rmsnorm_linear_case(8192, 4096, 6144),
    "swiglu llama3-8b (M=8192, K=4096, I=14336)": lambda: swiglu_case(8192, 4096, 14336),
    "rmsnorm_linear llama3-1b gate/up (M=8192, D=2048, N=16384)": lambda: rmsnorm_linear_case(8192, 2048, 16384),
    "qkv_rope llama3-8b (M=8192, K=4096, 32 q / 8 kv heads of 128)": lambda: qkv_rope_case(8192, 4096, 32, 8, 128),
    "linear_cross_entropy llama3-8b (M=8192, K=4096, V=128256)": lambda: linear_cross_entropy_case(8192, 4096, 128256),
    "qkv_rope llama3-1b (M=8192, K=2048, 32 q / 8 kv heads of 64)": lambda: qkv_rope_case(8192, 2048, 32, 8, 64),
    "swiglu llama3-1b (M=8192, K=2048, I=8192)": lambda: swiglu_case(8192, 2048, 8192),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="default: every case")
    ap.add_argument(
        "--cudagraphs",
        action="store_true",
        help='also time op and standard under torch.compile(mode="reduce-overhead")',
    )
    ap.add_argument(
        "--profile", type=int, default=0, metavar="N", help="also profile N steps of every variant: GPU time by kernel"
    )
    args = ap.parse_args(argv)
    global CUDAGRAPHS, PROFILE_STEPS
    CUDAGRAPHS, PROFILE_STEPS = args.cudagraphs, args.profile
    if not torch.cuda.is_available():
        raise SystemExit("op_training_probe: needs a CUDA (Hopper) device")
    env = env_line()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"env": env, "cases": {}}
    for name in args.case or list(CASES):
        try:
            results["cases"][name] = CASES[name]()
        except Exception as e:  # one failing case must not lose the others
            results["cases"][name] = {"failed": f"{type(e).__name__}: {e}"}
        print(
            name,
            json.dumps(
                {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in results["cases"][name].items()
                    if not k.startswith("profile:")
                }
            ),
            flush=True,
        )
        (args.out / "op_training.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

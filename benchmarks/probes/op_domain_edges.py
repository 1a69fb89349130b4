"""Numerics of the coda_agent.kernels ops at the edges of their domain (dev tool; H200 only).

Three probes; each runs on its own (an exception is recorded as that probe's ``error`` and
the others still run). Errors are ``max |x - ref32|`` against an fp32 computation of the
standard definition from the same inputs; the budget is ``2 * max |torch_bf16 - ref32| +
1e-6`` (the same standard definition run in bf16 PyTorch), as tests/kernels judge the ops.

1. ``deferred``: deferred_rmsnorm_swiglu, deferred_rmsnorm_swiglu_mlp (llama3-8b widths
   D = 4096, I = 14336) and deferred_rmsnorm_linear (as the QKV projection, N = 6144),
   forward + backward at M in {1, 2, 7, 333, 8192}: every output's and gradient's error /
   budget (one call each). At M = 1 and 2 one call is one or two rows: the budget is a
   sample of PyTorch's own rounding there, so these M are also judged pooled over
   ceil(32 / M) independent calls, and per single row (32 calls of M = 1) the share of
   rows whose drstd error exceeds twice PyTorch's is counted for the op, for a control
   (the same math in another valid bf16 PyTorch form: the row scale on the GEMM's output)
   and for the op's backward with dz = dy @ w kept in fp32 (``torch.mm(..., out_dtype=
   torch.float32)``; not what the op does: an option, timed at M = 8192 too).
   Verdict ``ok``: every M >= 7 call and every pooled M <= 2 set within budget, and the
   op's single-row share not above the control's + 0.1.
2. ``swiglu``: swiglu's kernels at gates -88.5, -90, 90, -87.0, -87.5 (preact built to hit
   them exactly; the other gates O(1)): the values at those gates from the kernels and from
   PyTorch (fp32), and ``coda_agent.verifier.stages.numerics.judge`` of postact (swiglu_fwd,
   gemm_rmsnorm_swiglu), dpreact and postact (swiglu_bwd); the swiglu op's output and
   gradients against the budget (judge shown too). Verdict ``ok`` (not a bug): the kernels'
   judges accept, the op is within budget, and the kernels' postact is 0 only below
   ``_swiglu.FLUSHED_GATE`` (-87.34), where PyTorch's is below 1.03e-36 * |up|.
3. ``residual_rmsnorm``: one row of x with an Inf, of residual with an -Inf or a NaN, or
   all zero (rows 0, 8, 130, 332 of M = 333; D = 4096), eps 1e-6 and 1e-5: per output and
   gradient the rows non-finite for the op and for PyTorch's standard computation in
   bf16, and the rows only the op has. Diagnostics localize a leak: the kernel op's
   (``gemm_residual_partial_rms_op``) rstd before the glue; the kernel's raw per-(row,
   N-tile) partial sums of squares ``ss`` (its epilogue called directly with ``ss``
   pre-filled with -1, a value it never writes: an entry still -1 was not written) against
   the partials computed in fp32 from the same inputs; and, when a leak shows, the same with
   the allocator filled with NaN first (stale memory), with quack's default config instead
   of the kernel's, and quack's own rms_partial_epi. Verdict ``ok``: no output has a
   non-finite row that PyTorch's has not.

Usage (device, after ``source .device-bundle/p2/install.sh && source benchmarks/device_env.sh``)::

    python benchmarks/probes/op_domain_edges.py --json $OUT/library_probe.json [--probe NAME ...] [--quick]

``--quick`` skips M = 8192 and the fp32-dz timing. Prints one table per probe and a verdict
line per probe (``ok`` / ``FAIL`` / ``error``); writes everything to the JSON file. Runs in
well under a minute on an H200 with quack's compile cache warm (a cold cache adds the
kernels' compiles). Raises SystemExit without CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

DEVICE = "cuda"
BF16, FP32 = torch.bfloat16, torch.float32
D, I_MLP, N_QKV = 4096, 14336, 6144  # llama3-8b: hidden, MLP width, (32 + 2 * 8) * 128
MS = (1, 2, 7, 333, 8192)
POOL_ROWS = 32


# --------------------------------------------------------------------------- shared


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _randn(*shape, seed: int, std: float = 1.0, dtype=BF16) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(seed), device=DEVICE) * std).to(dtype)


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _run(fn, args, diff, ups, cast=lambda a: a):
    """Outputs, then gradients w.r.t. args[i] for i in diff (upstream ``ups``), detached."""
    xs = [cast(a).detach().clone().requires_grad_() if i in diff else cast(a) for i, a in enumerate(args)]
    outs = _tuple(fn(*xs))
    grads = torch.autograd.grad(outs, [xs[i] for i in diff], [u.to(o.dtype) for u, o in zip(ups, outs, strict=False)])
    return [t.detach() for t in (*outs, *grads)]


def _f32(a):
    return a.float() if a.is_floating_point() else a


def _err(a, ref) -> float:
    return float((a.float() - ref).abs().max())


def _r(x, n=3):
    return round(x, n) if isinstance(x, float) and math.isfinite(x) else x


# --------------------------------------------------------------------------- 1. deferred


def std_linear(a, rstd, w):
    return (a.float() * rstd.float()[:, None]).to(a.dtype) @ w.T


def std_swiglu(a, rstd, w1):
    pre = std_linear(a, rstd, w1)
    return pre, F.silu(pre[:, 0::2]) * pre[:, 1::2]


def std_swiglu_mlp(a, rstd, w1, w_down):
    return std_swiglu(a, rstd, w1)[1] @ w_down.T


def alt_linear(a, rstd, w):
    """The control: the same math with the row scale on the GEMM's output (as the kernels)."""
    return ((a @ w.T).float() * rstd.float()[:, None]).to(a.dtype)


def alt_swiglu(a, rstd, w1):
    pre = alt_linear(a, rstd, w1)
    return pre, F.silu(pre[:, 0::2]) * pre[:, 1::2]


def alt_swiglu_mlp(a, rstd, w1, w_down):
    return alt_swiglu(a, rstd, w1)[1] @ w_down.T


def _mm_fp32(x, w):
    """x @ w with an fp32 result from the GEMM's accumulator (bf16 operands)."""
    if x.dtype == FP32:
        return x @ w
    return torch.mm(x, w, out_dtype=FP32)


def fp32dz_drstd(name, args, ups):
    """drstd of the op's backward with dz = dy @ w kept in fp32 (the op rounds dz to bf16):
    the same dpre as the op's backward (from the kernel's preact / swiglu_bwd's dpreact)."""
    import coda_agent.kernels as K

    a, rstd, w = args[:3]
    if name == "deferred_rmsnorm_linear":
        dy = ups[0]
    elif name == "deferred_rmsnorm_swiglu":
        preact, _ = K.deferred_rmsnorm_swiglu(a, rstd, w)
        p = preact.float()
        gate, up = p[:, 0::2], p[:, 1::2]
        sig = torch.sigmoid(gate)
        dpost = ups[1].float()
        dpre = torch.stack((dpost * up * sig * (1 + gate * (1 - sig)), dpost * F.silu(gate)), dim=-1).flatten(1)
        dy = (dpre + ups[0].float()).to(a.dtype)
    else:
        preact, _ = K.gemm_rmsnorm_swiglu_op(a, rstd, w)
        dy, _ = K.swiglu_bwd_op(ups[0].contiguous(), args[3], preact)
    return (_mm_fp32(dy, w) * a.float()).sum(dim=-1)


# name -> (op, standard, control, needs w_down, N of w, names)
def _deferred_cases():
    import coda_agent.kernels as K

    return {
        "deferred_rmsnorm_swiglu": (
            K.deferred_rmsnorm_swiglu,
            std_swiglu,
            alt_swiglu,
            False,
            2 * I_MLP,
            ("preact", "postact", "dnormed_w", "drstd", "dw1"),
        ),
        "deferred_rmsnorm_swiglu_mlp": (
            K.deferred_rmsnorm_swiglu_mlp,
            std_swiglu_mlp,
            alt_swiglu_mlp,
            True,
            2 * I_MLP,
            ("out", "dnormed_w", "drstd", "dw1", "dw_down"),
        ),
        "deferred_rmsnorm_linear": (
            K.deferred_rmsnorm_linear,
            std_linear,
            alt_linear,
            False,
            N_QKV,
            ("out", "da", "drstd", "dw"),
        ),
    }


def _deferred_args(M, N, mlp, seed, k=D):
    args = [
        _randn(M, k, seed=seed),
        (torch.rand(M, generator=_gen(seed + 1), device=DEVICE) * 1.5 + 0.5),
        _randn(N, k, seed=seed + 2, std=k**-0.5),
    ]
    if mlp:
        args.append(_randn(k, N // 2, seed=seed + 3, std=(N // 2) ** -0.5))
    return args


def _deferred_call(name, M, seed, with_extra=False):
    """One call: per tensor the errors of op / torch bf16 (/ control / fp32-dz drstd)."""
    op, std, alt, mlp, N, names = _deferred_cases()[name]
    args = _deferred_args(M, N, mlp, seed)
    diff = tuple(range(len(args)))
    outs = _tuple(op(*args))
    g = torch.Generator().manual_seed(seed + 4)
    ups = [torch.randn(o.shape, generator=g).to(device=o.device, dtype=o.dtype) for o in outs]
    ref = _run(std, args, diff, ups, _f32)
    got, low = _run(op, args, diff, ups), _run(std, args, diff, ups)
    res = {
        "names": names,
        "op": [_err(a, r) for a, r in zip(got, ref, strict=False)],
        "torch": [_err(a, r) for a, r in zip(low, ref, strict=False)],
    }
    if with_extra:
        i = names.index("drstd")
        res["control"] = [_err(a, r) for a, r in zip(_run(alt, args, diff, ups), ref, strict=False)]
        try:
            res["fp32dz_drstd"] = _err(fp32dz_drstd(name, args, ups), ref[i])
        except Exception as e:  # an option: its absence must not stop the probe
            res["fp32dz_drstd"] = f"{type(e).__name__}: {e}"
    return res


def _fp32dz_timing():
    """ms of the swiglu dgrad GEMM at M = 8192 (dy (M, 2I) @ w1 (2I, D)) with a bf16 and an
    fp32 result, and of the drstd row pass reading dz in bf16 / fp32 (eager)."""
    from triton.testing import do_bench

    dy, w1, a = _randn(8192, 2 * I_MLP, seed=70), _randn(2 * I_MLP, D, seed=71, std=D**-0.5), _randn(8192, D, seed=72)
    dz16, dz32 = dy @ w1, _mm_fp32(dy, w1)
    bench = lambda f: float(do_bench(f, warmup=10, rep=50, return_mode="median"))  # noqa: E731
    return {
        "gemm bf16 out ms": bench(lambda: dy @ w1),
        "gemm fp32 out ms": bench(lambda: _mm_fp32(dy, w1)),
        "drstd pass bf16 dz ms": bench(lambda: (dz16.float() * a.float()).sum(-1)),
        "drstd pass fp32 dz ms": bench(lambda: (dz32 * a.float()).sum(-1)),
    }


def probe_deferred(quick: bool) -> dict:
    out: dict = {"per_M": {}, "pooled": {}, "single_rows": {}}
    ok = True
    for name in _deferred_cases():
        for M in MS:
            if quick and M > 333:
                continue
            try:
                r = _deferred_call(name, M, seed=10 * M)
                ratios = {n: o / (2 * t + 1e-6) for n, o, t in zip(r["names"], r["op"], r["torch"], strict=False)}
                out["per_M"][f"{name}/M{M}"] = {
                    n: {"err": o, "budget": 2 * t + 1e-6, "ratio": ratios[n]}
                    for n, o, t in zip(r["names"], r["op"], r["torch"], strict=False)
                }
                if M >= 7 and max(ratios.values()) > 1:
                    ok = False
            except Exception as e:
                out["per_M"][f"{name}/M{M}"] = {"error": f"{type(e).__name__}: {e}"}
                ok = False
        for M in (1, 2):
            n_calls = -(-POOL_ROWS // M)
            try:
                calls = [_deferred_call(name, M, seed=1000 + 17 * c, with_extra=(M == 1)) for c in range(n_calls)]
            except Exception as e:
                out["pooled"][f"{name}/M{M}x{n_calls}"] = {"error": f"{type(e).__name__}: {e}"}
                ok = False
                continue
            names = calls[0]["names"]
            pooled = {
                n: {"err": max(c["op"][i] for c in calls), "budget": 2 * max(c["torch"][i] for c in calls) + 1e-6}
                for i, n in enumerate(names)
            }
            for v in pooled.values():
                v["ratio"] = v["err"] / v["budget"]
            out["pooled"][f"{name}/M{M}x{n_calls}"] = pooled
            if max(v["ratio"] for v in pooled.values()) > 1:
                ok = False
            if M == 1:
                i = names.index("drstd")
                budgets = [2 * c["torch"][i] for c in calls]

                def share(errs, budgets=budgets):
                    return sum(e > b for e, b in zip(errs, budgets, strict=False)) / len(errs)

                single = {"op": share([c["op"][i] for c in calls]), "control": share([c["control"][i] for c in calls])}
                fp32dz = [c["fp32dz_drstd"] for c in calls]
                single["op with fp32 dz"] = share(fp32dz) if all(isinstance(x, float) for x in fp32dz) else fp32dz[0]
                out["single_rows"][name] = single
                if single["op"] > single["control"] + 0.1:
                    ok = False
    if not quick:
        try:
            out["fp32dz_timing_M8192"] = _fp32dz_timing()
        except Exception as e:
            out["fp32dz_timing_M8192"] = {"error": f"{type(e).__name__}: {e}"}
    out["verdict"] = "ok" if ok else "FAIL"
    return out


def print_deferred(res: dict) -> None:
    print("\n[1] deferred-rstd ops: error / budget (budget = 2 x bf16 PyTorch error + 1e-6)")
    for key, row in {**res.get("per_M", {}), **{f"{k} pooled": v for k, v in res.get("pooled", {}).items()}}.items():
        if "error" in row:
            print(f"  {key:44s} error: {row['error']}")
            continue
        cells = "  ".join(f"{n} {v['ratio']:.2f}" for n, v in row.items())
        note = "  (single call of <= 2 rows: not a criterion)" if key.endswith(("/M1", "/M2")) else ""
        print(f"  {key:44s} {cells}{note}")
    for name, s in res.get("single_rows", {}).items():
        print(
            f"  {name}: share of single rows with drstd err > 2x PyTorch's: "
            + ", ".join(f"{k} {_r(v, 2)}" for k, v in s.items())
        )
    if "fp32dz_timing_M8192" in res:
        print(
            "  fp32-dz option at M = 8192 (eager): "
            + json.dumps({k: _r(v, 4) for k, v in res["fp32dz_timing_M8192"].items()})
        )


# --------------------------------------------------------------------------- 2. swiglu fast sigmoid

GATES = (-88.5, -90.0, 90.0, -87.0, -87.5)  # bf16-exact; -87.5 < FLUSHED_GATE < -87.0


def _gate_inputs(M=64, K=None, I=256, seed=20):
    """x (M, K) with column 0 = 1; w1 rows 2j (j < len(GATES)) = GATES[j] * e_0: gate j of
    preact is exactly GATES[j] in every row; the other rows random (O(1) preact)."""
    K = K or D
    x = torch.randn(M, K, generator=_gen(seed), device=DEVICE)
    x[:, 0] = 1.0
    w1 = torch.randn(2 * I, K, generator=_gen(seed + 1), device=DEVICE) * K**-0.5
    for j, v in enumerate(GATES):
        w1[2 * j] = 0.0
        w1[2 * j, 0] = v
    w_down = torch.randn(K, I, generator=_gen(seed + 2), device=DEVICE) * I**-0.5
    return x.to(BF16), w1.to(BF16), w_down.to(BF16)


def _judge(out, ref32, low) -> dict:
    from coda_agent.verifier.spec import ToleranceSpec
    from coda_agent.verifier.stages.numerics import judge

    v = judge(out, ref32, low, ToleranceSpec(), "bfloat16", "bfloat16")
    return {"ok": bool(v["ok"]), "failed": v.get("failed", []), "max_err": v.get("max_err")}


def std_swiglu_op(x, w1, w_down):
    pre = x @ w1.T
    return (F.silu(pre[:, 0::2]) * pre[:, 1::2]) @ w_down.T


def _swiglu_std(dout, w_down, preact):
    pre = preact.detach().requires_grad_()
    post = F.silu(pre[:, 0::2]) * pre[:, 1::2]
    (dpre,) = torch.autograd.grad(post, pre, (dout @ w_down).to(post.dtype))
    return dpre, post.detach()


def probe_swiglu() -> dict:
    import coda_agent.kernels as K
    from coda_agent.kernels._swiglu import FLUSHED_GATE

    out: dict = {"gates": list(GATES), "kernels": {}, "op": {}}
    ok = True
    x, w1, w_down = _gate_inputs()
    gates_t = torch.tensor(GATES, device=DEVICE)
    ones = torch.ones(x.shape[0], device=DEVICE)
    dout = _randn(x.shape[0], x.shape[1], seed=23)
    fwd = {}
    pre32, pre_low = x.float() @ w1.float().T, x @ w1.T  # fp32 reference, PyTorch's bf16
    ref32 = F.silu(pre32[:, 0::2]) * pre32[:, 1::2]
    low = F.silu(pre_low[:, 0::2]) * pre_low[:, 1::2]
    for kernel, call in (
        ("swiglu_fwd", lambda: K.swiglu_fwd_op(x, w1)),
        ("gemm_rmsnorm_swiglu", lambda: K.gemm_rmsnorm_swiglu_op(x, ones, w1)),
    ):
        try:
            preact, postact = call()
            fwd[kernel] = preact
            gate = preact[:, 0::2]
            j = len(GATES)
            rec = {
                "preact gates exact": bool((gate[:, :j] == gates_t.to(BF16)).all()),
                "postact at gates (row 0)": [float(v) for v in postact[0, :j].float()],
                "torch fp32 at gates (row 0)": [float(v) for v in ref32[0, :j]],
                "judge postact": _judge(postact, ref32, low),
            }
            flushed = gate.float() < FLUSHED_GATE
            rec["postact 0 where gate < FLUSHED_GATE"] = bool((postact[flushed] == 0).all())
            rec["postact nonzero elsewhere"] = bool((postact[~flushed & (ref32.abs() > 1e-30)] != 0).all())
            rec["max |torch| where flushed"] = float(ref32[flushed].abs().max()) if flushed.any() else 0.0
            ok = ok and rec["judge postact"]["ok"] and rec["preact gates exact"] and rec["postact nonzero elsewhere"]
            out["kernels"][kernel] = rec
        except Exception as e:
            out["kernels"][kernel] = {"error": f"{type(e).__name__}: {e}"}
            ok = False
    try:
        preact = fwd.get("swiglu_fwd")
        if preact is None:
            raise RuntimeError("no preact from swiglu_fwd")
        dpreact, postact = K.swiglu_bwd_op(dout, w_down, preact)
        r32, low = _swiglu_std(dout.float(), w_down.float(), preact.float()), _swiglu_std(dout, w_down, preact)
        j = len(GATES)
        rec = {
            "dgate at gates (row 0)": [float(v) for v in dpreact[0, 0 : 2 * j : 2].float()],
            "torch fp32 dgate at gates (row 0)": [float(v) for v in r32[0][0, 0 : 2 * j : 2]],
            "dup at gates (row 0)": [float(v) for v in dpreact[0, 1 : 2 * j : 2].float()],
            "torch fp32 dup at gates (row 0)": [float(v) for v in r32[0][0, 1 : 2 * j : 2]],
            "judge dpreact": _judge(dpreact, r32[0], low[0]),
            "judge postact": _judge(postact, r32[1], low[1]),
        }
        ok = ok and rec["judge dpreact"]["ok"] and rec["judge postact"]["ok"]
        out["kernels"]["swiglu_bwd"] = rec
    except Exception as e:
        out["kernels"]["swiglu_bwd"] = {"error": f"{type(e).__name__}: {e}"}
        ok = False
    try:  # the op: forward + backward
        args, diff = [x, w1, w_down], (0, 1, 2)
        g = torch.Generator().manual_seed(24)
        ups = [torch.randn(x.shape, generator=g).to(device=x.device, dtype=BF16)]
        got, ref = _run(K.swiglu, args, diff, ups), _run(std_swiglu_op, args, diff, ups, _f32)
        low = _run(std_swiglu_op, args, diff, ups)
        for n, a, r, lo in zip(("out", "dx", "dw1", "dw_down"), got, ref, low, strict=False):
            # the verdict: the max-error budget; judge is shown (its per-element rule, made
            # for a kernel's outputs, also compares single elements of GEMM-accumulated
            # weight gradients against PyTorch's own rounding of them)
            out["op"][n] = {"err": _err(a, r), "budget": 2 * _err(lo, r) + 1e-6, "judge": _judge(a, r, lo)}
            ok = ok and out["op"][n]["err"] <= out["op"][n]["budget"]
    except Exception as e:
        out["op"] = {"error": f"{type(e).__name__}: {e}"}
        ok = False
    out["verdict"] = "ok" if ok else "FAIL"
    return out


def print_swiglu(res: dict) -> None:
    print(f"\n[2] swiglu fast sigmoid at gates {res.get('gates')}")
    for k, rec in res.get("kernels", {}).items():
        if "error" in rec:
            print(f"  {k:20s} error: {rec['error']}")
            continue
        vals = {n: [f"{v:.3g}" for v in vs] for n, vs in rec.items() if isinstance(vs, list)}
        judges = {n: ("ok" if v["ok"] else f"FAIL {v['failed']}") for n, v in rec.items() if n.startswith("judge")}
        print(f"  {k:20s} {json.dumps(vals)}")
        flags = {n: v for n, v in rec.items() if isinstance(v, (bool, float)) and not n.startswith("judge")}
        print(f"  {'':20s} {json.dumps(judges)} {json.dumps(flags)}")
    op = res.get("op", {})
    if "error" in op:
        print(f"  swiglu op            error: {op['error']}")
    else:
        print(
            "  swiglu op            "
            + ", ".join(
                f"{n} err {v['err']:.3g} / budget {v['budget']:.3g} (judge {'ok' if v['judge']['ok'] else v['judge']['failed']})"
                for n, v in op.items()
            )
        )


# --------------------------------------------------------------------------- 3. residual_rmsnorm rows

RES_M, RES_K, RES_N = 333, D, D
RES_ROWS = (0, 8, 130, 332)
RES_SCENARIOS = ("x_inf", "residual_inf", "residual_nan", "zero")
RES_NAMES = ("resid_out", "normed_w", "rstd", "dx", "dw_o", "dresidual", "dgamma")


def std_residual_rmsnorm(x, w_o, residual, gamma, eps=1e-6):
    y = x @ w_o.T + residual
    return y, y * gamma, torch.rsqrt(y.float().pow(2).mean(dim=-1) + eps)


def _residual_inputs(scenario, row, seed=30):
    x = _randn(RES_M, RES_K, seed=seed)
    w_o = _randn(RES_N, RES_K, seed=seed + 1, std=RES_K**-0.5)
    residual = _randn(RES_M, RES_N, seed=seed + 2)
    gamma = (torch.rand(RES_N, generator=_gen(seed + 3), device=DEVICE) + 0.5).to(BF16)
    if scenario == "x_inf":
        x[row, 5] = float("inf")
    elif scenario == "residual_inf":
        residual[row, 7] = float("-inf")
    elif scenario == "residual_nan":
        residual[row, 7] = float("nan")
    elif scenario == "zero":
        x[row] = 0
        residual[row] = 0
    return [x, w_o, residual, gamma]


def _bad_rows(t: torch.Tensor) -> list[int]:
    """Rows (first dim) holding a non-finite value; for a 1-D tensor its non-finite indices."""
    nf = ~t.isfinite()
    return nf.nonzero().flatten().tolist() if t.dim() == 1 else nf.any(dim=1).nonzero().flatten().tolist()


def _rows_report(got, want, names):
    rep = {}
    for n, a, b in zip(names, got, want, strict=False):
        ra, rb = _bad_rows(a), _bad_rows(b)
        rep[n] = {
            "op_rows": ra[:8],
            "torch_rows": rb[:8],
            "extra_rows": sorted(set(ra) - set(rb))[:8],
            "missing_rows": sorted(set(rb) - set(ra))[:8],
            "elements_differ": int((a.isfinite() != b.isfinite()).sum()),
        }
    return rep


def _raw_partials(args, config="kernel", prefill=-1.0):
    """The kernel's epilogue called directly: (ss (M, n_tiles) as written, tile_n), ss
    pre-filled with ``prefill``. ``config``: "kernel" (the kernel's CFG) or "default" (quack's)."""
    import coda_agent.kernels as K

    mod = K.load("gemm_residual_partial_rms")
    x, w_o, residual, gamma = args
    cfg = mod.CFG if config == "kernel" else None
    n = w_o.shape[0]
    if cfg is None:
        res = mod.resid_partial_rms_epi(x, w_o.T, residual, tuned=False, gamma=gamma.view(1, -1), inv_n=1.0 / n)
        return res.get("ss"), None
    n_tiles = -(-n // cfg.tile_n)
    ss = torch.full((x.shape[0], n_tiles), prefill, dtype=FP32, device=x.device)
    mod.resid_partial_rms_epi(
        x, w_o.T, residual, tuned=False, config=cfg, gamma=gamma.view(1, -1), inv_n=1.0 / n, ss=ss
    )
    torch.cuda.synchronize()
    return ss, cfg.tile_n


def _partials_ref(args, tile_n):
    x, w_o, residual, _ = args
    y = x.float() @ w_o.float().T + residual.float()
    n = y.shape[1]
    pad = -(-n // tile_n) * tile_n - n
    yp = F.pad(y, (0, pad))
    return (yp * yp / n).unflatten(1, (-1, tile_n)).sum(-1)


def _diagnose(args, rep_row):
    """Where a leak first shows: kernel rstd, raw partials (written? finite?), with a
    NaN-filled allocator, other configs."""
    import coda_agent.kernels as K

    d: dict = {}
    _, _, rstd_k = K.gemm_residual_partial_rms_op(*args)
    d["kernel rstd bad rows"] = _bad_rows(rstd_k)[:8]
    try:
        ss, tile_n = _raw_partials(args, "kernel", prefill=-1.0)
        ref = _partials_ref(args, tile_n)
        d["raw ss unwritten (row, tile)"] = (ss == -1.0).nonzero().tolist()[:8]  # a sum of squares is >= 0
        d["raw ss bad rows"] = _bad_rows(ss)[:8]
        d["fp32 partials bad rows"] = _bad_rows(ref)[:8]
        bad = ~ss.isfinite() & ref.isfinite()
        d["raw ss non-finite where fp32 partials finite (row, tile)"] = bad.nonzero().tolist()[:8]
        fin = ss.isfinite() & ref.isfinite()
        d["raw ss max rel err (finite)"] = (
            float(((ss - ref).abs() / ref.abs().clamp_min(1e-30))[fin].max()) if fin.any() else 0.0
        )
    except Exception as e:
        d["raw ss error"] = f"{type(e).__name__}: {e}"
    if any(v["extra_rows"] for v in rep_row.values()):
        try:  # stale memory: the allocator's free blocks (small and large pools) NaN-filled first
            fillers = [torch.full((1 << 16,), float("nan"), device=DEVICE) for _ in range(256)]
            fillers.append(torch.full((1 << 28,), float("nan"), device=DEVICE))
            del fillers
            _, _, rstd_p = K.gemm_residual_partial_rms_op(*args)
            d["kernel rstd bad rows, allocator NaN-filled"] = _bad_rows(rstd_p)[:8]
        except Exception as e:
            d["poisoned error"] = f"{type(e).__name__}: {e}"
        try:
            ss_def, _ = _raw_partials(args, "default")
            d["quack default config: ss bad rows"] = _bad_rows(ss_def)[:8] if ss_def is not None else "no ss returned"
        except Exception as e:
            d["quack default config error"] = f"{type(e).__name__}: {e}"
        try:
            from quack.epilogue.library import rms_partial_epi

            x, w_o, residual, gamma = args
            lib = rms_partial_epi(x, w_o.T, residual, tuned=False, weight=gamma)
            d["quack rms_partial_epi: sqsum bad rows"] = _bad_rows(lib["sqsum"])[:8]
        except Exception as e:
            d["quack rms_partial_epi error"] = f"{type(e).__name__}: {e}"
    return d


def probe_residual() -> dict:
    import coda_agent.kernels as K

    out: dict = {"M": RES_M, "K": RES_K, "N": RES_N, "cases": {}}
    ok = True
    for scenario in RES_SCENARIOS:
        for row in RES_ROWS:
            for eps in (1e-6, 1e-5):
                key = f"{scenario}/row{row}/eps{eps:g}"
                try:
                    args = _residual_inputs(scenario, row)
                    g = torch.Generator().manual_seed(31)
                    shapes = [(RES_M, RES_N), (RES_M, RES_N), (RES_M,)]
                    ups = [torch.randn(s, generator=g).to(DEVICE) for s in shapes]
                    op = lambda *a, eps=eps: K.residual_rmsnorm(*a, eps=eps)  # noqa: E731
                    std = lambda *a, eps=eps: std_residual_rmsnorm(*a, eps=eps)  # noqa: E731
                    got, want = _run(op, args, range(4), ups), _run(std, args, range(4), ups)
                    rep = _rows_report(got, want, RES_NAMES)
                    leak = any(v["extra_rows"] for v in rep.values())
                    rec = {"leak": leak, "rows": rep}
                    if leak or eps == 1e-6:
                        rec["diagnostics"] = _diagnose(args, rep)
                    ok = ok and not leak
                    out["cases"][key] = rec
                except Exception as e:
                    out["cases"][key] = {"error": f"{type(e).__name__}: {e}"}
                    ok = False
    out["verdict"] = "ok" if ok else "FAIL"
    return out


def print_residual(res: dict) -> None:
    print(f"\n[3] residual_rmsnorm, M = {res.get('M')}: rows non-finite only in the op (extra), per output")
    for key, rec in res.get("cases", {}).items():
        if "error" in rec:
            print(f"  {key:34s} error: {rec['error']}")
            continue
        extra = {n: v["extra_rows"] for n, v in rec["rows"].items() if v["extra_rows"]}
        tr = rec["rows"]["rstd"]["torch_rows"]
        print(f"  {key:34s} {'LEAK ' + json.dumps(extra) if rec['leak'] else 'ok'}  (torch rstd bad rows {tr})")
        diag = rec.get("diagnostics", {})
        if rec["leak"] or any(
            diag.get(k)
            for k in ("raw ss unwritten (row, tile)", "raw ss non-finite where fp32 partials finite (row, tile)")
        ):
            print(f"  {'':34s} diagnostics {json.dumps(diag)}")


# --------------------------------------------------------------------------- main

PROBES = {
    "deferred": (lambda quick: probe_deferred(quick), print_deferred),
    "swiglu": (lambda quick: probe_swiglu(), print_swiglu),
    "residual_rmsnorm": (lambda quick: probe_residual(), print_residual),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the results")
    ap.add_argument("--probe", action="append", choices=sorted(PROBES), help="default: all three")
    ap.add_argument("--quick", action="store_true", help="skip M = 8192 and the fp32-dz timing")
    args = ap.parse_args(argv)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("library_probe: needs a CUDA (Hopper) device")
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references are fp32 GEMMs
    results: dict = {}
    try:
        import importlib.metadata as md

        results["env"] = (
            (f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; quack-kernels {md.version('quack-kernels')}")
            if DEVICE == "cuda"
            else DEVICE
        )
    except Exception as e:
        results["env"] = f"{type(e).__name__}: {e}"
    t0 = time.perf_counter()
    for name in args.probe or list(PROBES):
        run, show = PROBES[name]
        t = time.perf_counter()
        try:
            results[name] = run(args.quick)
        except Exception as e:  # one failing probe must not lose the others
            results[name] = {
                "verdict": "error",
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=6),
            }
        results[name]["seconds"] = round(time.perf_counter() - t, 1)
        try:
            show(results[name])
        except Exception as e:
            print(f"  (printing {name} failed: {type(e).__name__}: {e})")
        if "error" in results[name] and results[name].get("verdict") == "error":
            print(f"  {name}: error {results[name]['error']}")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
    print(
        f"\nverdicts ({time.perf_counter() - t0:.0f} s): "
        + ", ".join(f"{n} {results[n].get('verdict')} ({results[n].get('seconds')} s)" for n in args.probe or PROBES)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

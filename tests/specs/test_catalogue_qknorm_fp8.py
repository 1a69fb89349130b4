"""The specs of ops beyond the CODA catalogue: gemm_qknorm_rope, gemm_qknorm_rope_bwd,
gemm_fp8_quant.

On the CPU: they load with what they declare (float constants, reference-only inputs,
per-input draws, fp8 and partial-shape outputs); the derived inputs are what their
descriptions say; gemm_qknorm_rope's reference is transformers' own Qwen3 attention
(Qwen3RMSNorm, rotate_half RoPE) after the row permutation apply_coda uses, and agrees with
an independent float64 computation (complex rotation); the backward's reference is the
autograd of the forward, equal to the closed form its spec states (with the emitted
correction) and to finite differences; the forward's qkv_pre is p pair-split (even columns,
then odd ones: quack's acc_pair mode stores only D full width) and the training op's
``interleave_pairs`` restores the p the backward reads; gemm_fp8_quant's reference and
baseline are DeepGEMM's per_token_cast_to_fp8 recipe.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from coda_agent.kernels import interleave_pairs
from coda_agent.verifier.gpu.inputs import entry_inputs, make_inputs, upcast
from coda_agent.verifier.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
F64 = torch.float64


def _load(name):
    loaded = load_spec(ROOT / "kernel_specs" / name)
    return loaded, loaded.load_reference()


def _f64(inputs):
    return {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}


def _case(loaded, i=1, seed=0, draw="spec"):
    dims = loaded.spec.shapes.correctness[i].dims
    return dims, make_inputs(loaded, dims, seed, device="cpu", draw=draw), loaded.spec.constants_of(dims)


# --------------------------------------------------------------------------- declarations


def test_the_specs_declare_what_the_ops_are():
    fwd, bwd, fp8 = (_load(n)[0].spec for n in ("gemm_qknorm_rope", "gemm_qknorm_rope_bwd", "gemm_fp8_quant"))
    assert fwd.entry.float_constants == {"eps": 1e-6} and fp8.entry.float_constants == {"eps": 1e-4}
    assert [t.name for t in fwd.reference.inputs] == ["y", "gamma"]
    assert fwd.entry.keyword_names == ["HQ", "HKV", "eps"]
    assert [o.name for o in fp8.fp8_outputs] == ["y_fp8"] and fp8.fp8_outputs[0].scale == "y_scale"
    outs = {o.name: o for o in fwd.entry.outputs}
    assert outs["rstd_heads"].partial and not outs["qkv"].partial
    assert {t.name: t.draws for t in fwd.all_inputs if t.draws is not None} == {
        "gamma": ["outliers"],
        "q_norm_w": ["outliers"],
        "k_norm_w": ["outliers"],
    }
    assert [t.name for t in bwd.entry.inputs if t.partial] == ["rstd_heads", "corr"]
    # Qwen3-1.7B / Qwen3-8B QKV widths; Llama-3-8B widths for the fp8 projection
    assert {(c.dims["K"], (c.dims["HQ"] + 2 * c.dims["HKV"]) * 128) for c in fwd.shapes.benchmark} == {
        (2048, 4096),
        (4096, 6144),
    }
    assert {(c.dims["N"], c.dims["K"]) for c in fp8.shapes.benchmark} == {(4096, 4096), (14336, 4096), (4096, 14336)}


def test_the_entry_never_receives_the_reference_only_inputs():
    loaded, ref = _load("gemm_qknorm_rope")
    dims, inputs, consts = _case(loaded)
    assert list(entry_inputs(loaded, inputs)) == [t.name for t in loaded.spec.entry.inputs]
    y, gamma = inputs["y"].float(), inputs["gamma"].float()
    # the derived deferred input norm: a = y * gamma (bf16), rstd = y's own row scale
    assert torch.equal(inputs["a"], (y * gamma).bfloat16())
    assert torch.allclose(inputs["rstd"], torch.rsqrt(y.pow(2).mean(-1) + consts["eps"]), rtol=1e-6)
    # the outlier draw changes gamma (reference-only) and the norm weights, and a follows
    _, varied, _ = _case(loaded, draw="outliers")
    assert not torch.equal(varied["gamma"], inputs["gamma"]) and not torch.equal(varied["a"], inputs["a"])
    # a weight is drawn only as its draws say: the heavy-tailed draw leaves it as declared
    _, heavy, _ = _case(loaded, draw="heavy")
    assert torch.equal(heavy["q_norm_w"], inputs["q_norm_w"]) and not torch.equal(heavy["y"], inputs["y"])


# --------------------------------------------------------------------------- gemm_qknorm_rope


def _hf_qwen3(h, w_qkv, q_norm_w, k_norm_w, positions, inv_freq, hq, hkv, eps):
    """transformers' Qwen3 attention input path on h: q/k/v projections, Qwen3RMSNorm per
    head, HF's rotary embedding (rotate_half), all in float64."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    hd = 2 * inv_freq.shape[0]
    m = h.shape[0]
    qkv = h @ w_qkv.T
    q = qkv[:, : hq * hd].reshape(1, m, hq, hd)
    k = qkv[:, hq * hd : (hq + hkv) * hd].reshape(1, m, hkv, hd)
    qn, kn = Qwen3RMSNorm(hd, eps).double(), Qwen3RMSNorm(hd, eps).double()
    with torch.no_grad():
        qn.weight.copy_(q_norm_w)
        kn.weight.copy_(k_norm_w)
        freqs = positions.double()[:, None] * inv_freq.double()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        q, k = apply_rotary_pos_emb(qn(q).transpose(1, 2), kn(k).transpose(1, 2), emb.cos(), emb.sin())
    return q.transpose(1, 2).reshape(m, -1), k.transpose(1, 2).reshape(m, -1), qkv[:, (hq + hkv) * hd :]


@pytest.mark.parametrize("case", [0, 1, 2])
def test_qknorm_rope_is_hf_qwen3_after_the_row_permutation(case):
    """The spec's interleaved-pair op on W_qkv and norm weights permuted per head equals HF's
    rotate_half Qwen3 on the unpermuted ones, up to the same permutation of each head's
    columns (which attention's q . k does not see)."""
    pytest.importorskip("transformers")
    from coda_agent.kernels.hf import rope_row_permutation

    loaded, ref = _load("gemm_qknorm_rope")
    dims, inputs, consts = _case(loaded, case)
    hq, hkv, hd, eps = dims["HQ"], dims["HKV"], dims["HD"], consts["eps"]
    x = _f64(inputs)
    perm = rope_row_permutation(hd)
    rows = torch.cat([t * hd + perm for t in range(hq + hkv)] + [torch.arange((hq + hkv) * hd, (hq + 2 * hkv) * hd)])
    ours = ref.reference(
        **{**x, "w_qkv": x["w_qkv"][rows], "q_norm_w": x["q_norm_w"][perm], "k_norm_w": x["k_norm_w"][perm]},
        **consts,
    )["qkv"]
    h = x["a"] * x["rstd"][:, None]
    q, k, v = _hf_qwen3(h, x["w_qkv"], x["q_norm_w"], x["k_norm_w"], x["positions"], x["inv_freq"], hq, hkv, eps)
    hf = torch.cat((q, k, v), dim=1)[:, rows]  # HF's columns in the kernel's (permuted) order
    # Qwen3RMSNorm normalizes in fp32 whatever its input: agreement to fp32 rounding
    assert torch.allclose(ours, hf, rtol=1e-5, atol=1e-5)
    assert ours.abs().max() > 1 and (ours - h @ x["w_qkv"][rows].T).abs().max() > 0.5  # far from the identity


def test_qknorm_rope_reference_against_independent_float64_math():
    loaded, ref = _load("gemm_qknorm_rope")
    dims, inputs, consts = _case(loaded, 2)
    hq, hkv, hd, eps = dims["HQ"], dims["HKV"], dims["HD"], consts["eps"]
    x = _f64(inputs)
    out = ref.reference(**x, **consts)
    p = (x["a"] * x["rstd"][:, None]) @ x["w_qkv"].T
    heads = p.unflatten(1, (-1, hd))
    r = 1 / torch.sqrt(heads.pow(2).mean(-1) + eps)
    w = torch.stack([x["q_norm_w"]] * hq + [x["k_norm_w"]] * hkv)
    z = heads[:, : hq + hkv] * r[:, : hq + hkv, None] * w
    theta = x["positions"].double()[:, None] * x["inv_freq"][None, :]
    rot = torch.view_as_real(
        torch.view_as_complex(z.unflatten(-1, (-1, 2)).contiguous())
        * torch.polar(torch.ones_like(theta), theta)[:, None, :]
    )
    want = torch.cat((rot.flatten(1), p[:, (hq + hkv) * hd :]), dim=1)
    assert torch.allclose(out["qkv"], want, rtol=1e-10, atol=1e-10)
    assert torch.allclose(out["qkv_pre"], torch.cat((p[:, 0::2], p[:, 1::2]), dim=1), rtol=1e-12, atol=1e-12)
    assert torch.allclose(out["rstd_heads"].double(), r, rtol=1e-6)
    # value heads pass through
    assert torch.equal(out["qkv"][:, (hq + hkv) * hd :], interleave_pairs(out["qkv_pre"])[:, (hq + hkv) * hd :])
    # bf16: the reference's own rounding stays at bf16 level
    low = ref.reference(**inputs, **consts)
    rel = (low["qkv"].double() - out["qkv"]).abs().max() / out["qkv"].abs().max()
    assert 0 < rel < 2e-2


def test_qknorm_rope_qkv_pre_is_pair_split():
    """qkv_pre holds p's even columns in [0, N/2) and its odd columns in [N/2, N), over the
    whole projection width (two half-width acc_pair outputs into one buffer); the baseline
    stores the same layout, and interleave_pairs of it is p, the backward's input."""
    loaded, ref = _load("gemm_qknorm_rope")
    dims, inputs, consts = _case(loaded, 0)
    x = _f64(inputs)
    n = (dims["HQ"] + 2 * dims["HKV"]) * dims["HD"]
    p = (x["a"] * x["rstd"][:, None]) @ x["w_qkv"].T
    for fn in (ref.reference, ref.baseline):
        pre = fn(**x, **consts)["qkv_pre"]
        assert pre.shape == (dims["M"], n), fn.__name__
        assert torch.allclose(pre[:, : n // 2], p[:, 0::2], rtol=1e-12, atol=1e-12), fn.__name__
        assert torch.allclose(pre[:, n // 2 :], p[:, 1::2], rtol=1e-12, atol=1e-12), fn.__name__
        assert torch.allclose(interleave_pairs(pre), p, rtol=1e-12, atol=1e-12), fn.__name__
    # the layouts differ (the check above is not vacuous)
    assert (ref.reference(**x, **consts)["qkv_pre"] - p).abs().max() > 0.1


def test_qknorm_rope_baseline_agrees_with_the_reference():
    loaded, ref = _load("gemm_qknorm_rope")
    dims, inputs, consts = _case(loaded, 0)
    x32 = upcast(inputs)
    got, want = ref.baseline(**x32, **consts), ref.reference(**x32, **consts)
    for name in want:
        assert torch.allclose(got[name].float(), want[name].float(), rtol=1e-4, atol=1e-4), name


# --------------------------------------------------------------------------- gemm_qknorm_rope_bwd


def test_backward_reference_is_the_closed_form_with_the_emitted_correction():
    """autograd of the forward == r * (v * R^T dqkv - n * corr), corr being (1/HD) sum dqkv * qkv
    (the rotation's orthogonality), and the weight gradients are the row and head sums."""
    loaded, ref = _load("gemm_qknorm_rope_bwd")
    for case in range(3):
        dims, inputs, consts = _case(loaded, case)
        x = _f64(inputs)
        auto = ref.reference(**x, **consts)
        closed = ref.baseline(**x, **consts)
        for name in auto:
            scale = auto[name].abs().max()
            assert scale > 0.1, name
            assert (auto[name].double() - closed[name].double()).abs().max() <= 1e-5 * scale, (case, name)


def test_backward_reference_matches_finite_differences():
    loaded, ref = _load("gemm_qknorm_rope_bwd")
    dims = {"M": 3, "K": 8, "HQ": 1, "HKV": 1, "HD": 128, "S": 4096}
    inputs = _f64(make_inputs(loaded, dims, 5, device="cpu"))
    consts = loaded.spec.constants_of(dims)
    out = ref.reference(**inputs, **consts)
    upstream = inputs["g"] @ inputs["w"].T

    def loss(p, qw):
        y = ref.qknorm_rope(p, inputs["positions"], inputs["inv_freq"], qw, inputs["k_norm_w"], 1, 1)
        return float((y * upstream).sum())

    p, qw = inputs["qkv_pre"], inputs["q_norm_w"]
    eps = 1e-6
    for idx in [(0, 3), (2, 130), (1, 300)]:  # a query, a key and a value column
        d = torch.zeros_like(p)
        d[idx] = eps
        fd = (loss(p + d, qw) - loss(p - d, qw)) / (2 * eps)
        assert fd == pytest.approx(float(out["dqkv_pre"][idx]), rel=1e-5, abs=1e-7)
    e = torch.zeros_like(qw)
    e[7] = eps
    fd = (loss(p, qw + e) - loss(p, qw - e)) / (2 * eps)
    assert fd == pytest.approx(float(out["dq_norm_w"][7]), rel=1e-5)


def test_backward_derived_inputs_are_the_forwards():
    loaded, ref = _load("gemm_qknorm_rope_bwd")
    fwd, fwd_ref = _load("gemm_qknorm_rope")
    dims, inputs, consts = _case(loaded, 0)
    x = _f64(inputs)
    hd = dims["HD"]
    assert torch.allclose(x["rstd_heads"], fwd_ref.head_rstd(x["qkv_pre"], hd, 1e-6).double(), rtol=1e-6)
    # the backward's copy of the forward is the forward spec's function
    qkv = ref.qknorm_rope(x["qkv_pre"], x["positions"], x["inv_freq"], x["q_norm_w"], x["k_norm_w"], **consts)
    want = fwd_ref.qknorm_rope(
        x["qkv_pre"], x["positions"], x["inv_freq"], x["q_norm_w"], x["k_norm_w"], consts["HQ"], consts["HKV"], 1e-6
    )
    assert torch.equal(qkv, want)
    corr = ((x["g"] @ x["w"].T) * qkv).unflatten(1, (-1, hd)).mean(-1)
    assert torch.allclose(x["corr"], corr, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- gemm_fp8_quant


def test_fp8_reference_is_the_deepgemm_recipe():
    loaded, ref = _load("gemm_fp8_quant")
    dims, inputs, consts = _case(loaded, 1)
    x64 = _f64(inputs)
    out = ref.reference(**x64, **consts)
    y = x64["x"] @ x64["w"].T
    assert torch.allclose(out["y_fp8"], y, rtol=1e-12, atol=1e-12)  # the real value, unrounded
    m, n = y.shape
    amax = y.abs().reshape(m, n // 128, 128).amax(-1)
    assert torch.allclose(out["y_scale"], amax.clamp_min(consts["eps"]) / 448, rtol=1e-12)
    # the baseline (bf16 GEMM, per_token_cast_to_fp8): dequantized within an e4m3 step of y
    base = ref.baseline(**inputs, **consts)
    assert base["y_fp8"].dtype == torch.float8_e4m3fn
    deq = base["y_fp8"].double() * base["y_scale"].double().repeat_interleave(128, dim=1)
    assert (deq - y).abs().max() <= 32 * base["y_scale"].double().max() / 2 * 1.05
    # the block maxima land on +-448
    blocks = base["y_fp8"].float().abs().reshape(m, n // 128, 128).amax(-1)
    assert float(blocks.min()) == 448.0


def test_fp8_scale_of_a_zero_row_is_the_eps_floor():
    loaded, ref = _load("gemm_fp8_quant")
    x = torch.zeros(2, 64, dtype=F64)
    x[1] = 1.0
    w = torch.ones(256, 64, dtype=F64)
    out = ref.reference(x=x, w=w, eps=1e-4)
    assert out["y_scale"][0].tolist() == [1e-4 / 448] * 2
    assert torch.equal(out["y_fp8"][0], torch.zeros(256, dtype=F64))
    assert math.isclose(float(out["y_scale"][1, 0]), 64 / 448)

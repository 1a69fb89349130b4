"""A whole Llama-3 decoder layer built from the ops (benchmarks/llama_layer.py) against the
standard layer: the ops' wiring as a user composes them (deferred rstd handed from GEMM to
GEMM, residual_rmsnorm, the two MLP wirings).

On the CPU the specs' exact float64 references stand in for the kernels, so the CODA layer
must equal the standard one to float64 rounding: outputs and the gradients of x and every
weight. On an H200 the real kernels run (``gpu``), within twice the standard bf16 layer's
error against fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glue_helpers import module_from_file, use_standins
from test_rmsnorm_ops import standins as rms_standins
from test_rope_ops import standins as rope_standins
from test_swiglu_op import standins as swiglu_standins

ROOT = Path(__file__).resolve().parents[2]


L = module_from_file(ROOT / "benchmarks" / "llama_layer.py", "coda_llama_layer")
TINY = L.LayerShape("tiny", D=16, I=24, HQ=2, HKV=1, HD=8)


@pytest.mark.parametrize("mlp", L.MLPS)
def test_coda_layer_is_the_standard_layer_cpu(mlp, monkeypatch):
    calls = use_standins(monkeypatch, {**swiglu_standins(), **rms_standins("reference"), **rope_standins("reference")})
    M, S = 12, 6  # 2 sequences of 6 tokens
    args = [a.detach().requires_grad_() for a in L.make_inputs(TINY, M, device="cpu", dtype=torch.float64)]
    positions, inv_freq = L.rope_tables(M, S, TINY.HD, "cpu")
    kw = dict(positions=positions, inv_freq=inv_freq.double(), S=S, shape=TINY)
    dy = torch.randn(M, TINY.D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = (L.standard_layer(*args, **kw), *torch.autograd.grad(L.standard_layer(*args, **kw), args, dy))
    out = L.coda_layer(*args, mlp=mlp, **kw)
    got = (out, *torch.autograd.grad(out, args, dy))
    for name, g, w in zip(("out", "dx", *(f"d{p}" for p in L.PARAMS)), got, want, strict=False):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"{n}: {m}")
    fwd = {"swiglu": "swiglu_fwd", "deferred": "gemm_rmsnorm_swiglu", "deferred_mlp": "gemm_rmsnorm_swiglu"}[mlp]
    assert calls["gemm_rmsnorm_rope"] == 1 and calls["gemm_residual_partial_rms"] == 1 and calls[fwd] == 1
    assert calls["swiglu_bwd"] == (0 if mlp == "deferred" else 1)


def test_a_wrong_wiring_is_caught_cpu(monkeypatch):
    """The comparison can fail: the layer with g2 applied twice differs from the standard one."""
    use_standins(monkeypatch, {**swiglu_standins(), **rms_standins("reference"), **rope_standins("reference")})
    M, S = 12, 6
    args = L.make_inputs(TINY, M, device="cpu", dtype=torch.float64)
    positions, inv_freq = L.rope_tables(M, S, TINY.HD, "cpu")
    kw = dict(positions=positions, inv_freq=inv_freq.double(), S=S, shape=TINY)
    wrong = list(args)
    wrong[4] = args[4] * args[4]
    assert not torch.allclose(L.coda_layer(*wrong, **kw), L.standard_layer(*args, **kw), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("mlp", L.MLPS)
def test_coda_layer_matches_the_standard_layer_on_gpu(mlp):
    """llama3-1b dims, 2 sequences of 264 tokens (M not a multiple of the tiles): every
    output and gradient within twice the standard bf16 layer's error against fp32."""
    import coda_agent.kernels as K

    need = {"gemm_rmsnorm_rope", "gemm_residual_partial_rms"} | {
        "swiglu": {"swiglu_fwd", "swiglu_bwd"},
        "deferred": {"gemm_rmsnorm_swiglu"},
        "deferred_mlp": {"gemm_rmsnorm_swiglu", "swiglu_bwd"},
    }[mlp]
    if need - set(K.accepted()):
        pytest.skip(f"kernels not accepted yet: {sorted(need - set(K.accepted()))}")
    errs = L.check(L.LLAMA3_1B, 528, 264, mlp=mlp)
    for name, e in errs.items():
        assert e["coda"] <= 2 * e["standard_bf16"] + 1e-6, (name, e)


# --------------------------------------------------------------------------- the profile split

PROFILED_NAMES = {  # kernel names from H200 profiles of this layer (benchmarks/results/dev), and others
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_rstd_rope_epi_00a087cc4238dace_g_col_col_row_sm9_": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_of": "gemm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0": "attention",
    "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*, void*, void*, ": "attention",
    "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int, unsig": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_": "attention",
    "triton_red_fused__to_copy_add_deferred_rmsnorm_qkv_rope_mean_mul_pow_rsqrt_0": "other",
    "triton_per_fused_gemm_residual_partial_rms_mul_sum_3": "other",
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float,": "other",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<at::native::(anonymous n": "other",
}


def test_kernel_classes():
    for name, cls in PROFILED_NAMES.items():
        assert L.kernel_class(name) == cls, name


def test_split_profile_and_targets():
    prof = {"top": [{"kernel": n, "us/step": float(i + 1), "calls/step": 1.0} for i, n in enumerate(PROFILED_NAMES)]}
    sp = L.split_profile(prof, top_other=2)
    assert (sp["gemm us"], sp["attention us"], sp["other us"]) == (6.0, 30.0, 42.0)
    assert sp["other %"] == round(100 * 42 / 78, 2)
    assert [k["kernel"] for k in sp["other top"]] == list(PROFILED_NAMES)[8:10]
    res = {
        "standard (compile)": {"median": 10.6},
        "chained (compile)": {"median": 10.0},
        "split:chained (compile)": sp,
        "chained (eager)": "failed: ModuleNotFoundError",
    }
    got = L.targets("llama3-8b", res)
    assert got["compile speedup %"] == 6.0 and got["compile other %"] == sp["other %"]
    assert got["compile other % of step time"] == round(42.0 / 10_000 * 100, 2)
    assert "eager speedup %" not in got and got["targets"] == L.TARGETS["llama3-8b"]

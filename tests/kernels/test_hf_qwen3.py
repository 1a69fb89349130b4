"""``apply_coda`` on a Hugging Face Qwen3 (QK-norm: per-head RMSNorm of q and k before RoPE).

The Llama checks of ``test_hf_patch.py`` on tiny random Qwen3 configs, for both paths of
the QK-norm projection: the ``gemm_qknorm_rope`` kernel (``qk_norm_fused``, head_dim 128,
the kernel reported accepted) and the fallback on ``gemm_rmsnorm`` with the per-head norm
and RoPE in torch (what runs until that kernel is accepted, and for other head widths).
The MLP and the residual + norm use the ops shared with Llama either way. CPU: the
specs' PyTorch functions stand in for the kernels (float64 exact: the patched model's loss
and gradients equal transformers' to 1e-5 relative; bf16 baselines: within the bf16
budget). GPU (``gpu``): the real kernels, the same bf16 budget.
"""

from __future__ import annotations

import copy

import pytest
import torch
from glue_helpers import use_standins
from test_cross_entropy_ops import standins as ce_standins
from test_hf_patch import (
    BF16,
    TINY,
    assert_close_rel,
    bf16_budget_check,
    enable_checkpointing,
    loss_and_grads,
    needs_transformers,
    tiny_hf_train,
    tokens,
)
from test_qknorm_ops import standins as qk_standins
from test_rmsnorm_ops import standins as rms_standins
from test_rope_ops import standins as rope_standins
from test_swiglu_op import standins as swiglu_standins

import coda_agent.kernels as K
from coda_agent.kernels import hf

PATHS = {"fallback": dict(head_dim=64), "kernel": dict(head_dim=128)}
"""The QK-norm projection's two paths and the head width each is tested at."""


def tiny_qwen3(dtype=BF16, seed=0, **overrides):
    """A random tiny Qwen3ForCausalLM (every norm weight, q_norm and k_norm included, in [0.5, 1.5])."""
    import transformers

    kw = {**TINY, "rms_norm_eps": 1e-6, **overrides}
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM._from_config(transformers.Qwen3Config(**kw), dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _standins(kind: str) -> dict:
    return {
        **swiglu_standins(),
        **rms_standins(kind),
        **rope_standins(kind),
        **ce_standins(),
        **qk_standins(kind),
    }


def _kernel_path(monkeypatch, path: str) -> None:
    """The gemm_qknorm_rope kernel reported accepted (its stand-in runs) for path "kernel"."""
    if path == "kernel":
        monkeypatch.setattr(K, "qknorm_kernel_ready", lambda head_dim, eps: head_dim == 128 and eps == 1e-6)


@pytest.fixture
def exact(monkeypatch):
    calls = use_standins(monkeypatch, _standins("reference"))
    monkeypatch.setattr(hf, "WEIGHT_DTYPE", torch.float64)
    return calls


@pytest.fixture
def baseline(monkeypatch):
    return use_standins(monkeypatch, _standins("baseline"), check_layout=True)


# --------------------------------------------------------------------------- structure and checkpoints


@needs_transformers
def test_qwen3_modules_and_state_dict_cpu(tmp_path):
    """q/k/v fused, q_norm / k_norm kept; state_dict with HF's keys, order, shapes, dtypes
    and values; save_pretrained -> unpatched from_pretrained bit-identical; remove_coda."""
    import transformers

    model = tiny_qwen3()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    K.apply_coda(model)
    layer = model.model.layers[0]
    assert type(layer).__name__ == "Qwen3DecoderLayer" and model._coda.qk_norm_fused is False
    assert list(layer.self_attn._modules) == ["qkv_proj", "o_proj", "q_norm", "k_norm"]
    after = model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k
    model.save_pretrained(tmp_path)
    loaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=BF16)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, before[k]), k
    other = tiny_qwen3(seed=1)
    assert not model.load_state_dict(other.state_dict()).missing_keys
    assert all(torch.equal(model.state_dict()[k], v) for k, v in other.state_dict().items())
    K.remove_coda(model)
    assert type(model.model.layers[0]) is transformers.models.qwen3.modeling_qwen3.Qwen3DecoderLayer
    assert list(model.state_dict()) == list(before)


@needs_transformers
def test_qwen3_kernel_path_is_decided_at_patch_time_cpu(monkeypatch):
    monkeypatch.setattr(K, "accepted", lambda: ["gemm_qknorm_rope"])
    assert K.apply_coda(tiny_qwen3(head_dim=128))._coda.qk_norm_fused is True
    assert K.apply_coda(tiny_qwen3(head_dim=64))._coda.qk_norm_fused is False  # the kernel's HD is 128
    assert K.apply_coda(tiny_qwen3(head_dim=128, rms_norm_eps=1e-5))._coda.qk_norm_fused is False
    monkeypatch.setattr(K, "accepted", lambda: [])
    assert K.apply_coda(tiny_qwen3(head_dim=128))._coda.qk_norm_fused is False


@needs_transformers
def test_qwen3_refusals_name_the_module_cpu():
    model = tiny_qwen3()
    model.model.layers[1].self_attn.k_norm.variance_epsilon = 1e-5
    with pytest.raises(ValueError, match="model layer 1: q_norm's and k_norm's eps differ"):
        K.apply_coda(model)
    model = tiny_qwen3()
    model.model.layers[0].self_attn.q_norm = torch.nn.LayerNorm(64)
    with pytest.raises(
        ValueError, match=r"model layer 0: \.self_attn\.q_norm is LayerNorm, not transformers' Qwen3RMSNorm"
    ):
        K.apply_coda(model)


# --------------------------------------------------------------------------- numerics with stand-ins


@needs_transformers
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("fused_lm_head", [False, True])
def test_qwen3_patched_equals_unpatched_float64_cpu(path, fused_lm_head, exact, monkeypatch):
    _kernel_path(monkeypatch, path)
    ref = tiny_qwen3(torch.float64, **PATHS[path])
    model = K.apply_coda(copy.deepcopy(ref), fused_lm_head=fused_lm_head)
    assert model._coda.qk_norm_fused is (path == "kernel")
    ids = tokens()
    want = loss_and_grads(ref, ids)
    for k in exact:
        exact[k] = 0
    got = loss_and_grads(model, ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-5)
    n = TINY["num_hidden_layers"]
    assert exact["gemm_qknorm_rope"] == (n if path == "kernel" else 0)
    assert exact["gemm_rmsnorm"] == (0 if path == "kernel" else n)  # the fallback's projection
    assert exact["gemm_rmsnorm_rope"] == 0  # Llama's projection has no per-head norm
    assert exact["gemm_residual_partial_rms"] == exact["gemm_rmsnorm_swiglu"] == exact["swiglu_bwd"] == n
    assert exact["gemm_cross_entropy"] == (1 if fused_lm_head else 0)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref.eval()(ids).logits, rtol=1e-5, atol=1e-6)


@needs_transformers
@pytest.mark.parametrize("path", list(PATHS))
def test_qwen3_within_the_bf16_budget_cpu(path, baseline, monkeypatch):
    _kernel_path(monkeypatch, path)
    low = tiny_qwen3(BF16, **PATHS[path])
    ref = copy.deepcopy(low).double()
    ids = tokens()
    r, s = loss_and_grads(ref, ids), loss_and_grads(low, ids)
    model = K.apply_coda(copy.deepcopy(low))
    bf16_budget_check(loss_and_grads(model, ids), s, r)


@needs_transformers
def test_qwen3_sliding_window_per_layer_cpu(exact):
    """Qwen3 with use_sliding_window: the window applies to the layers from max_window_layers
    on, as each attention module holds it; the patched model follows per layer."""
    kw = dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    ref = tiny_qwen3(torch.float64, **kw)
    assert [layer.self_attn.sliding_window for layer in ref.model.layers] == [None, 8]
    model = K.apply_coda(copy.deepcopy(ref))
    ids = tokens(S=32)
    want, got = loss_and_grads(ref, ids), loss_and_grads(model, ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-5)
    full = K.apply_coda(tiny_qwen3(torch.float64))
    assert not torch.allclose(loss_and_grads(full, ids)[0], got[0], rtol=1e-6)  # the window mattered


@needs_transformers
def test_qwen3_gradient_checkpointing_cpu(exact, monkeypatch):
    _kernel_path(monkeypatch, "kernel")
    model = K.apply_coda(tiny_qwen3(torch.float64, head_dim=128))
    ids = tokens()
    want = loss_and_grads(model, ids)
    enable_checkpointing(model)
    got = loss_and_grads(model, ids)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-12)


@pytest.mark.slow
@needs_transformers
@pytest.mark.parametrize("path", list(PATHS))
def test_qwen3_compile_fullgraph_cpu(path, baseline, monkeypatch):
    """torch.compile(fullgraph=True, aot_eager) of the patched Qwen3: no graph break, the
    eager loss and gradients (bf16 rounding apart)."""
    _kernel_path(monkeypatch, path)
    model = K.apply_coda(tiny_qwen3(BF16, **PATHS[path]))
    ids = tokens()
    want = loss_and_grads(model, ids)
    torch._dynamo.reset()
    got = loss_and_grads(torch.compile(model, fullgraph=True, backend="aot_eager"), ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=0)
    assert_close_rel(got[1], want[1], rtol=2e-2)
    torch._dynamo.reset()


# --------------------------------------------------------------------------- benchmarks/hf_train.py --model qwen3


@pytest.mark.slow
@needs_transformers
def test_hf_train_qwen3_runs_on_a_tiny_model_cpu(baseline, monkeypatch, capsys):
    """``hf_train.py --model qwen3`` on the CPU (tiny widths, stand-ins, aot_eager): --parity's
    runs learn and stay near the unpatched one; --speed times every variant, with the
    gemm_qknorm_rope kernel reported accepted (its stand-in runs) the torch QK-norm path
    too, and the patched models are Qwen3's."""
    T = tiny_hf_train(monkeypatch)
    monkeypatch.setattr(K, "accepted", lambda: ["gemm_qknorm_rope"])
    res = {}
    T.parity(T.argparse.Namespace(layers=2, n_batches=2, batch=2, steps=6, model="qwen3"), res)
    torch._dynamo.reset()
    runs = res["parity"]["runs"]
    assert res["parity"]["config"]["shape"] == "qwen3-1.7b"
    assert all(isinstance(r, dict) and len(r["loss"]) == 6 for r in runs.values()), runs
    assert runs["unpatched eager"]["loss"][-1] < runs["unpatched eager"]["loss"][0]
    diff = res["parity"]["summary"]["loss"]["coda eager vs unpatched eager"]["max"]
    assert diff < 0.05 * max(runs["unpatched eager"]["loss"])
    args = T.argparse.Namespace(
        layers=1,
        shape=["qwen3-8b"],
        model="qwen3",
        all=False,
        quick=False,
        no_liger=True,
        warmup=1,
        steps_timed=1,
        rounds=1,
    )
    names = [n for n, _, _ in T.speed_variants(args)]
    assert "coda, QK-norm in torch + compile" in names
    config = T.make_config("qwen3-8b", 1)
    assert type(config).__name__ == "Qwen3Config" and config.rope_parameters["rope_theta"] == 1e6
    for qk_torch in (False, True):
        m = T.build(config, T.init_state(config), coda=True, qk_norm_torch=qk_torch)
        assert type(m).__name__ == "Qwen3ForCausalLM" and m._coda.qk_norm_fused is (not qk_torch)
    T.speed(args, res)
    torch._dynamo.reset()
    r = res["speed"]["qwen3-8b"]
    assert all(isinstance(r[n], dict) and r[n]["tokens_per_s"] > 0 for n in names), r
    T.print_speed(res["speed"])
    assert "| coda, QK-norm in torch + compile |" in capsys.readouterr().out


# --------------------------------------------------------------------------- GPU

GPU_CONFIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    attn_implementation="sdpa",
)
SHARED = ("gemm_residual_partial_rms", "gemm_rmsnorm_swiglu", "swiglu_bwd", "gemm_rmsnorm")


@needs_transformers
@pytest.mark.gpu
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("mode", ["eager", "torch.compile"])
def test_patched_qwen3_within_the_bf16_budget_on_gpu(path, mode, monkeypatch):
    """2 layers, hidden 1024, 8 / 4 heads of 128, vocab 32000, 2 x 512 tokens: the patched
    model's loss and every gradient within twice the standard bf16 model's error against the
    fp32 model from the same bf16 weights. ``fallback`` forces the torch QK-norm path;
    ``kernel`` needs gemm_qknorm_rope accepted."""
    import transformers

    need = set(SHARED) | ({"gemm_qknorm_rope"} if path == "kernel" else set())
    missing = need - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")
    if path == "fallback":
        monkeypatch.setattr(K, "qknorm_kernel_ready", lambda head_dim, eps: False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        low = transformers.Qwen3ForCausalLM._from_config(transformers.Qwen3Config(**GPU_CONFIG), dtype=BF16)
    with torch.no_grad():
        for name, p in low.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ref = copy.deepcopy(low).float()
    model = K.apply_coda(copy.deepcopy(low))
    assert model._coda.qk_norm_fused is (path == "kernel")
    run = torch.compile(model) if mode == "torch.compile" else model
    ids = tokens(B=2, S=512, V=GPU_CONFIG["vocab_size"]).cuda()
    r, s = loss_and_grads(ref, ids), loss_and_grads(low, ids)
    bf16_budget_check(loss_and_grads(run, ids), s, r)

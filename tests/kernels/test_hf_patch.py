"""``apply_coda``: a Hugging Face Llama (transformers 5.x) patched to run the fused ops.

CPU tests (tiny random configs, no downloads; skipped without transformers) check the
patching logic: which modules are replaced, state-dict invariance (keys, order, shapes,
dtypes, values), save_pretrained -> from_pretrained into an unpatched model, loading,
remove_coda, the optimizer's parameters, every unsupported setting's error, torch.compile
without graph breaks, gradient checkpointing and FSDP2 at world size 1 (gloo). With the
specs' PyTorch functions standing in for the kernels (glue_helpers.use_standins; the
device check off):

* float64, the exact ``reference`` stand-ins: the patched model's loss and gradients equal
  the unpatched model's to 1e-5 relative (transformers' own model computes RMSNorm
  statistics, RoPE angles and the loss in fp32 even in float64; a wrong permutation or
  wiring is an O(1) error);
* bf16, the ``baseline`` stand-ins with the layout checks on: every gradient within twice
  the standard bf16 model's error against the float64 model, the loss within twice that
  error or half a bf16 ulp of the loss, whichever is larger.

GPU tests (``gpu``, an H200 with the kernels accepted): the same bf16 criterion with the
real kernels, eager, under torch.compile and with gradient checkpointing.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from glue_helpers import use_standins
from test_cross_entropy_ops import standins as ce_standins
from test_rmsnorm_ops import standins as rms_standins
from test_rope_ops import standins as rope_standins
from test_swiglu_op import standins as swiglu_standins

import coda_agent.kernels as K
from coda_agent.kernels import hf

ROOT = Path(__file__).resolve().parents[2]
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="needs transformers 5.x (pip install 'coda-agent[hf]')"
)
BF16 = torch.bfloat16
TINY = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    attn_implementation="sdpa",
)
HF_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)
KERNELS = ("gemm_rmsnorm_rope", "gemm_residual_partial_rms", "gemm_rmsnorm_swiglu", "swiglu_bwd")


def tiny_model(dtype=BF16, seed=0, model_type="llama", **overrides):
    """A random tiny *ForCausalLM (gammas in [0.5, 1.5], so a misplaced norm weight shows)."""
    import transformers

    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[model_type]
    kw = {**TINY, **overrides}
    if model_type == "qwen2":
        kw.pop("head_dim")
    torch.manual_seed(seed)
    model = model_cls._from_config(cfg_cls(**kw), dtype=dtype)  # as from_pretrained: inv_freq stays fp32
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def tokens(B=2, S=32, V=256, seed=1):
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def exact(monkeypatch):
    """float64 models: the specs' exact references stand in for the kernels (layout checks off)."""
    calls = use_standins(
        monkeypatch, {**swiglu_standins(), **rms_standins("reference"), **rope_standins("reference"), **ce_standins()}
    )
    monkeypatch.setattr(hf, "WEIGHT_DTYPE", torch.float64)
    return calls


@pytest.fixture
def baseline(monkeypatch):
    """bf16 models: the specs' PyTorch baselines stand in, dtype and layout checks on."""
    return use_standins(
        monkeypatch,
        {**swiglu_standins(), **rms_standins("baseline"), **rope_standins("baseline"), **ce_standins()},
        check_layout=True,
    )


def hf_grads(model) -> dict[str, torch.Tensor]:
    """Parameter gradients keyed and laid out as the unpatched model's (fused ones unpacked)."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # FSDP2: DTensor grads
        if name.endswith("qkv_proj.weight"):
            attn_prefix = name[: -len("qkv_proj.weight")]
            c = model.config
            for part, t in zip(
                ("q_proj", "k_proj", "v_proj"),
                hf.unpack_qkv(
                    g, n_q_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim
                ),
                strict=False,
            ):
                out[f"{attn_prefix}{part}.weight"] = t
        elif name.endswith("gate_up_proj.weight"):
            mlp_prefix = name[: -len("gate_up_proj.weight")]
            gate, up = hf.unpack_gate_up(g)
            out[f"{mlp_prefix}gate_proj.weight"], out[f"{mlp_prefix}up_proj.weight"] = gate, up
        else:
            out[name] = g
    return out


def enable_checkpointing(model):
    """transformers' activation checkpointing (``gradient_checkpointing_enable`` before 5.x's rename)."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


def loss_and_grads(model, ids, **kw):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids, **kw).loss
    loss.backward()
    return loss.detach(), hf_grads(model)


def assert_close_rel(got: dict, want: dict, rtol: float):
    assert got.keys() == want.keys()
    for name in want:
        g, w = got[name].double(), want[name].double()
        err = (g - w).abs().max().item()
        assert err <= rtol * (w.abs().max().item() + 1e-30), f"{name}: max err {err:.3e}, |ref| {w.abs().max():.3e}"


def bf16_budget_check(got, low, ref):
    """``got`` and ``low`` (bf16 runs) against ``ref`` (float64 run): (loss, grads) tuples.
    Every gradient within 2 x the standard bf16 model's error + 1e-6; the loss within
    2 x that error or half a bf16 ulp of the loss."""
    loss_err = abs(got[0].double() - ref[0].double()).item()
    loss_budget = max(2 * abs(low[0].double() - ref[0].double()).item(), 2.0**-9 * abs(ref[0].item()))
    assert loss_err <= loss_budget, f"loss: err {loss_err:.3e} > {loss_budget:.3e}"
    worst = 0.0
    for name, r in ref[1].items():
        err = (got[1][name].double() - r.double()).abs().max().item()
        budget = 2 * (low[1][name].double() - r.double()).abs().max().item() + 1e-6
        assert err <= budget, f"{name}: err {err:.3e} > allowed {budget:.3e}"
        worst = max(worst, err / budget)
    return worst


# --------------------------------------------------------------------------- structure


@pytest.mark.slow
def test_import_does_not_need_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import coda_agent.kernels as K\n"
        "assert callable(K.apply_coda) and callable(K.remove_coda)\n"
        "try:\n    K.apply_coda(object())\n"
        "except ModuleNotFoundError as e:\n    assert 'coda-agent[hf]' in str(e)\n"
        "else:\n    raise SystemExit('no error')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_layouts_are_exact_inverses_cpu():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n * 64, 32, generator=g) for n in (4, 2, 2))
    w = hf.pack_qkv(q, k, v, n_q_heads=4, n_kv_heads=2, head_dim=64)
    assert w.shape == (512, 32) and w.is_contiguous()
    assert torch.equal(w[1], q[32]) and torch.equal(w[64 + 2], q[64 + 1]) and torch.equal(w[4 * 64 + 3], k[33])
    assert all(
        torch.equal(a, b)
        for a, b in zip(hf.unpack_qkv(w, n_q_heads=4, n_kv_heads=2, head_dim=64), (q, k, v), strict=False)
    )
    gate, up = torch.randn(24, 16, generator=g), torch.randn(24, 16, generator=g)
    w1 = hf.pack_gate_up(gate, up)
    assert torch.equal(w1[0::2], gate) and torch.equal(w1[1::2], up)
    assert all(torch.equal(a, b) for a, b in zip(hf.unpack_gate_up(w1), (gate, up), strict=False))
    assert hf.rope_row_permutation(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    with pytest.raises(ValueError, match="k must have 128 rows"):
        hf.pack_qkv(q, k[:64], v, n_q_heads=4, n_kv_heads=2, head_dim=64)


@pytest.mark.slow
@needs_transformers
def test_which_modules_are_replaced_cpu():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Layer

    model = tiny_model()
    n_before = sum(p.numel() for p in model.parameters())
    assert K.apply_coda(model) is model
    assert model._coda.layers == [0, 1] and model._coda.fused_lm_head is False and model._coda.mlp == "deferred_mlp"
    for layer in model.model.layers:
        assert isinstance(layer, Layer) and type(layer) is not Layer
        assert type(layer).__name__ == "LlamaDecoderLayer"  # _no_split_modules / wrap policies match by name
        assert list(layer.self_attn._modules) == ["qkv_proj", "o_proj"]
        assert list(layer.mlp._modules) == ["gate_up_proj", "down_proj", "act_fn"]
        assert layer.self_attn.qkv_proj.weight.shape == ((2 + 2 * 1) * 64, 128)
        assert layer.mlp.gate_up_proj.weight.shape == (512, 128)
        assert isinstance(layer.self_attn.q_proj, hf.PackedPart)  # HF key paths still resolve, read-only
        assert layer.coda_inv_freq.dtype == torch.float32
    assert "forward" not in model.__dict__  # plain LM head: the model's forward untouched
    params = list(model.named_parameters(remove_duplicate=False))
    assert len({id(p) for _, p in params}) == len(params)
    assert sum(p.numel() for _, p in params) == n_before
    assert [n for n, _ in model.model.layers[0].named_parameters()] == [
        "self_attn.qkv_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    assert not any("q_proj" in n for n, _ in model.named_modules())


@pytest.mark.slow
@needs_transformers
def test_packed_part_is_read_only_cpu():
    model = tiny_model()
    q = model.model.layers[1].self_attn.q_proj.weight.clone()
    K.apply_coda(model)
    view = model.model.layers[1].self_attn.q_proj.weight
    assert torch.equal(view, q)
    with pytest.raises(RuntimeError, match="[Ii]nference"):
        view.add_(1)


# --------------------------------------------------------------------------- checkpoints


@needs_transformers
@pytest.mark.parametrize("keep_vars", [False, True])
def test_state_dict_is_unchanged_cpu(keep_vars):
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    K.apply_coda(model, fused_lm_head=True)
    after = model.state_dict(keep_vars=keep_vars)
    assert list(after) == list(before)  # keys and their order
    for k, v in before.items():
        assert after[k].shape == v.shape and after[k].dtype == v.dtype, k
        assert torch.equal(after[k], v), k
    layer_sd = model.model.layers[0].state_dict()  # a submodule's state dict: HF keys too
    assert list(layer_sd) == list(HF_KEYS)


@needs_transformers
def test_save_pretrained_then_unpatched_from_pretrained_is_bit_identical_cpu(tmp_path):
    import transformers
    from safetensors import safe_open

    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    K.apply_coda(model)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == set(before) - {"lm_head.weight"} or saved == set(before)  # tied weights may be dropped
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=BF16)
    assert not hasattr(loaded, "_coda")
    for k, v in loaded.state_dict().items():
        assert v.dtype == before[k].dtype and torch.equal(v, before[k]), k


@needs_transformers
def test_load_state_dict_takes_hf_keys_cpu():
    model, other = tiny_model(seed=0), tiny_model(seed=1)
    K.apply_coda(model)
    res = model.load_state_dict(other.state_dict())
    assert not res.missing_keys and not res.unexpected_keys
    for k, v in other.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


@needs_transformers
def test_partial_load_state_dict_behaves_like_the_unpatched_model_cpu():
    model, other = tiny_model(seed=0), tiny_model(seed=1)
    plain = copy.deepcopy(model)
    K.apply_coda(model)
    part = {k: v for k, v in other.state_dict().items() if k.endswith(("q_proj.weight", "up_proj.weight"))}
    for m in (model, plain):
        res = m.load_state_dict(part, strict=False)
        assert "model.layers.0.self_attn.k_proj.weight" in res.missing_keys
        assert "model.layers.0.self_attn.qkv_proj.weight" not in res.missing_keys
        assert not res.unexpected_keys
    for k, v in plain.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*k_proj\.weight"):
        model.load_state_dict(part)
    bad = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 128, dtype=BF16)}
    with pytest.raises(RuntimeError, match="size mismatch for model.layers.0.self_attn.q_proj.weight"):
        model.load_state_dict(bad, strict=False)


@needs_transformers
def test_remove_coda_restores_the_model_cpu():
    import transformers

    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    K.apply_coda(model, fused_lm_head=True)
    assert K.remove_coda(model) is model
    assert type(model.model.layers[0]) is transformers.models.llama.modeling_llama.LlamaDecoderLayer
    assert "forward" not in model.__dict__ and not hasattr(model, "_coda")
    assert [n for n, _ in model.named_parameters()] == names
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="not patched"):
        K.remove_coda(model)
    K.apply_coda(model)  # patchable again
    twin = copy.deepcopy(model)  # a copy is patched on its own
    K.remove_coda(twin)
    assert list(model.model.layers[0].self_attn._modules) == ["qkv_proj", "o_proj"]
    assert list(model.state_dict()) == list(before) == list(twin.state_dict())


@needs_transformers
def test_meta_init_then_to_empty_and_load_cpu():
    """The FSDP2 large-model flow: build on the meta device, apply_coda, materialize
    (to_empty), load an HF state dict: the HF values, and the RoPE table restored."""
    import transformers

    want = tiny_model(seed=5)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(want.config).to(BF16)
    K.apply_coda(model)
    model.to_empty(device="cpu")
    res = model.load_state_dict(want.state_dict())
    assert not res.missing_keys and not res.unexpected_keys
    for k, v in want.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert torch.equal(model.model.layers[0].coda_inv_freq, 1.0 / 10000.0 ** (torch.arange(0, 64, 2) / 64.0))


@needs_transformers
def test_inv_freq_buffer_survives_casts_and_to_empty_cpu():
    model = tiny_model().to(BF16)  # .to(bf16) casts HF's inv_freq buffer too
    assert model.model.rotary_emb.inv_freq.dtype == BF16
    K.apply_coda(model)  # recomputed from the config in fp32
    want = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    layer = model.model.layers[0]
    assert torch.equal(layer.coda_inv_freq, want)
    model.to(BF16)  # casts floating buffers
    assert layer.coda_inv_freq.dtype == torch.float32 and torch.equal(layer.coda_inv_freq, want)
    model.to_empty(device="cpu")  # uninitialized storage
    assert torch.equal(model.model.layers[1].coda_inv_freq, want)
    assert "coda_inv_freq" not in str(list(model.state_dict()))


@needs_transformers
def test_inv_freq_from_another_device_is_used_as_is_cpu():
    """A buffer a few ulp off the config's values (computed on the GPU, whose pow rounds
    differently) is the same config: the patched layers rotate with the buffer's exact
    values. A buffer changed beyond ``INV_FREQ_RTOL`` is refused, naming the distance."""
    model = tiny_model()
    buf = model.model.rotary_emb.inv_freq
    assert buf.dtype == torch.float32
    off = torch.nextafter(torch.nextafter(buf, buf + 1), buf + 1)  # 2 ulp up
    buf.copy_(off)
    K.apply_coda(model)
    assert torch.equal(model.model.layers[0].coda_inv_freq, off)
    assert not torch.equal(off, 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))

    changed = tiny_model()
    changed.model.rotary_emb.inv_freq.mul_(1.001)
    with pytest.raises(ValueError, match=r"inv_freq differs .* by up to 1\.00e-03 relative"):
        K.apply_coda(changed)


# --------------------------------------------------------------------------- numerics with stand-ins


@needs_transformers
@pytest.mark.parametrize("mlp", hf.MLPS)
@pytest.mark.parametrize("fused_lm_head", [False, True])
def test_patched_equals_unpatched_float64_cpu(mlp, fused_lm_head, exact):
    ref = tiny_model(torch.float64)
    model = K.apply_coda(copy.deepcopy(ref), fused_lm_head=fused_lm_head, mlp=mlp)
    ids = tokens()
    want = loss_and_grads(ref, ids)
    for k in exact:
        exact[k] = 0
    got = loss_and_grads(model, ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-5)
    n = TINY["num_hidden_layers"]
    assert exact["gemm_rmsnorm_rope"] == n and exact["gemm_residual_partial_rms"] == n
    assert exact["gemm_rmsnorm_swiglu" if mlp == "deferred_mlp" else "swiglu_fwd"] == n
    assert exact["swiglu_bwd"] == n
    assert exact["gemm_cross_entropy"] == exact["cross_entropy_bwd"] == (1 if fused_lm_head else 0)
    if fused_lm_head:
        assert model(ids, labels=ids).logits is None
    model.eval()  # evaluation: the plain head, logits as HF's
    with torch.no_grad():
        out, want_out = model(ids, labels=ids), ref(ids, labels=ids)
    torch.testing.assert_close(out.logits, want_out.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss, want_out.loss, rtol=1e-6, atol=0)


@needs_transformers
def test_fused_lm_head_matches_hf_loss_options_float64_cpu(exact):
    """num_items_in_batch (gradient accumulation), ignored labels, shift_labels and
    return_dict=False give HF's loss."""
    ref = tiny_model(torch.float64)
    model = K.apply_coda(copy.deepcopy(ref), fused_lm_head=True)
    ref.train(), model.train()
    ids = tokens()
    labels = ids.clone()
    labels[0, :5] = -100
    for kw in ({}, {"num_items_in_batch": torch.tensor(50)}):
        torch.testing.assert_close(
            model(ids, labels=labels, **kw).loss, ref(ids, labels=labels, **kw).loss, rtol=1e-6, atol=0
        )
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    torch.testing.assert_close(
        model(ids, shift_labels=shifted, labels=labels).loss, ref(ids, labels=labels).loss, rtol=1e-6, atol=0
    )
    tup = model(ids, labels=labels, return_dict=False)
    assert isinstance(tup, tuple) and torch.allclose(tup[0], ref(ids, labels=labels).loss, rtol=1e-6)


@needs_transformers
def test_patched_within_the_bf16_budget_cpu(baseline):
    """The real dtypes and layout checks (bf16, baseline stand-ins): patched and standard bf16
    models against the float64 model from the same bf16 weights."""
    low = tiny_model(BF16)
    ref = copy.deepcopy(low).double()
    ids = tokens()
    r, s = loss_and_grads(ref, ids), loss_and_grads(low, ids)
    for fused in (False, True):
        model = K.apply_coda(copy.deepcopy(low), fused_lm_head=fused)
        bf16_budget_check(loss_and_grads(model, ids), s, r)


@needs_transformers
def test_gradient_checkpointing_cpu(exact):
    ref = tiny_model(torch.float64)
    model = K.apply_coda(copy.deepcopy(ref))
    ids = tokens()
    want = loss_and_grads(model, ids)
    enable_checkpointing(model)
    for k in exact:
        exact[k] = 0
    got = loss_and_grads(model, ids)
    assert exact["gemm_rmsnorm_rope"] == 2 * TINY["num_hidden_layers"]  # the forward, then the recompute
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-12)


@pytest.mark.slow
@needs_transformers
def test_optimizer_steps_the_fused_parameters_cpu(exact):
    """AdamW with grad clipping on the patched model = on the unpatched one (float64): the
    gradient norms agree to 1e-5 relative and the weights after three steps (lr 1e-3) to 1e-5
    absolute, 1 % of one step's largest update (Adam's normalized update amplifies the
    ~1e-7 relative gradient differences of elements whose gradient is near 0)."""
    ref = tiny_model(torch.float64)
    model = K.apply_coda(copy.deepcopy(ref))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1) for m in (ref, model)]
    for step in range(3):
        ids = tokens(seed=10 + step)
        norms = []
        for m, opt in zip((ref, model), opts, strict=False):
            opt.zero_grad()
            m(ids, labels=ids).loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0))
            opt.step()
        torch.testing.assert_close(norms[1], norms[0], rtol=1e-5, atol=0)
    got, want = model.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert {id(p) for g in opts[1].param_groups for p in g["params"]} == {id(p) for p in model.parameters()}


@needs_transformers
def test_llama3_rope_scaling_cpu(exact):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    ref = tiny_model(torch.float64, rope_parameters=rope)
    model = K.apply_coda(copy.deepcopy(ref))
    assert torch.equal(model.model.layers[0].coda_inv_freq, ref.model.rotary_emb.inv_freq.float())
    ids = tokens(S=64)
    want, got = loss_and_grads(ref, ids), loss_and_grads(model, ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-5)


@needs_transformers
def test_mistral_with_a_sliding_window_cpu(exact):
    ref = tiny_model(torch.float64, model_type="mistral", sliding_window=8)
    model = K.apply_coda(copy.deepcopy(ref))
    ids = tokens(S=32)
    want, got = loss_and_grads(ref, ids), loss_and_grads(model, ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert_close_rel(got[1], want[1], rtol=1e-5)
    no_window = K.apply_coda(tiny_model(torch.float64, model_type="mistral", sliding_window=None))
    assert not torch.allclose(loss_and_grads(no_window, ids)[0], got[0], rtol=1e-6)  # the window mattered


@needs_transformers
def test_padding_mask_and_position_ids_reach_attention_cpu(exact):
    ref = tiny_model(torch.float64)
    model = K.apply_coda(copy.deepcopy(ref))
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding of the second sequence
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    labels = ids.masked_fill(mask == 0, -100)
    ref.train(), model.train()
    want = ref(ids, attention_mask=mask, position_ids=pos, labels=labels).loss
    got = model(ids, attention_mask=mask, position_ids=pos, labels=labels).loss
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


@needs_transformers
def test_generation_uses_the_plain_head_and_a_consistent_cache_cpu(exact):
    ref = tiny_model(torch.float64)
    model = K.apply_coda(copy.deepcopy(ref), fused_lm_head=True)
    ref.eval(), model.eval()
    ids = tokens(B=1, S=8)
    kw = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(ids, **kw), ref.generate(ids, **kw))


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.slow
@needs_transformers
def test_compile_fullgraph_has_no_graph_breaks_cpu(baseline):
    """torch.compile(fullgraph=True) of a patched layer and of the whole patched model
    (training step, fused LM head) traces without a graph break and gives the eager results
    (backend aot_eager: Dynamo + AOTAutograd, no C++ compile)."""
    model = K.apply_coda(tiny_model(BF16), fused_lm_head=True)
    model.train()
    layer = model.model.layers[0]
    x = torch.randn(2, 16, 128, dtype=BF16, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(16)[None]
    eager = layer(x, position_ids=pos)
    torch._dynamo.reset()
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, position_ids=pos)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    ids = tokens()
    want = loss_and_grads(model, ids)
    got = loss_and_grads(torch.compile(model, fullgraph=True, backend="aot_eager"), ids)
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=0)
    assert_close_rel(got[1], want[1], rtol=2e-2)  # bf16: AOTAutograd's decompositions round differently
    torch._dynamo.reset()


# --------------------------------------------------------------------------- FSDP2


@pytest.mark.slow
@needs_transformers
def test_fsdp2_world_size_one_cpu(exact, tmp_path):
    """fully_shard (gloo, one rank) of a patched model: training step equal to the unsharded
    patched model; state_dict of Shard(0) DTensors under HF's keys with HF's values; DCP's
    get_model_state_dict / set_model_state_dict round trip."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ref = tiny_model(torch.float64)
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    plain = K.apply_coda(copy.deepcopy(ref))
    model = copy.deepcopy(plain)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        ids = tokens()
        got, want = loss_and_grads(model, ids), loss_and_grads(plain, ids)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        assert_close_rel(got[1], want[1], rtol=1e-12)
        sd = model.state_dict()
        assert list(sd) == list(before)
        for k, v in before.items():
            assert type(sd[k]).__name__ == "DTensor" and torch.equal(sd[k].full_tensor(), v), k
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        assert list(full) == list(before) and all(torch.equal(full[k], v) for k, v in before.items())
        other = tiny_model(torch.float64, seed=3)
        set_model_state_dict(model, other.state_dict(), options=StateDictOptions(full_state_dict=True))
        for k, v in other.state_dict().items():
            assert torch.equal(model.state_dict()[k].full_tensor(), v), k
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- unsupported settings

UNSUPPORTED = {
    # name: (tiny_model overrides, what the message must name)
    "attention_bias": (dict(attention_bias=True), "config.attention_bias"),
    "mlp_bias": (dict(mlp_bias=True), "config.mlp_bias"),
    "hidden_act": (dict(hidden_act="gelu"), "config.hidden_act"),
    "head_dim": (dict(head_dim=32, hidden_size=64), "config.head_dim"),
    "hidden_size": (dict(hidden_size=132), "config.hidden_size"),
    "intermediate_size": (dict(intermediate_size=260), "config.intermediate_size"),
    "yarn": (
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        ),
        "config.rope_parameters['rope_type']",
    ),
    "dynamic": (
        dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        "config.rope_parameters['rope_type']",
    ),
    "fp32_weights": (dict(dtype=torch.float32), "(dtype)"),
    "qwen2": (dict(model_type="qwen2"), "config.model_type = 'qwen2'"),
}


@needs_transformers
@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_setting_raises_naming_it_cpu(case):
    kw, needle = UNSUPPORTED[case]
    model = tiny_model(**kw)
    before = list(model.state_dict())
    with pytest.raises(ValueError, match="apply_coda") as e:
        K.apply_coda(model)
    assert needle in str(e.value), str(e.value)
    assert not hasattr(model, "_coda") and list(model.state_dict()) == before
    assert all(type(layer).__module__.startswith("transformers.") for layer in model.model.layers)
    with pytest.warns(UserWarning, match="apply_coda") as w:  # strict=False: a warning, left as it was
        K.apply_coda(model, strict=False)
    assert needle in str(w[0].message)
    assert all(type(layer).__module__.startswith("transformers.") for layer in model.model.layers)


@needs_transformers
def test_fused_lm_head_needs_a_multiple_of_8_vocab_cpu():
    model = tiny_model(vocab_size=250)
    with pytest.raises(ValueError, match=r"config\.vocab_size = 250"):
        K.apply_coda(model, fused_lm_head=True)
    with pytest.warns(UserWarning, match="LM head is left unfused"):
        K.apply_coda(model, fused_lm_head=True, strict=False)
    assert model._coda.layers == [0, 1] and model._coda.fused_lm_head is False and "forward" not in model.__dict__
    base = tiny_model().model
    with pytest.raises(ValueError, match="ForCausalLM"):
        K.apply_coda(base, fused_lm_head=True)
    assert K.apply_coda(base)._coda.layers == [0, 1]  # the base model: layers only


@needs_transformers
def test_strict_false_skips_only_the_unsupported_layer_cpu(baseline):
    model = tiny_model()
    model.model.layers[1].float()
    with pytest.raises(ValueError, match="model layer 1: .* is torch.float32 \\(dtype\\)"):
        K.apply_coda(model)
    with pytest.warns(UserWarning, match="layers are left unpatched"):
        K.apply_coda(model, strict=False)
    assert model._coda.layers == [0]
    assert type(model.model.layers[1]).__module__.startswith("transformers.")


@needs_transformers
def test_other_refusals_cpu():
    model = tiny_model()
    model.model.layers[0].self_attn.q_proj.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="differ in requires_grad"):
        K.apply_coda(model)
    model = K.apply_coda(tiny_model())
    with pytest.raises(ValueError, match="already patched"):
        K.apply_coda(model)
    with pytest.raises(ValueError, match="model layer 0 is already patched"):
        K.apply_coda(model.model)
    with pytest.raises(ValueError, match="mlp must be one of"):
        K.apply_coda(tiny_model(), mlp="fused")
    model = tiny_model()
    mlp = model.model.layers[0].mlp
    mlp.up_proj = torch.nn.Sequential(mlp.up_proj)  # an adapter-like wrapper
    with pytest.raises(ValueError, match="mlp.up_proj is Sequential, not a plain nn.Linear"):
        K.apply_coda(model)


@needs_transformers
def test_pretraining_tp_is_ignored_as_transformers_does_cpu(exact):
    """transformers 5's Llama ignores config.pretraining_tp (no tensor-parallel slicing in its
    modeling code), so the patched model equals the unpatched one for any value."""
    import transformers.models.llama.modeling_llama as modeling

    assert "pretraining_tp" not in Path(modeling.__file__).read_text()
    ref = tiny_model(torch.float64, pretraining_tp=2)
    model = K.apply_coda(copy.deepcopy(ref))
    ids = tokens()
    torch.testing.assert_close(loss_and_grads(model, ids)[0], loss_and_grads(ref, ids)[0], rtol=1e-6, atol=0)


@needs_transformers
def test_forward_off_cuda_raises_cpu():
    """Without the stand-ins the ops refuse CPU tensors: a patched model on the CPU raises."""
    model = K.apply_coda(tiny_model())
    with pytest.raises(ValueError, match="CUDA"):
        model(tokens(), labels=tokens())


# --------------------------------------------------------------------------- GPU

GPU_CONFIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=2,
    num_attention_heads=16,
    num_key_value_heads=4,
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    attn_implementation="sdpa",
)


def _need_kernels(fused_lm_head: bool):
    need = set(KERNELS) | ({"gemm_cross_entropy", "cross_entropy_bwd"} if fused_lm_head else set())
    missing = need - set(K.accepted())
    if missing:
        pytest.skip(f"kernels not accepted yet: {sorted(missing)}")


def _gpu_models(head_dim: int):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**GPU_CONFIG, head_dim=head_dim)
    with torch.device("cuda"):
        low = transformers.LlamaForCausalLM._from_config(cfg, dtype=BF16)  # inv_freq stays fp32
    with torch.no_grad():
        for name, p in low.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return low, copy.deepcopy(low).float()


GPU_CASES = [(hd, "eager", fused) for hd in (64, 128) for fused in (False, True)] + [
    (64, "torch.compile", False),
    (128, "torch.compile", True),
    (64, "checkpointing", False),
    (128, "checkpointing", True),
]


@needs_transformers
@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, mode, fused_lm_head", GPU_CASES)
def test_patched_llama_within_the_bf16_budget_on_gpu(head_dim, mode, fused_lm_head):
    """2 layers, hidden 1024, 16 / 4 heads, vocab 32000, 2 x 512 tokens: the patched model's
    loss and every gradient within twice the standard bf16 model's error against the fp32
    model from the same bf16 weights (loss: or half a bf16 ulp); logits in eval mode too."""
    _need_kernels(fused_lm_head)
    low, ref = _gpu_models(head_dim)
    model = K.apply_coda(copy.deepcopy(low), fused_lm_head=fused_lm_head)
    if mode == "checkpointing":
        enable_checkpointing(model)
    run = torch.compile(model) if mode == "torch.compile" else model
    ids = tokens(B=2, S=512, V=GPU_CONFIG["vocab_size"]).cuda()
    r, s = loss_and_grads(ref, ids), loss_and_grads(low, ids)
    bf16_budget_check(loss_and_grads(run, ids), s, r)
    if mode == "eager":
        for m in (model, low, ref):
            m.eval()
        with torch.no_grad():
            got, want, std = (m(ids).logits.float() for m in (model, ref, low))
        assert (got - want).abs().max() <= 2 * (std - want).abs().max() + 1e-6


@needs_transformers
@pytest.mark.gpu
def test_patched_layer_compiles_without_graph_breaks_on_gpu():
    _need_kernels(False)
    low, _ = _gpu_models(64)
    model = K.apply_coda(low)
    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True)
    ids = tokens(B=1, S=256, V=GPU_CONFIG["vocab_size"]).cuda()
    run(ids, labels=ids).loss.backward()


# --------------------------------------------------------------------------- benchmarks/hf_train.py


def tiny_hf_train(monkeypatch):
    """benchmarks/hf_train.py on the CPU at tiny widths (every shape, vocabulary 256),
    compiled with aot_eager."""
    import functools

    from glue_helpers import module_from_file

    T = module_from_file(ROOT / "benchmarks" / "hf_train.py", "coda_hf_train")
    monkeypatch.setattr(T, "DEVICE", "cpu")
    monkeypatch.setattr(T, "SEQ", 32)
    monkeypatch.setattr(T, "COMPILE", functools.partial(torch.compile, backend="aot_eager"))
    for fam in T.FAMILIES.values():
        monkeypatch.setitem(fam, "vocab", 256)
    for name, hd, tied in (
        ("llama3-1b", 64, True),
        ("llama3-8b", 128, False),
        ("qwen3-1.7b", 128, True),
        ("qwen3-8b", 128, False),
    ):
        monkeypatch.setitem(
            T.SHAPES,
            name,
            dict(
                hidden_size=128,
                intermediate_size=256,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=hd,
                tie_word_embeddings=tied,
            ),
        )
    return T


@pytest.mark.slow
@needs_transformers
def test_hf_train_speed_runs_on_a_tiny_model_cpu(baseline, monkeypatch, capsys):
    """The benchmark's --speed path (main-process variants, the table and the verdict) on the
    CPU: every variant timed, none failed."""
    T = tiny_hf_train(monkeypatch)
    args = T.argparse.Namespace(
        layers=1,
        shape=["llama3-8b"],
        model="llama",
        all=False,
        quick=False,
        no_liger=True,
        warmup=1,
        steps_timed=1,
        rounds=1,
    )
    res = {}
    T.speed(args, res)
    torch._dynamo.reset()
    r = res["speed"]["llama3-8b"]
    names = [n for n, _, _ in T.speed_variants(args)]
    assert all(isinstance(r[n], dict) and r[n]["tokens_per_s"] > 0 for n in names), r
    T.print_speed(res["speed"])
    out = capsys.readouterr().out
    assert "| coda + compile |" in out and "coda + compile is" in out


@pytest.mark.slow
@needs_transformers
def test_hf_train_parity_runs_on_a_tiny_model_cpu(baseline, monkeypatch):
    """The benchmark's --parity path end to end on the CPU (tiny widths, 6 steps, stand-ins,
    aot_eager): five runs, per-step losses and grad norms, a summary with the band."""
    T = tiny_hf_train(monkeypatch)
    args = T.argparse.Namespace(layers=2, n_batches=2, batch=2, steps=6, model="llama")
    res = {}
    T.parity(args, res)
    torch._dynamo.reset()
    runs = res["parity"]["runs"]
    assert all(isinstance(r, dict) and len(r["loss"]) == 6 for r in runs.values()), runs
    assert runs["unpatched eager"]["loss"][-1] < runs["unpatched eager"]["loss"][0]  # it learns
    summary = res["parity"]["summary"]
    for metric in ("loss", "grad_norm"):
        assert set(summary[metric]) == {
            "band: unpatched eager vs compile",
            f"band: unpatched eager vs {T.NO_RPR[10:]}",
            "coda eager vs unpatched eager",
            "coda compile vs unpatched compile",
        }
        assert summary[metric]["coda eager vs unpatched eager"]["max"] < 0.05 * max(runs["unpatched eager"][metric])
    T.print_parity(res["parity"])


@pytest.mark.slow
@needs_transformers
def test_hf_train_profile_runs_on_a_tiny_model_cpu(baseline, monkeypatch, capsys):
    """The benchmark's --profile path on the CPU (the kernel profile replaced by fixed
    kernel rows): every variant, incl. ``mlp="swiglu"``, timed and split by kernel class."""
    T = tiny_hf_train(monkeypatch)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    rows = [
        {"kernel": "nvjet_tst_128x256_h_bz_coopA", "us/step": 300.0, "calls/step": 4},
        {"kernel": "kernel_cutlass_GemmMod_sm90_0", "us/step": 200.0, "calls/step": 2},
        {"kernel": "cudnn::fusion::compute_dot_do_o", "us/step": 50.0, "calls/step": 1},
        {"kernel": "triton_red_fused_add_mean_pow_0", "us/step": 25.0, "calls/step": 3},
    ]

    def fake_profile(run, steps):
        run()
        return {"top": rows, "kernels/step": 10.0, "idle us/step": 7.0}

    monkeypatch.setattr(T, "_kernel_profile", fake_profile)
    args = T.argparse.Namespace(layers=1, warmup=1, steps_timed=1, rounds=1)
    r = T.profile_shape(args, "llama3-8b")
    torch._dynamo.reset()
    for name, *_ in T.PROFILE_VARIANTS:
        v = r[name]
        assert isinstance(v, dict), v
        assert (v["gemm us"], v["attention us"], v["other us"], v["idle us"]) == (500.0, 50.0, 25.0, 7.0)
        assert [k["kernel"] for k in v["gemm top"]] == [rows[0]["kernel"], rows[1]["kernel"]]
    T.print_profile({"llama3-8b": r})
    assert "| coda, mlp=swiglu + compile |" in capsys.readouterr().out

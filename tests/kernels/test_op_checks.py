"""The ops' argument checks, cross-entropy's ignore_index, frozen-weight backwards and how
the checks behave under torch.compile (CPU; the specs' PyTorch baselines stand in for the
kernels, with the layout checks on unless a test says otherwise).

What the package docstring promises and these tests hold it to: bf16 contiguous 2-D
activations and weights, fp32 ``rstd`` / ``inv_freq``, int64 ``positions`` / ``target``,
16-byte rows (K, N, V, I and the QKV width multiples of 8), ``ValueError`` naming the op
and the argument otherwise; a GPU other than sm_90 refused by the kernel ops; rows with
``target == ignore_index`` contributing nothing; no wgrad / dgrad GEMM for inputs that do
not require grad; checks that never make torch.compile specialize on M.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from glue_helpers import entry, reference_module, use_standins
from test_cross_entropy_ops import ce_inputs
from test_cross_entropy_ops import standins as ce_standins
from test_rmsnorm_ops import deferred_inputs as rms_deferred_inputs
from test_rmsnorm_ops import deferred_mlp_inputs as rms_deferred_mlp_inputs
from test_rmsnorm_ops import residual_inputs, rmsnorm_linear_inputs
from test_rmsnorm_ops import standins as rms_standins
from test_rope_ops import CONSTS, qkv_inputs
from test_rope_ops import deferred_inputs as rope_deferred_inputs
from test_rope_ops import standins as rope_standins
from test_swiglu_op import standins as swiglu_standins
from torch.utils.flop_counter import FlopCounterMode

import coda_agent.kernels as K
from coda_agent.kernels import _registry

BF16 = torch.bfloat16


def all_standins() -> dict:
    sbr = entry(
        reference_module("swiglu_bwd_rms").baseline, ["dout", "w_down", "preact"], ["dpreact", "postact", "zdz"]
    )
    return {
        **swiglu_standins(),
        **rms_standins("baseline"),
        **rope_standins("baseline"),
        **ce_standins(),
        "swiglu_bwd_rms": sbr,
    }


def chained_mlp_inputs(dtype=BF16, M=24, D=16, I=16):
    """x2, normed_w2, rstd2 (fp32), g2, w1 (2I, D), w_down (D, I) of chained_mlp."""
    x2, rstd, w1 = rms_deferred_inputs("cpu", dtype, M=M, K=D, N=2 * I)
    gamma = residual_inputs("cpu", dtype, M=M, K=D, N=D)[3]
    return [x2, x2 * gamma, rstd, gamma, w1, rms_deferred_mlp_inputs("cpu", dtype, M=M, K=D, N=2 * I)[3]]


def chained_qkv_inputs(dtype=BF16):
    """x, normed_w, rstd, gamma, w_qkv, positions, inv_freq of chained_qkv_rope (K = 16)."""
    a, rstd, w_qkv, positions, inv_freq = rope_deferred_inputs("cpu", dtype, K=16)
    gamma = torch.ones(16, dtype=dtype)
    return [a, a * gamma, rstd, gamma, w_qkv, positions, inv_freq]


def swiglu_inputs(dtype=BF16, M=24, Kd=16, I=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(M, Kd, generator=g).to(dtype),
        (torch.randn(2 * I, Kd, generator=g) / Kd**0.5).to(dtype),
        (torch.randn(Kd, I, generator=g) / I**0.5).to(dtype),
    ]


# op name -> (op, aligned bf16 inputs (K = 16, output widths multiples of 8), keyword constants)
def _ops() -> dict:
    return {
        "swiglu": (K.swiglu, swiglu_inputs(), {}),
        "residual_rmsnorm": (K.residual_rmsnorm, residual_inputs("cpu", BF16, K=16, N=32), {}),
        "rmsnorm_linear": (K.rmsnorm_linear, rmsnorm_linear_inputs("cpu", BF16, K=16, N=32), {}),
        "deferred_rmsnorm_linear": (K.deferred_rmsnorm_linear, rms_deferred_inputs("cpu", BF16, K=16, N=32), {}),
        "deferred_rmsnorm_swiglu": (K.deferred_rmsnorm_swiglu, rms_deferred_inputs("cpu", BF16, K=16, N=32), {}),
        "deferred_rmsnorm_swiglu_mlp": (
            K.deferred_rmsnorm_swiglu_mlp,
            rms_deferred_mlp_inputs("cpu", BF16, K=16, N=32),
            {},
        ),
        "qkv_rope": (K.qkv_rope, qkv_inputs("cpu", BF16, K=16), CONSTS),
        "deferred_rmsnorm_qkv_rope": (K.deferred_rmsnorm_qkv_rope, rope_deferred_inputs("cpu", BF16, K=16), CONSTS),
        "rope_bwd_op": (K.rope_bwd_op, qkv_inputs("cpu", BF16, K=16), CONSTS),
        "linear_cross_entropy": (K.linear_cross_entropy, ce_inputs("cpu", BF16, K=16, V=40), {}),
        "chained_qkv_rope": (K.chained_qkv_rope, chained_qkv_inputs(), CONSTS),
        "chained_out_proj": (K.chained_out_proj, residual_inputs("cpu", BF16, K=16, N=16), {}),
        "chained_mlp": (K.chained_mlp, chained_mlp_inputs(), {}),
    }


OP_NAMES = list(_ops())


def _params(op) -> list[str]:
    fn = getattr(op, "_init_fn", op)  # a torch.library custom op: its Python function
    return [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]


@pytest.fixture
def checked(monkeypatch):
    """Stand-ins for every kernel, device check off (CPU), layout checks on."""
    return use_standins(monkeypatch, all_standins(), check_layout=True)


@pytest.mark.parametrize("name", OP_NAMES)
def test_aligned_bf16_inputs_pass_the_checks(name, checked):
    op, args, consts = _ops()[name]
    out = op(*args, **consts)
    outs = out if isinstance(out, tuple) else (out,)
    if name == "chained_qkv_rope":
        outs = outs[:1]  # (qkv, resid_port): the port's values are unspecified
    assert all(torch.isfinite(o.float()).all() for o in outs if o is not None)  # chained_mlp: (x3, None, None)
    assert sum(checked.values()) >= 1  # a stand-in kernel ran


@pytest.mark.parametrize("name", OP_NAMES)
def test_a_float32_or_strided_bf16_tensor_is_refused_by_name(name, checked):
    op, args, consts = _ops()[name]
    bf16_2d = [(i, p) for i, p in enumerate(_params(op)[: len(args)]) if args[i].dtype == BF16 and args[i].dim() == 2]
    assert bf16_2d, "every op has a 2-D bf16 operand"
    for i, pname in bf16_2d:
        bad = list(args)
        bad[i] = args[i].float()
        with pytest.raises(ValueError, match=f"^{name}: {pname} must be torch.bfloat16, got torch.float32$"):
            op(*bad, **consts)
        bad[i] = args[i].t().contiguous().t()  # same shape and values, column-major
        with pytest.raises(ValueError, match=f"^{name}: {pname} must be contiguous .*pass {pname}.contiguous"):
            op(*bad, **consts)
    assert sum(checked.values()) == 0  # nothing reached a kernel


def test_rmsnorm_linear_takes_a_strided_gamma(checked):
    """gamma meets torch code only in rmsnorm_linear (h * gamma): an expanded scalar or a
    strided slice is fine, and its gradient reaches the base tensor."""
    op, (h, gamma, w), _ = _ops()["rmsnorm_linear"]
    want = op(h, gamma.contiguous(), w)
    scalar = torch.ones((), dtype=BF16, requires_grad=True)
    got = op(h, scalar.expand(gamma.shape[0]), w)
    torch.testing.assert_close(got, op(h, torch.ones_like(gamma), w))
    got.float().sum().backward()
    assert scalar.grad is not None and torch.isfinite(scalar.grad)
    wide = torch.stack((gamma, gamma), dim=1)  # (D, 2): column 0 has stride 2
    torch.testing.assert_close(op(h, wide[:, 0], w), want)


@pytest.mark.parametrize(
    "name, arg, bad_dtype, want",
    [
        ("deferred_rmsnorm_linear", "rstd", BF16, torch.float32),
        ("deferred_rmsnorm_swiglu", "rstd", BF16, torch.float32),
        ("deferred_rmsnorm_qkv_rope", "rstd", BF16, torch.float32),
        ("chained_qkv_rope", "rstd", BF16, torch.float32),
        ("chained_mlp", "rstd2", BF16, torch.float32),
        ("chained_qkv_rope", "gamma", torch.float32, BF16),
        ("chained_out_proj", "g2", torch.float32, BF16),
        ("qkv_rope", "inv_freq", BF16, torch.float32),  # a model cast with .to(bfloat16)
        ("deferred_rmsnorm_qkv_rope", "inv_freq", BF16, torch.float32),
        ("rope_bwd_op", "inv_freq", BF16, torch.float32),
        ("qkv_rope", "positions", torch.int32, torch.int64),
        ("rope_bwd_op", "positions", torch.float32, torch.int64),
        ("linear_cross_entropy", "target", torch.int32, torch.int64),
    ],
)
def test_vectors_of_the_wrong_dtype_are_refused(name, arg, bad_dtype, want, checked):
    op, args, consts = _ops()[name]
    i = _params(op).index(arg)
    bad = list(args)
    bad[i] = args[i].to(bad_dtype)
    with pytest.raises(ValueError, match=f"^{name}: {arg} must be {want}, got {bad_dtype}$"):
        op(*bad, **consts)


def test_rows_that_are_not_16_bytes_are_refused(checked):
    with pytest.raises(
        ValueError,
        match="rmsnorm_linear: h's rows must be a multiple of 16 bytes "
        r"\(8 torch.bfloat16 elements\) for TMA, got 20 columns",
    ):
        K.rmsnorm_linear(*rmsnorm_linear_inputs("cpu", BF16, K=20, N=32))
    with pytest.raises(
        ValueError,
        match=r"rmsnorm_linear: N \(w's rows, the output's columns\) = 28 must be a "
        "multiple of 8",
    ):
        K.rmsnorm_linear(*rmsnorm_linear_inputs("cpu", BF16, K=16, N=28))
    with pytest.raises(ValueError, match="deferred_rmsnorm_linear: N .* = 36 must be a multiple of 8"):
        K.deferred_rmsnorm_linear(*rms_deferred_inputs("cpu", BF16, K=16, N=36))
    with pytest.raises(ValueError, match=r"deferred_rmsnorm_swiglu: I \(half of w1's rows.*\) = 18 must be"):
        K.deferred_rmsnorm_swiglu(*rms_deferred_inputs("cpu", BF16, K=16, N=36))
    with pytest.raises(ValueError, match="swiglu: w_down's rows must be a multiple of 16 bytes"):
        K.swiglu(*swiglu_inputs(I=20))
    with pytest.raises(ValueError, match=r"linear_cross_entropy: V \(w_vocab's rows\) = 50257 must be a multiple"):
        K.linear_cross_entropy(*ce_inputs("cpu", BF16, K=16, V=50257))
    odd = {"n_q_heads": 3, "n_kv_heads": 1, "head_dim": 6}  # (3 + 2) * 6 = 30 columns
    with pytest.raises(ValueError, match=r"qkv_rope: \(n_q_heads \+ 2 \* n_kv_heads\) \* head_dim .* = 30 must be"):
        K.qkv_rope(*qkv_inputs("cpu", BF16, consts=odd, K=16), **odd)
    assert sum(checked.values()) == 0


def test_swiglu_checks_shapes(checked):
    x, w1, w_down = swiglu_inputs()
    with pytest.raises(ValueError, match=r"swiglu: need 2-D .*flatten batch and sequence into M"):
        K.swiglu(x.view(2, 12, 16), w1, w_down)
    with pytest.raises(
        ValueError,
        match=r"swiglu: need x \(M, K\), w1 \(2I, K\), w_down \(K, I\).*: "
        r"w1.shape\[0\] = \d+ is not 2 \* w_down.shape\[1\] = \d+$",
    ):
        K.swiglu(x, w1[:-8], w_down)
    with pytest.raises(ValueError, match=r"w_down.shape\[0\] = 8 is not x's K = 16$"):
        K.swiglu(x, w1, w_down[:8])
    with pytest.raises(ValueError, match="swiglu: x is empty"):
        K.swiglu(x[:0], w1, w_down)


def test_a_gpu_that_is_not_sm90_is_refused(monkeypatch):
    monkeypatch.setattr(_registry, "_device_info", lambda index: ("NVIDIA A100-SXM4-80GB", (8, 0)))
    with pytest.raises(
        ValueError,
        match=r"^gemm_rmsnorm: the fused kernels are built for Hopper \(sm_90a, compute "
        r"capability 9.0\); cuda:1 is NVIDIA A100-SXM4-80GB with capability 8.0$",
    ):
        _registry._check_arch("gemm_rmsnorm", torch.device("cuda", 1))
    monkeypatch.setattr(_registry, "_device_info", lambda index: ("NVIDIA H200", (9, 0)))
    _registry._check_arch("gemm_rmsnorm", torch.device("cuda", 0))  # passes
    _registry._check_arch("gemm_rmsnorm", torch.device("cpu"))  # the stand-ins' device


def test_kernel_ops_refuse_strided_and_misaligned_tensors(monkeypatch):
    calls = use_standins(monkeypatch, all_standins())
    dout, w_down = torch.randn(8, 16), torch.randn(16, 8)
    preact = torch.randn(8, 16)
    with pytest.raises(ValueError, match=r"swiglu_bwd kernel: w_down \(argument 1\) must be contiguous"):
        K.swiglu_bwd_op(dout, w_down.t().contiguous().t(), preact)
    shifted = torch.randn(8 * 16 + 1)[1:].view(8, 16)  # contiguous, 4 bytes past 16-byte alignment
    with pytest.raises(
        ValueError,
        match=r"swiglu_bwd kernel: dout \(argument 0, shape \(8, 16\)\) starts 4 bytes past "
        r"a 16-byte boundary \(storage offset 1\).*pass a .clone\(\)",
    ):
        K.swiglu_bwd_op(shifted, w_down, preact)
    assert calls["swiglu_bwd"] == 0
    K.swiglu_bwd_op(shifted.clone(), w_down, preact)
    assert calls["swiglu_bwd"] == 1


def test_kernel_argument_names_come_from_the_entry_and_never_mask_the_error(monkeypatch):
    use_standins(monkeypatch, all_standins())
    assert _registry._arg_name("swiglu_bwd", 2) == "preact (argument 2)"
    assert _registry._arg_name("swiglu_bwd", 2, "shape (8, 16)") == "preact (argument 2, shape (8, 16))"
    assert _registry._arg_name("swiglu_bwd", 7) == "argument 7"  # past the signature
    assert _registry._arg_name("no_such_kernel", 0, "shape (1,)") == "argument 0 (shape (1,))"  # load raises


def test_a_cpu_tensor_is_named_by_the_entrys_argument(monkeypatch):
    """``swiglu_fwd_op(x_cpu, w_cpu)`` says which argument is where, not "got cpu, cpu": the
    device error names each argument as the entry does."""
    use_standins(monkeypatch, all_standins())
    monkeypatch.setattr(K, "_check_device", _registry._check_device)
    dout, w_down, preact = torch.randn(8, 16), torch.randn(16, 8), torch.randn(8, 16)
    with pytest.raises(
        ValueError,
        match=r"^swiglu_bwd kernel: the fused kernels need all tensors on one CUDA "
        r"\(Hopper\) device, got dout=cpu, w_down=cpu, preact=cpu$",
    ):
        _registry.run_kernel("swiglu_bwd", dout, w_down, preact)


def test_kernel_errors_count_every_positional_argument(monkeypatch):
    """A non-tensor positional argument before a tensor keeps the names aligned: the index
    is the entry's argument position, not the tensor's rank among the tensors."""

    def mixed(x, n_heads, w):
        return (x,)

    use_standins(monkeypatch, {"mixed": mixed})
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"^mixed kernel: w \(argument 2\) must be contiguous"):
        _registry.run_kernel("mixed", x, 2, torch.randn(8, 4).t())


def test_rms_bwd_op_checks_its_arguments(checked):
    from test_rmsnorm_ops import rms_bwd_inputs

    args = rms_bwd_inputs("cpu", BF16)
    K.rms_bwd_op(*args)  # valid: reaches the stand-in
    assert checked["rms_bwd"] == 1
    bad = list(args)
    bad[0] = args[0].float()
    with pytest.raises(ValueError, match="^rms_bwd_op: dy must be torch.bfloat16, got torch.float32$"):
        K.rms_bwd_op(*bad)
    bad = list(args)
    bad[5] = args[5][:-1]
    with pytest.raises(ValueError, match=r"^rms_bwd_op: need dy \(M, N\), w \(N, D\).*\(23,\)"):
        K.rms_bwd_op(*bad)
    bad = list(args)
    bad[4] = args[4].to(BF16)
    with pytest.raises(ValueError, match="^rms_bwd_op: rstd must be torch.float32, got torch.bfloat16$"):
        K.rms_bwd_op(*bad)
    assert checked["rms_bwd"] == 1


# --------------------------------------------------------------------------- cross-entropy ignore_index


def _ce_case(ignore_index=-100):
    h, w, t = ce_inputs("cpu", torch.float32, M=12, K=16, V=40)
    t = t.clone()
    t[[1, 4, 5]] = ignore_index
    return h.requires_grad_(), w.requires_grad_(), t


def test_ignore_index_rows_give_zero_loss_and_no_gradient(monkeypatch):
    use_standins(monkeypatch, ce_standins())
    h, w, t = _ce_case()
    loss = K.linear_cross_entropy(h, w, t)
    want = F.cross_entropy(h @ w.T, t, reduction="none")  # ignore_index=-100: 0 there
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert loss[[1, 4, 5]].eq(0).all() and loss[[0, 2, 3]].gt(0).all()
    dh, dw = torch.autograd.grad(loss.sum() / (t != -100).sum(), (h, w))
    hr, wr = h.detach().requires_grad_(), w.detach().requires_grad_()
    dh_ref, dw_ref = torch.autograd.grad(F.cross_entropy(hr @ wr.T, t), (hr, wr))  # "mean" over kept rows
    torch.testing.assert_close(dh, dh_ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-4, atol=1e-6)
    assert dh[[1, 4, 5]].eq(0).all()


def test_a_custom_ignore_index_and_an_out_of_range_target(monkeypatch):
    use_standins(monkeypatch, ce_standins())
    h, w, t = _ce_case(ignore_index=7)
    loss = K.linear_cross_entropy(h, w, t, ignore_index=7)
    torch.testing.assert_close(loss, F.cross_entropy(h @ w.T, t, reduction="none", ignore_index=7))
    t[2] = 40  # V = 40: out of range
    with pytest.raises(RuntimeError, match="a target is outside"):
        K.linear_cross_entropy(h, w, t, ignore_index=7)


@pytest.mark.parametrize("bad", [0.5, "x", True, torch.tensor(-100)])
def test_ignore_index_must_be_an_int(monkeypatch, bad):
    """A float or tensor ignore_index is refused: it would be compared against int64 targets
    silently."""
    use_standins(monkeypatch, ce_standins())
    h, w, t = _ce_case()
    with pytest.raises(ValueError, match=r"linear_cross_entropy: ignore_index must be an int"):
        K.linear_cross_entropy(h, w, t, ignore_index=bad)


def test_a_numpy_integer_ignore_index_is_accepted(monkeypatch):
    """As F.cross_entropy accepts it (np.int64 included)."""
    np = pytest.importorskip("numpy")
    use_standins(monkeypatch, ce_standins())
    h, w, t = _ce_case()
    torch.testing.assert_close(
        K.linear_cross_entropy(h, w, t, ignore_index=np.int64(-100)), K.linear_cross_entropy(h, w, t)
    )


# --------------------------------------------------------------------------- frozen inputs


def _backward_flops(op, args, consts, diff, trainable) -> int:
    """FLOPs (torch's flop counter: 2 m n k per GEMM) of one backward with only the inputs
    at ``trainable`` (indices into ``diff``, the differentiable ones) requiring grad."""
    diff = set(diff)
    args = [a.detach().clone().requires_grad_(i in trainable) if i in diff else a for i, a in enumerate(args)]
    out = op(*args, **consts)
    out = out[0] if isinstance(out, tuple) else out
    with FlopCounterMode(display=False) as fc:
        out.float().sum().backward()
    for i in diff:
        assert (args[i].grad is not None) == (i in trainable), (i, trainable)
    return fc.get_total_flops()


@pytest.mark.parametrize(
    "name, diff, trainable, skipped",
    [
        # swiglu (x, w1, w_down), M=24, K=16, I=24: no dw_down (2 K M I) and no dw1 (2 2I M K)
        ("swiglu", {0, 1, 2}, {0}, 2 * 16 * 24 * 24 + 2 * 48 * 24 * 16),
        # rmsnorm_linear (h, gamma, w), M=24, D=16, N=32: no wgrad dy^T @ RMSNorm(h) (2 N M D)
        ("rmsnorm_linear", {0, 1, 2}, {0, 1}, 2 * 32 * 24 * 16),
        # deferred_rmsnorm_linear (a, rstd, w), only w trains: no dgrad dy @ w (2 M N K)
        ("deferred_rmsnorm_linear", {0, 1, 2}, {2}, 2 * 24 * 32 * 16),
        # qkv_rope (x, w_qkv, positions, inv_freq), N = 32, M=10, K=16: no wgrad (2 N M K)
        ("qkv_rope", {0, 1}, {0}, 2 * 32 * 10 * 16),
        # deferred_rmsnorm_swiglu_mlp (normed_w, rstd, w1, w_down), M=24, K=16, 2I=32: frozen
        # weights: no dw_down (2 K M I) and no dw1 (2 2I M K)
        ("deferred_rmsnorm_swiglu_mlp", {0, 1, 2, 3}, {0, 1}, 2 * 16 * 24 * 16 + 2 * 32 * 24 * 16),
        # chained_mlp (x2, normed_w2, rstd2, g2, w1, w_down), M=24, D=16, I=16, only x2 trains:
        # no dw_down (2 D M I) and no dw1 (2 2I M D)
        ("chained_mlp", {0, 3, 4, 5}, {0}, 2 * 16 * 24 * 16 + 2 * 32 * 24 * 16),
        # chained_qkv_rope (x, normed_w, rstd, gamma, w_qkv, ...), N = 32, M=10, K=16: no wgrad
        ("chained_qkv_rope", {0, 3, 4}, {0, 3}, 2 * 32 * 10 * 16),
        # chained_out_proj (attn, w_o, x, g2), M=24, K=16, D=16: only w_o trains: no dgrad (2 M D K)
        ("chained_out_proj", {0, 1, 2}, {1}, 2 * 24 * 16 * 16),
    ],
)
def test_backward_skips_the_gemms_of_frozen_inputs(name, diff, trainable, skipped, monkeypatch):
    use_standins(monkeypatch, all_standins())
    op, args, consts = _ops()[name]
    args = [a.float() if a.dtype == BF16 else a for a in args]
    full = _backward_flops(op, args, consts, diff, diff)
    assert full - _backward_flops(op, args, consts, diff, trainable) == skipped


# --------------------------------------------------------------------------- torch.compile


def test_checks_do_not_specialize_compiled_graphs_on_m(checked):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()

    def block(x, w_o, residual, gamma, w_qkv, positions, inv_freq):
        _resid, normed_w, rstd = K.residual_rmsnorm(x, w_o, residual, gamma)
        return K.deferred_rmsnorm_qkv_rope(normed_w, rstd, w_qkv, positions, inv_freq, **CONSTS)

    compiled = torch.compile(block, backend=counter)
    for m in (16, 24, 40, 56, 72, 88):
        x, w_o, residual, gamma = residual_inputs("cpu", BF16, M=m, K=16, N=16)
        _, _, w_qkv, positions, inv_freq = rope_deferred_inputs("cpu", BF16, M=m, K=16)
        out = compiled(x, w_o, residual, gamma, w_qkv, positions, inv_freq)
        assert out.shape == (m, 32)
    assert counter.frame_count == 2  # static, then one dynamic-M graph (was one per M)
    torch._dynamo.reset()


def test_checks_trace_with_dynamic_head_counts_in_fullgraph(checked):
    torch._dynamo.reset()
    args = qkv_inputs("cpu", BF16, K=16)
    compiled = torch.compile(lambda *a, **c: K.qkv_rope(*a, **c), backend="eager", fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(*args, **CONSTS), K.qkv_rope(*args, **CONSTS))
    torch._dynamo.reset()

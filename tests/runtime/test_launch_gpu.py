"""Launchers on the GPU: the direct path gives the module's own results bit for bit, under
eager, ``torch.compile(fullgraph=True)`` and CUDA-graph capture (``gpu`` marker: skipped
without an sm_90 GPU, never faked).

Rule shown: a launcher is a cheaper launch of the same binary, never another computation
(runtime/launch.py's docstring).
"""

from __future__ import annotations

import pytest
import torch

from coda_agent.runtime.launch import bind_entry

pytestmark = pytest.mark.gpu

TRAINING = [
    "swiglu_fwd",
    "swiglu_bwd",
    "swiglu_bwd_rms",
    "gemm_rmsnorm_swiglu",
    "gemm_residual_partial_rms",
    "gemm_rmsnorm_rope",
    "rms_bwd",
    "rope_bwd",
    "gemm_rmsnorm",
]


def _inputs(kernel: str):
    from coda_agent.verifier.gpu.inputs import make_inputs
    from coda_agent.verifier.spec import load_spec
    from coda_agent.verifier.workspace import find_root

    loaded = load_spec(find_root(None) / "kernel_specs" / kernel)
    dims = dict(loaded.spec.shapes.benchmark[0].dims)
    dims["M"] = 1000  # a ragged M: partial tiles, as training sees at the end of a batch
    ins = make_inputs(loaded, dims, 7, "cuda")
    return [ins[t.name] for t in loaded.spec.entry.inputs], loaded.spec.constants_of(dims)


def _same(a, b):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x, y), f"max |diff| {(x.float() - y.float()).abs().max().item()}"


@pytest.mark.parametrize("kernel", TRAINING)
def test_launcher_is_bitwise_the_module_entry(kernel):
    from coda_agent import kernels

    module = kernels.load(kernel)
    args, consts = _inputs(kernel)
    own = getattr(module, kernel)(*args, **consts)
    fn, launchers = bind_entry(module, kernel)
    _same(fn(*args, **consts), own)
    _same(fn(*args, **consts), own)  # the cached plan, second call
    assert sum(lc.stats["direct"] for lc in launchers.values()) >= 2
    assert sum(lc.stats["delegated"] for lc in launchers.values()) == 0


@pytest.mark.parametrize("kernel", ["swiglu_fwd", "gemm_residual_partial_rms", "rms_bwd"])
def test_launcher_under_cuda_graph_capture(kernel):
    from coda_agent.kernels import _registry

    args, consts = _inputs(kernel)
    fn, _ = _registry.entry(kernel)
    want = fn(*args, **consts)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*args, **consts)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = fn(*args, **consts)
    g.replay()
    torch.cuda.synchronize()
    _same(got, want)


def test_training_op_under_compile_fullgraph_matches_eager():
    import coda_agent.kernels as K

    args, _ = _inputs("swiglu_fwd")
    eager = K.swiglu_fwd_op(*args)
    compiled = torch.compile(lambda x, w: K.swiglu_fwd_op(x, w), fullgraph=True)(*args)
    _same(compiled, eager)


def test_standard_route_matches_the_fused_kernel_numerically(monkeypatch):
    """CODA_ROUTE=standard sends a call to the compiled standard path: same outputs up to
    bf16 rounding of the elementwise pass."""
    import coda_agent.kernels as K
    from coda_agent.kernels import _dispatch, _standard

    _standard._COMPILED.pop("swiglu_fwd", None)
    args, _ = _inputs("swiglu_fwd")
    fused = K.swiglu_fwd_op(*args)
    monkeypatch.setenv("CODA_ROUTE", "standard")
    _dispatch.clear()
    std = K.swiglu_fwd_op(*args)
    assert "swiglu_fwd" in _standard._COMPILED  # the standard path ran
    monkeypatch.setenv("CODA_ROUTE", "table")
    _dispatch.clear()
    for f, s in zip(fused, std, strict=True):
        err = (f.float() - s.float()).abs().max().item()
        assert err <= 0.02 * s.float().abs().max().item(), err

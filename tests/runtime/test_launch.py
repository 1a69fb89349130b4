"""Launchers and ahead-of-time builds on the CPU (runtime/launch.py, verifier/tune/build.py).

The ``compile`` tests compile real sm_90a kernels on the CPU (``--compile``; CI runs them):
a launcher plans a kernel's epilogue call with its operands, and a build job fills the
kernel cache without a GPU.
"""

from __future__ import annotations

import types

import pytest

from coda_agent.runtime import launch
from coda_agent.verifier.tune import build, space
from coda_agent.verifier.tune.tune import choose


class _Mod:
    """Stands in for an EpiMod: records how it was called."""

    def __init__(self):
        self.calls = []

    def __call__(self, A, B, C=None, **kw):
        self.calls.append(kw)
        return {"D": A}


def test_unmodelled_keywords_go_to_the_mod_with_the_resolved_config():
    import torch

    mod = _Mod()
    lc = launch.Launcher(mod, "epi", config_for=lambda *a: "TUNED")
    A, B = torch.zeros(4, 8), torch.zeros(8, 2)
    lc(A, B, cu_seqlens_m=torch.zeros(2, dtype=torch.int32), config="OWN")
    assert mod.calls[-1]["config"] == "TUNED"  # the table wins over the caller's config
    assert lc.stats == {"planned": 0, "direct": 0, "delegated": 1}
    assert "cu_seqlens_m" in launch._DELEGATED_KWARGS and "config" not in launch._DELEGATED_KWARGS


def test_compile_only_never_runs_an_unmodelled_call():
    import torch

    lc = launch.Launcher(_Mod(), "epi", compile_only=True)
    with pytest.raises(RuntimeError, match="cannot be compiled ahead of time"):
        lc(torch.zeros(4, 8), torch.zeros(8, 2), A_idx=torch.zeros(4, dtype=torch.int32))


def test_bind_entry_replaces_mods_in_a_copy_only():
    from quack.epilogue.frontend import EpiMod

    m = types.ModuleType("k")
    mod = object.__new__(EpiMod)
    exec("def helper(x):\n    return epi(x)\n\ndef k(x):\n    return helper(x)\n", vars(m))
    m.epi = mod
    fn, launchers = launch.bind_entry(m, "k")
    assert set(launchers) == {"epi"} and launchers["epi"].mod is mod
    assert m.epi is mod  # the module keeps its EpiMod (quack's cache identity)
    assert fn.__globals__["epi"] is launchers["epi"]
    assert fn.__globals__["helper"].__globals__ is fn.__globals__
    with pytest.raises(AttributeError, match="defines no function 'nope'"):
        launch.bind_entry(m, "nope")


def test_space_stage1_is_legal_and_quick_is_a_subset():
    from coda_agent import kernels
    from coda_agent.runtime.launch import epilogue_mods

    for k in ("swiglu_fwd", "rms_bwd"):
        (mod,) = epilogue_mods(kernels.load(k)).values()
        full, quick = space.stage1(mod, "full"), space.stage1(mod, "quick")
        assert set(quick) < set(full) and len(quick) >= 6
        assert all(space.legal(mod, c) and not c.is_dynamic_persistent for c in full)
        assert any(c.cluster_m == c.cluster_n == 1 for c in full)  # the 1x1 clusters quack's list lacks
        assert all(c.is_dynamic_persistent for c in space.stage2(quick[:2]))
    with pytest.raises(ValueError, match="--space"):
        space.stage1(mod, "huge")


def _rec(kind, **kw):
    return {"kind": kind, "shape": "s", **kw}


def test_choose_keeps_the_own_config_unless_the_best_wins_by_more_than_one_percent():
    site = {"epilogue": "e", "bucket": "b", "default": {"tile_m": 128}}
    recs = [
        _rec("sites", call="c", sites=[site]),
        _rec("default", ms=1.0),
        _rec("baseline", baseline="standard", ms=1.2),
        _rec("cublas", epilogue="e", bucket="b", ms=0.9),
        _rec("time", epilogue="e", bucket="b", config="x", config_fields={"tile_m": 256}, ms=0.995),
    ]
    (row,) = choose(recs)
    assert row["tuned"] == {"tile_m": 128} and not row["changed"] and row["tuned_ms"] == 1.0
    (row,) = choose(recs + [_rec("time", epilogue="e", bucket="b", config="y", config_fields={"tile_m": 64}, ms=0.9)])
    assert row["tuned"] == {"tile_m": 64} and row["changed"] and row["tuned_ms"] == 0.9
    assert row["standard_ms"] == 1.2 and row["cublas_ms"] == 0.9 and row["call"] == "c"


def test_build_job_inputs_have_the_drawn_shapes_and_dtypes_without_drawing():
    from coda_agent.verifier.gpu.inputs import make_inputs
    from coda_agent.verifier.spec import load_spec
    from coda_agent.verifier.workspace import find_root

    for kernel in ("rms_bwd", "gemm_cross_entropy", "gemm_rope"):
        loaded = load_spec(find_root(None) / "kernel_specs" / kernel)
        dims = dict(loaded.spec.shapes.correctness[0].dims)
        drawn = make_inputs(loaded, dims, 0, "cpu")
        got = build.job_inputs(loaded, dims)
        assert list(got) == [t.name for t in loaded.spec.entry.inputs]
        for name, t in got.items():
            assert (t.shape, t.dtype, t.device.type) == (drawn[name].shape, drawn[name].dtype, "cpu"), (kernel, name)
            assert t.is_contiguous()
            if not t.dtype.is_floating_point:
                assert not t.any()
    # at a llama3-8b shape nothing is drawn: uninitialised storage of the full size
    loaded = load_spec(find_root(None) / "kernel_specs" / "swiglu_fwd")
    big = next(s for s in loaded.spec.shapes.benchmark if "8b" in s.name)
    got = build.job_inputs(loaded, dict(big.dims))
    assert max(t.numel() for t in got.values()) >= 4096 * 14336


@pytest.mark.compile
def test_a_build_job_compiles_a_kernel_with_operands_without_a_gpu(tmp_path):
    from coda_agent.verifier.spec import load_spec
    from coda_agent.verifier.workspace import find_root

    loaded = load_spec(find_root(None) / "kernel_specs" / "rms_bwd")
    dims = dict(loaded.spec.shapes.correctness[0].dims)
    (done,) = build.compile_jobs([build.Job("rms_bwd", str(loaded.directory), dims)], 1, cache_root=str(tmp_path))
    assert done.ok, done.error
    assert done.planned == 1
    assert any(tmp_path.rglob("*")), "nothing written to the kernel cache"

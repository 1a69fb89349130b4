"""The tuning table, its lookups and the dispatcher's route, on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from coda_agent.kernels import _dispatch
from coda_agent.runtime import tuning

SHA = "a" * 64


def _entry(**kw):
    base = dict(
        kernel="swiglu_fwd",
        kernel_sha256=SHA,
        gpu="NVIDIA H100 80GB HBM3",
        epilogue="swiglu_epi",
        bucket=tuning.bucket(8192, 28672, 4096),
        shape="llama3-8b/M8192",
        config={"tile_m": 128, "tile_n": 192, "pingpong": True, "cluster_m": 1, "cluster_n": 1},
        default_ms=1.0,
        tuned_ms=0.9,
        route="fused",
        call="M<=8192|x,4096;28672,4096",
    )
    base.update(kw)
    return tuning.Entry(**base)


def test_bucket_rounds_m_up_to_a_power_of_two_and_keeps_n_k():
    assert tuning.bucket(8192, 28672, 4096) == "M<=8192,N=28672,K=4096"
    assert tuning.bucket(8193, 5, 7) == "M<=16384,N=5,K=7"
    assert tuning.bucket(1, 5, 7) == "M<=64,N=5,K=7"


def test_call_bucket_marks_the_m_dims():
    x, w = torch.empty(5000, 64), torch.empty(128, 64)
    assert tuning.call_bucket((x, w)) == "M<=8192|x,64;128,64"
    rstd = torch.empty(5000)
    assert tuning.call_bucket((x, rstd, w, 3)) == "M<=8192|x,64;x;128,64"


def test_table_round_trips_and_merges_by_key(tmp_path):
    p = tmp_path / "tuning.json"
    t = tuning.Table().merged([_entry(), _entry(epilogue="other", tuned_ms=0.5)])
    p.write_text(tuning.dump(t))
    back = tuning.load(p)
    assert back == t and len(back.entries) == 2
    newer = back.merged([_entry(tuned_ms=0.8)])
    assert len(newer.entries) == 2
    assert {e.epilogue: e.tuned_ms for e in newer.entries} == {"swiglu_epi": 0.8, "other": 0.5}


def test_missing_table_is_empty_and_a_bad_one_names_the_file(tmp_path):
    assert tuning.load(tmp_path / "none.json").entries == []
    bad = tmp_path / "tuning.json"
    bad.write_text(json.dumps({"format": 1, "entries": [{"kernel": "k"}]}))
    with pytest.raises(ValueError, match=r"tuning\.json: not a valid tuning table"):
        tuning.load(bad)


def test_lookup_answers_only_for_the_accepted_hash_and_this_gpu():
    t = tuning.Table(entries=[_entry()])
    gpu = lambda device: "NVIDIA H100 80GB HBM3"  # noqa: E731
    look = tuning.Lookup(t, "swiglu_fwd", SHA, gpu_name=gpu)
    cfg = look.config_for("swiglu_epi", 8000, 28672, 4096, None)
    assert (cfg.tile_m, cfg.tile_n, cfg.pingpong, cfg.cluster_m) == (128, 192, True, 1)
    assert look.config_for("swiglu_epi", 9000, 28672, 4096, None) is None  # another bucket
    assert not tuning.Lookup(t, "swiglu_fwd", "b" * 64, gpu_name=gpu)  # another kernel hash
    other_gpu = tuning.Lookup(t, "swiglu_fwd", SHA, gpu_name=lambda d: "NVIDIA H200")
    assert other_gpu.config_for("swiglu_epi", 8000, 28672, 4096, None) is None


def test_tile_widths_are_every_tuned_config_of_the_kernel_at_its_hash():
    wide = _entry(bucket=tuning.bucket(64, 28672, 4096), config={"tile_m": 128, "tile_n": 256})
    h200 = _entry(gpu="NVIDIA H200", config={"tile_m": 128, "tile_n": 96})
    t = tuning.Table(entries=[_entry(), wide, h200, _entry(kernel="rms_bwd", config={"tile_n": 64})])
    assert tuning.Lookup(t, "swiglu_fwd", SHA).tile_widths() == {192, 256, 96}
    assert tuning.Lookup(t, "swiglu_fwd", "b" * 64).tile_widths() == set()


def test_unknown_config_field_is_named():
    with pytest.raises(ValueError, match="unknown GemmConfig field"):
        tuning.config_from_dict({"tile_m": 128, "tile_q": 3})


def test_override_lookup_star_bucket_covers_every_shape():
    f = tuning.override_lookup("k", {"epi": {"*": {"tile_m": 128, "tile_n": 128}}})
    assert f("epi", 1, 2, 3, None).tile_n == 128
    assert f("other", 1, 2, 3, None) is None


def test_route_standard_only_at_the_routed_call(monkeypatch):
    t = tuning.Table(entries=[_entry(route="standard")])
    look = tuning.Lookup(t, "swiglu_fwd", SHA, gpu_name=lambda d: "NVIDIA H100 80GB HBM3")
    x, w = torch.empty(8000, 4096), torch.empty(28672, 4096)
    assert look.route(tuning.call_bucket((x, w)), None) == "standard"
    assert look.route(tuning.call_bucket((torch.empty(9000, 4096), w)), None) == "fused"
    monkeypatch.delenv("CODA_ROUTE", raising=False)
    _dispatch.clear()
    assert _dispatch.choose("swiglu_fwd", look, (x, w), None) == "standard"
    assert _dispatch.choose("gemm_cross_entropy", look, (x, w), None) == "fused"  # no standard path
    monkeypatch.setenv("CODA_ROUTE", "fused")
    assert _dispatch.choose("swiglu_fwd", look, (x, w), None) == "fused"
    monkeypatch.setenv("CODA_ROUTE", "standard")
    assert _dispatch.choose("swiglu_fwd", None, (x, w), None) == "standard"
    monkeypatch.setenv("CODA_ROUTE", "sometimes")
    with pytest.raises(ValueError, match="CODA_ROUTE"):
        _dispatch.choose("swiglu_fwd", look, (x, w), None)


def test_committed_table_is_valid():
    t = tuning.load()
    for e in t.entries:
        tuning.config_from_dict(e.config)

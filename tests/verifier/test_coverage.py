"""verifier/gpu/coverage.py (the secret coverage cases of every verification) and the input draws
of verifier/gpu/inputs.py (``make_inputs(..., draw=)``), on every catalogue spec."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

import coda_agent.verifier.gpu.coverage as coverage
from coda_agent.verifier.gpu.coverage import (
    ALIGNED_TO,
    CPU_MEDIUM_BYTES,
    KEY_PREFIX,
    MEDIUM_BYTES,
    RAGGED_TO,
    SEED_BASE,
    TINY_M,
    coverage_runs,
    dim_rules,
)
from coda_agent.verifier.gpu.inputs import DRAWS, OUTLIER_SCALE, SATURATE_STD, TINY_ROW_SCALE, make_inputs, tensor_bytes
from coda_agent.verifier.gpu.poison import bitwise_equal
from coda_agent.verifier.gpu.protocol import BENCH_CHECK_SAMPLE
from coda_agent.verifier.gpu.runs import make_runs, secret_seed
from coda_agent.verifier.spec import CoverageSpec, eval_expr, find_specs

ROOT = Path(__file__).resolve().parents[2]
SPECS = find_specs(ROOT)
IDS = [s.spec.name for s in SPECS]
SECRETS = (1, 2, 5, 77, 1 << 29)
"""Several secrets per spec (each plan is deterministic in its secret)."""


def _by_name(name: str):
    return next(s for s in SPECS if s.spec.name == name)


def _draws(spec) -> list[str]:
    """The extra input draws of a plan, in order."""
    return [d for d in DRAWS if d not in ("spec", "nonfinite")] + (["nonfinite"] if spec.coverage.nonfinite else [])


def _case_values(spec) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for c in (*spec.shapes.correctness, *spec.shapes.benchmark):
        for d, v in c.dims.items():
            out.setdefault(d, set()).add(v)
    return out


def _with_coverage(loaded, **cov):
    spec = loaded.spec.model_copy(update={"coverage": CoverageSpec(**cov)})
    return loaded.model_copy(update={"spec": spec})


# --------------------------------------------------------------------------- the plan's cases


def test_the_catalogue_is_there():
    assert len(SPECS) >= 11 and {"swiglu_fwd", "swiglu_bwd", "cross_entropy_bwd", "gemm_rope"} <= set(IDS)
    assert all(s.spec.shapes.benchmark and "M" in s.spec.shapes.benchmark[0].dims for s in SPECS)


@pytest.mark.parametrize("loaded", SPECS, ids=IDS)
def test_every_gpu_plan_has_one_production_size_ragged_case(loaded):
    # cross_entropy_bwd's max_workspace outgrows its cap (_check_values: twice the tensors'
    # bytes + 8 MiB) above M ~ 8750 at K = 2048, V = 128256: a redrawn M beyond that must give
    # way to fewer rows, never drop the case (secret 5 drew M = 11761 there)
    spec = loaded.spec
    bench = [dict(c.dims) for c in spec.shapes.benchmark]
    rules = dim_rules(spec, "cuda")
    for secret in SECRETS:
        cov = coverage_runs(spec, secret, "cuda")
        prod = [r for r in cov if r.sample]
        assert len(prod) == 1, (secret, [r.case for r in cov])
        p = prod[0]
        assert (p.key, p.draw, p.sample) == (f"{KEY_PREFIX}0", "spec", BENCH_CHECK_SAMPLE)
        assert p.case.startswith("secret-0 spec: ")
        m = p.dims["M"]
        assert m % 2 == 1 and m >= min(b["M"] for b in bench) // 2  # ragged, production size
        # a benchmark shape with M in [M/2, 2M] and every other free dim within 8 steps below
        assert any(
            b["M"] // 2 <= m <= 2 * b["M"] + 1
            and all(
                p.dims[d] == v if "choices" in rules[d] else v - 64 <= p.dims[d] <= v for d, v in b.items() if d != "M"
            )
            for b in bench
        ), (secret, p.dims)


@pytest.mark.slow
@pytest.mark.parametrize("loaded", SPECS, ids=IDS)
def test_tiny_m_case_then_one_case_per_draw(loaded):
    spec = loaded.spec
    over = []
    for device in ("cuda", "cpu"):
        for secret in SECRETS:
            runs = coverage_runs(spec, secret, device)
            cov = [r for r in runs if not r.sample]
            tiny, rest = cov[0], cov[1:]
            assert tiny.draw == "spec" and tiny.dims["M"] >= 1, (device, secret, tiny.case)
            if tiny.dims["M"] > TINY_M:
                over.append((device, secret, tiny.case))
            assert [r.draw for r in rest] == _draws(spec), (device, secret)
            first = len(runs) - len(cov)  # the GPU plan's first case is the production-size one
            for j, r in enumerate(cov, start=first):
                assert r.key == f"{KEY_PREFIX}{j}" and r.seed == SEED_BASE + secret + j and not r.recheck
                assert r.case == f"secret-{j} {r.draw}: " + ", ".join(f"{k}={v}" for k, v in r.dims.items())
            if device == "cpu":  # no production-size case on the CPU test device
                assert len(cov) == len(runs) == 1 + len(_draws(spec))
    assert over == []  # the tiny-M case: M in [1, TINY_M]


def test_nonfinite_draw_iff_the_spec_declares_it():
    loaded = _by_name("swiglu_fwd")
    assert not loaded.spec.coverage.nonfinite
    for secret in SECRETS:
        assert "nonfinite" not in {r.draw for r in coverage_runs(loaded.spec, secret, "cuda")}
        nf = _with_coverage(loaded, nonfinite=True).spec
        runs = coverage_runs(nf, secret, "cuda")
        assert [r.draw for r in runs].count("nonfinite") == 1 and runs[-1].draw == "nonfinite"


@pytest.mark.slow
@pytest.mark.parametrize("loaded", SPECS, ids=IDS)
def test_drawn_shapes_are_legal_fixed_dims_kept_and_within_budget(loaded):
    spec = loaded.spec
    values = _case_values(spec)
    keep = set(spec.coverage.fixed) | {d for d, v in values.items() if len(v) == 1}
    for device, budget in (("cuda", MEDIUM_BYTES), ("cpu", CPU_MEDIUM_BYTES)):
        for secret in SECRETS:
            for r in coverage_runs(spec, secret, device):
                assert set(r.dims) == set(values), r.case
                spec._check_values(r.case, r.dims, bench=False)  # raises when illegal
                for d in keep:
                    assert r.dims[d] in values[d], (r.case, d)
                if not r.sample:  # fully compared: within the tensor budget
                    assert tensor_bytes(spec, r.dims) <= budget, (device, r.case, tensor_bytes(spec, r.dims))


@pytest.mark.slow
def test_fixed_and_choice_dims_draw_only_their_values():
    rope = _by_name("gemm_rope")
    assert dim_rules(rope.spec)["HD"] == {"low": 64, "high": 128, "multiple_of": 1}  # free in the catalogue
    fixed = _with_coverage(rope, fixed=["HD"]).spec
    assert dim_rules(fixed)["HD"] == {"choices": [64, 128]}
    seen = {r.dims["HD"] for s in range(1, 30) for r in coverage_runs(fixed, s, "cpu")}
    assert seen == {64, 128}
    pinned = _with_coverage(_by_name("swiglu_fwd"), fixed=["K"], dims={"I": {"choices": [200, 1000]}}).spec
    rules = dim_rules(pinned)
    assert rules["K"] == {"choices": [264, 320, 512, 2048, 4096, 8192]} and rules["I"] == {"choices": [200, 1000]}
    for s in SECRETS:
        for r in coverage_runs(pinned, s, "cpu"):
            assert r.dims["K"] in rules["K"]["choices"] and r.dims["I"] in (200, 1000), r.case


# A drawn dim stays within its rule's [low, high]: a ragged pick of high that is a multiple
# of 64 is moved down, not up; an aligned pick is never rounded below low.


def test_a_ragged_pick_stays_at_or_below_high():
    tiny = [
        coverage._pick(random.Random(s), {"low": 1, "high": 32768, "multiple_of": 1}, low=1, high=TINY_M, ragged=True)
        for s in range(2000)
    ]  # the tiny-M case's call
    assert min(tiny) == 1 and all(v % RAGGED_TO for v in tiny)
    assert max(tiny) <= TINY_M, sorted(v for v in set(tiny) if v > TINY_M)


def test_an_aligned_pick_stays_at_or_above_low():
    rule = {"low": 264, "high": 8192, "multiple_of": 1}
    aligned = [coverage._pick(random.Random(s), rule, ragged=False) for s in range(200)]
    assert all(v % ALIGNED_TO == 0 and v <= rule["high"] for v in aligned)
    assert min(aligned) >= rule["low"], sorted(v for v in set(aligned) if v < rule["low"])


@pytest.mark.slow
def test_drawn_dims_stay_within_their_rule_bounds():
    out = []
    for loaded in SPECS:
        rules = dim_rules(loaded.spec, "cuda")
        for secret in SECRETS:
            out += [
                (loaded.spec.name, secret, r.case, d)
                for r in coverage_runs(loaded.spec, secret, "cuda")
                for d, v in r.dims.items()
                if "low" in rules[d] and not rules[d]["low"] <= v <= rules[d]["high"]
            ]
    assert out == []


M_SECRETS = range(1, 151)


@pytest.fixture(scope="module")
def fwd_draws():
    """swiglu_fwd's GPU draw cases (one per input draw) over 150 secrets."""
    spec = _by_name("swiglu_fwd").spec
    return [r for s in M_SECRETS for r in coverage_runs(spec, s, "cuda") if r.draw != "spec"]


@pytest.mark.slow
def test_m_is_log_uniform_from_1_to_twice_the_largest_benchmark_m(fwd_draws):
    spec = _by_name("swiglu_fwd").spec
    top = 2 * max(c.dims["M"] for c in spec.shapes.benchmark)
    assert dim_rules(spec)["M"] == {"low": 1, "high": top, "multiple_of": 1} and top == 32768
    ms = [r.dims["M"] for r in fwd_draws]
    assert len(ms) == 4 * len(M_SECRETS)
    assert min(ms) == 1 and top // 2 <= max(ms) <= top

    # log-uniform on [1, 32768]: P(M < 256) = 8/15, P(M >= 4096) = 3/15 (the ragged/aligned
    # rounding moves no value across 256 or 4096)
    def frac(pred) -> float:
        return sum(map(pred, ms)) / len(ms)

    assert frac(lambda m: m < 256) == pytest.approx(8 / 15, abs=0.08)
    assert frac(lambda m: m >= 4096) == pytest.approx(3 / 15, abs=0.07)
    assert frac(lambda m: m < 16) == pytest.approx(0.5 * 4 / 15 + 0.5 * 0, abs=0.07)  # aligned: never < 128


def test_ragged_dims_about_half_the_time(fwd_draws):
    for d in ("M", "K", "I"):
        vals = [r.dims[d] for r in fwd_draws]
        ragged = sum(v % RAGGED_TO != 0 for v in vals) / len(vals)
        aligned = sum(v % ALIGNED_TO == 0 for v in vals) / len(vals)
        assert 0.35 <= ragged <= 0.65 and 0.3 <= aligned <= 0.65, (d, ragged, aligned)


@pytest.mark.slow
def test_cpu_draws_keep_m_log_uniform_within_the_smaller_budget():
    spec = _by_name("swiglu_fwd").spec
    ms = [r.dims["M"] for s in range(1, 41) for r in coverage_runs(spec, s, "cpu") if r.draw != "spec"]
    assert min(ms) == 1 and max(ms) < 2048  # 2 MiB: M x (2K + 6I) bytes with K >= 256, I >= 128


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_plans_are_deterministic_in_the_secret(device):
    for loaded in SPECS:
        spec = loaded.spec
        a, b = make_runs(spec, 77, device), make_runs(spec, 77, device)
        assert a == b
        c = make_runs(spec, 78, device)
        dims = [[r.dims for r in runs if r.key.startswith(KEY_PREFIX)] for runs in (a, c)]
        assert dims[0] != dims[1]


def test_public_case_seeds_are_secret_and_keys_keep_the_spec_seeds():
    spec = _by_name("swiglu_bwd").spec
    plain = make_runs(spec, 0, "cuda")
    assert not any(r.key.startswith(KEY_PREFIX) for r in plain)
    public0 = [r for r in plain if not r.recheck]
    assert [r.seed for r in public0] == [s for _ in spec.shapes.correctness for s in spec.shapes.seeds]
    for secret in SECRETS:
        runs = make_runs(spec, secret, "cuda")
        public = [r for r in runs if not r.recheck and not r.key.startswith(KEY_PREFIX)]
        assert [r.key for r in public] == [r.key for r in public0]  # keys name the spec's seeds
        for r, r0 in zip(public, public0, strict=False):
            assert r.key.endswith(f"-s{r0.seed}") and r.seed == secret_seed(r0.seed, secret) != r0.seed
        assert len({r.seed for r in public}) == len(spec.shapes.seeds)  # one secret seed per spec seed
        recheck = [r for r in runs if r.recheck]
        assert len(recheck) == 1 and recheck[0].key == f"recheck-c2-ragged-all-s{spec.shapes.seeds[0] + 1000}"


# --------------------------------------------------------------------------- the input draws

FWD_DIMS = {"M": 512, "K": 512, "I": 384}


def test_unknown_draw_is_refused():
    with pytest.raises(ValueError, match="unknown input draw"):
        make_inputs(_by_name("swiglu_fwd"), FWD_DIMS, 0, "cpu", draw="gaussian")


@pytest.mark.parametrize("loaded", SPECS, ids=IDS)
def test_spec_draw_is_the_declared_draw(loaded):
    """draw="spec" is bit-identical to the default call and to the declared distribution drawn
    from each tensor's own generator (what make_inputs did before the draws existed)."""
    from coda_agent.verifier.gpu.inputs import tensor_seed

    spec = loaded.spec
    dims = dict(spec.shapes.correctness[-1].dims)
    a = make_inputs(loaded, dims, 3, "cpu")
    b = make_inputs(loaded, dims, 3, "cpu", draw="spec")
    assert list(a) == list(b) == [t.name for t in spec.all_inputs]  # reference-only inputs first
    for t in spec.all_inputs:
        assert bitwise_equal(a[t.name], b[t.name]), t.name
        if t.init.dist == "derived":
            continue
        g = torch.Generator().manual_seed(tensor_seed(3, t.name))
        shape = spec.shape_of(t, dims)
        if t.init.dist == "normal":
            x = torch.randn(shape, generator=g) * float(eval_expr(t.init.std, dims)) + float(t.init.mean)
        elif t.init.dist == "uniform":
            lo, hi = float(eval_expr(t.init.low, dims)), float(eval_expr(t.init.high, dims))
            x = torch.rand(shape, generator=g) * (hi - lo) + lo
        else:
            x = torch.randint(
                int(eval_expr(t.init.low, dims)),
                int(eval_expr(t.init.high, dims)),
                shape,
                generator=g,
                dtype=torch.int64,
            )
        assert bitwise_equal(a[t.name], x.to(getattr(torch, t.dtype))), t.name


def test_heavy_has_heavier_tails_at_the_same_std():
    loaded = _by_name("swiglu_fwd")
    for seed in range(3):
        a = make_inputs(loaded, FWD_DIMS, seed, "cpu")
        h = make_inputs(loaded, FWD_DIMS, seed, "cpu", draw="heavy")
        for name in ("x", "w1"):
            sa, sh = a[name].float(), h[name].float()
            assert float(sh.std()) == pytest.approx(float(sa.std()), rel=0.15), name
            # N(0, 1) stays below ~5 sigma at this size; Student-t(3) reaches tens of sigma
            assert float(sh.abs().max()) > 3 * float(sa.abs().max()), name


def test_outliers_scale_about_one_percent_of_rows_and_columns():
    loaded = _by_name("swiglu_fwd")
    a = make_inputs(loaded, FWD_DIMS, 0, "cpu")
    o = make_inputs(loaded, FWD_DIMS, 0, "cpu", draw="outliers")
    for name in ("x", "w1"):
        base, out = a[name].float(), o[name].float()
        scaled = out != base
        nz = base != 0
        # a scaled element is exactly OUTLIER_SCALE x the spec draw (a power of two: exact in bf16)
        assert torch.equal(out[scaled], base[scaled] * OUTLIER_SCALE)
        rows = (scaled | ~nz).all(1).nonzero().reshape(-1)
        cols = (scaled | ~nz).all(0).nonzero().reshape(-1)
        assert len(rows) == base.shape[0] // 100 and len(cols) == base.shape[1] // 100, name
        mask = torch.zeros_like(scaled)
        mask[rows] = True
        mask[:, cols] = True
        assert torch.equal(scaled, mask & nz), name  # nothing else changed


def test_saturate_rescales_only_normal_inputs_with_a_numeric_std():
    loaded = _by_name("swiglu_fwd")
    a = make_inputs(loaded, FWD_DIMS, 0, "cpu")
    s = make_inputs(loaded, FWD_DIMS, 0, "cpu", draw="saturate")
    assert float(s["x"].float().std()) == pytest.approx(SATURATE_STD, rel=0.02)
    # x: std 1.0 -> 40 x the same draw (rounded to bf16 once); w1: std "1/sqrt(K)" unchanged
    assert torch.allclose(s["x"].float(), a["x"].float() * SATURATE_STD, rtol=2**-7, atol=0)
    assert bitwise_equal(s["w1"], a["w1"])
    rms = _by_name("rms_bwd")  # h: std 2.0 -> 40; gamma: uniform, unchanged; w: std "1/sqrt(D)"
    dims = dict(rms.spec.shapes.correctness[0].dims)
    a, s = make_inputs(rms, dims, 0, "cpu"), make_inputs(rms, dims, 0, "cpu", draw="saturate")
    assert torch.allclose(s["h"].float(), a["h"].float() * (SATURATE_STD / 2.0), rtol=2**-7, atol=0)
    assert bitwise_equal(s["gamma"], a["gamma"]) and bitwise_equal(s["w"], a["w"])


def test_tiny_rows_are_the_same_rows_in_every_input_and_one_is_zero():
    loaded = _by_name("swiglu_bwd")  # dout (M, K) and preact (M, 2I) have rows; w_down (K, I) not
    dims = {"M": 600, "K": 320, "I": 200}
    a = make_inputs(loaded, dims, 4, "cpu")
    t = make_inputs(loaded, dims, 4, "cpu", draw="tiny_rows")
    assert bitwise_equal(t["w_down"], a["w_down"])
    changed = {}
    for name in ("dout", "preact"):
        diff = (t[name] != a[name]).any(1)
        changed[name] = diff.nonzero().reshape(-1).tolist()
        zero = (t[name] == 0).all(1).nonzero().reshape(-1).tolist()
        assert len(zero) == 1 and zero[0] == changed[name][0], name  # the first chosen row is 0
        rows = changed[name][1:]
        ratio = t[name][rows].float() / a[name][rows].float()
        assert torch.allclose(
            ratio[a[name][rows] != 0], torch.full_like(ratio, TINY_ROW_SCALE)[a[name][rows] != 0], rtol=2**-7
        )
    assert changed["dout"] == changed["preact"] and len(changed["dout"]) == 600 // 50


def test_nonfinite_draw_only_for_a_spec_that_declares_it():
    loaded = _by_name("swiglu_bwd")
    dims = {"M": 600, "K": 320, "I": 200}
    with pytest.raises(ValueError, match="does not declare coverage.nonfinite"):
        make_inputs(loaded, dims, 0, "cpu", draw="nonfinite")
    nf = _with_coverage(loaded, nonfinite=True)
    x = make_inputs(nf, dims, 0, "cpu", draw="nonfinite")
    a = make_inputs(loaded, dims, 0, "cpu")
    rows = {}
    for name in ("dout", "preact"):
        bad = ~torch.isfinite(x[name].float())
        assert torch.equal(bad.sum(1) <= 1, torch.ones(600, dtype=torch.bool)), name  # one element per row
        rows[name] = bad.any(1).nonzero().reshape(-1).tolist()
        assert len(rows[name]) == 600 // 100
        vals = x[name].float()[bad]
        # NaN, +Inf and -Inf in turn
        assert [int(torch.isnan(vals).sum()), int((vals == math.inf).sum()), int((vals == -math.inf).sum())] == [
            2,
            2,
            2,
        ]
        assert torch.equal(x[name][~bad], a[name][~bad])  # nothing else changed
    assert rows["dout"] == rows["preact"]
    assert torch.isfinite(x["w_down"].float()).all()


def test_derived_inputs_follow_the_changed_inputs():
    rms = _by_name("rms_bwd")  # rstd and zdz are computed by reference.saved_* from h, dy, w, gamma
    ref = rms.load_reference()
    dims = dict(rms.spec.shapes.correctness[0].dims)
    a = make_inputs(rms, dims, 0, "cpu")
    for draw in ("tiny_rows", "saturate", "outliers"):
        d = make_inputs(rms, dims, 0, "cpu", draw=draw)
        with torch.no_grad():
            rstd = ref.saved_rstd(h=d["h"])
            zdz = ref.saved_zdz(dy=d["dy"], w=d["w"], h=d["h"], gamma=d["gamma"], rstd=d["rstd"])
        assert bitwise_equal(d["rstd"], rstd.float().contiguous()), draw
        assert bitwise_equal(d["zdz"], zdz.float().contiguous()), draw
        assert not torch.equal(d["rstd"], a["rstd"]), draw

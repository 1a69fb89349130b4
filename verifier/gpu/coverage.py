"""Secret coverage cases: the shapes and input draws a candidate cannot know in advance.

A spec's correctness shapes are public (they are in the prompt), so a kernel that is
right only at those shapes, or only on N(0, sigma) inputs, would pass them. Every
verification therefore also runs the candidate on cases drawn from the run's secret
(``Plan.secret``, drawn by the parent and never seen by candidate code):

* **one production-size ragged shape**: a benchmark shape with M redrawn (ragged, within
  half to twice the benchmark's M) and every other free dim moved to a nearby legal value
  that is no multiple of 64; compared on sampled elements, as the benchmark checks are;
* **one tiny-M shape**: M log-uniform in [1, 64] (single-token decode rows, M = 1);
* **one shape per extra input draw** (``heavy``, ``outliers``, ``saturate``, ``tiny_rows``
  and, where the spec declares ``coverage.nonfinite``, ``nonfinite``; see
  :data:`~coda_agent.verifier.gpu.inputs.DRAWS`): M log-uniform from 1 to twice the largest
  benchmark M, every other free dim log-uniform over the range the spec's own shape cases
  span, each dim ragged (no multiple of 64) or aligned (a multiple of 128) with equal
  odds, within :data:`MEDIUM_BYTES` of tensors so the whole output is compared.

Every drawn shape passes the spec's own value checks (positive dims, 16-byte TMA rows,
workspace and draw expressions: ``KernelSpec._check_values``), and the spec's
``[coverage]`` table bounds the draw: ``fixed`` dims keep their cases' values, ``dims``
gives ranges, choices and multiples (e.g. ``S``, which bounds the RoPE positions).

Each case is a :class:`~coda_agent.verifier.gpu.protocol.Run` judged like the correctness
trials (every output rule, launches, workspace); its name says the draw and the dims, so
the verdict records what ran and a failure names the shape it failed at, while the next
verification draws new ones. The CPU test device draws no production shape and a smaller
budget (its references run on the CPU).
"""

from __future__ import annotations

import math
import random
from typing import Any

from ..spec import RECHECK_ROW_DIM as ROW_DIM
from .protocol import BENCH_CHECK_SAMPLE, Run

MEDIUM_BYTES = 64 << 20
"""Tensor bytes (inputs + outputs) a fully compared secret shape may hold on the GPU."""
CPU_MEDIUM_BYTES = 2 << 20
"""The same on the CPU test device (its references run on the CPU)."""
TINY_M = 64
"""The tiny-M case draws M from [1, TINY_M]."""
RAGGED_TO = 64
"""A ragged dim is no multiple of this (so of no tile size 64, 128, 192, 256)."""
ALIGNED_TO = 128
"""An aligned dim is a multiple of this."""
SEED_BASE = 20_000
"""Secret cases use seeds ``SEED_BASE + secret + j``."""
DRAW_TRIES = 64
"""Shapes tried per case before the draw falls back to the smallest legal shape."""
KEY_PREFIX = "cov"
"""Run keys of the secret coverage cases start with this."""


def _cases(spec: Any) -> list[dict[str, int]]:
    return [dict(c.dims) for c in (*spec.shapes.correctness, *spec.shapes.benchmark)]


def dim_rules(spec: Any, device: str = "cuda") -> dict[str, dict[str, Any]]:
    """Per dim the draw rule: ``{"choices": [...]}`` or ``{"low", "high", "multiple_of"}``.

    Defaults: M from 1 to twice the largest benchmark M (the largest correctness M when
    there are no benchmark shapes); another dim over the range of its values in the
    spec's shape cases (a dim with one value keeps it). ``coverage.fixed`` and
    ``coverage.dims`` override these."""
    cases = _cases(spec)
    names = sorted({d for c in cases for d in c})
    cov = spec.coverage
    bench_m = [c.dims[ROW_DIM] for c in spec.shapes.benchmark if ROW_DIM in c.dims]
    rules: dict[str, dict[str, Any]] = {}
    for d in names:
        values = sorted({c[d] for c in cases if d in c})
        if d in cov.fixed or len(values) == 1:
            rules[d] = {"choices": values}
            continue
        rule: dict[str, Any] = {"low": values[0], "high": values[-1], "multiple_of": 1}
        if d == ROW_DIM:
            rule["low"], rule["high"] = 1, 2 * max(bench_m or values)
        given = cov.dims.get(d)
        if given is not None:
            if given.choices is not None:
                rules[d] = {"choices": sorted(set(given.choices))}
                continue
            rule["low"] = given.low if given.low is not None else rule["low"]
            rule["high"] = given.high if given.high is not None else rule["high"]
            rule["multiple_of"] = given.multiple_of
        rules[d] = rule
    return rules


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    if high <= low:
        return low
    return min(high, max(low, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


def _pick(
    rng: random.Random,
    rule: dict[str, Any],
    *,
    low: int | None = None,
    high: int | None = None,
    ragged: bool | None = None,
) -> int:
    """One value under ``rule`` within its range (and ``[low, high]`` when given), a multiple
    of its ``multiple_of``: aligned (a multiple of :data:`ALIGNED_TO`) or ragged (no multiple
    of :data:`RAGGED_TO`); the other kind where the range holds none of the one asked for."""
    if "choices" in rule:
        return rng.choice(rule["choices"])
    mult = rule["multiple_of"]
    lo, hi = max(rule["low"], low or rule["low"]), min(rule["high"], high or rule["high"])
    if hi < lo:
        lo = hi = min(max(rule["low"], low or rule["low"]), rule["high"])
    v = _log_uniform(rng, lo, hi)
    if ragged is None:
        ragged = rng.random() < 0.5
    first = lambda step: -(-lo // step) * step  # noqa: E731  (smallest multiple of step >= lo)
    if not ragged:
        step = math.lcm(mult, ALIGNED_TO)
        if first(step) <= hi:
            return min(max(v // step * step, first(step)), hi // step * step)
    # ragged: a multiple of mult in range, moved off multiples of RAGGED_TO when one is near
    if first(mult) > hi:
        return max(1, lo)  # no multiple of mult in range: the range's own bound
    v = min(max(v // mult * mult, first(mult)), hi // mult * mult)
    if v % RAGGED_TO == 0:
        for cand in (v + mult, v - mult):
            if lo <= cand <= hi and cand % RAGGED_TO:
                return cand
    return v


def _legal(spec: Any, dims: dict[str, int]) -> bool:
    try:
        spec._check_values("coverage draw", dims, bench=False)
    except ValueError:
        return False
    return True


def _nudge(
    spec: Any, dims: dict[str, int], rules: dict[str, dict[str, Any]], rng: random.Random
) -> dict[str, int] | None:
    """``dims`` made legal by moving free dims up by their multiple (at most 16 steps each,
    in a random order), or None."""
    if _legal(spec, dims):
        return dims
    free = [d for d in dims if "choices" not in rules[d]]
    rng.shuffle(free)
    for d in free:
        step, high = rules[d]["multiple_of"], rules[d]["high"]
        for k in range(1, 17):
            trial = {**dims, d: dims[d] + k * step}
            if trial[d] <= high and _legal(spec, trial):
                return trial
    # several dims at once: every free dim rounded up to a multiple of 8 (within its range)
    trial = {d: (-(-v // 8) * 8 if d in free else v) for d, v in dims.items()}
    inside = all(trial[d] <= rules[d]["high"] for d in free)
    return trial if inside and _legal(spec, trial) else None


def _tensor_bytes(spec: Any, dims: dict[str, int]) -> int:
    from .inputs import tensor_bytes

    return tensor_bytes(spec, dims)


def draw_shape(
    spec: Any, rng: random.Random, rules: dict[str, dict[str, Any]], budget: int, m_range: tuple[int, int] | None = None
) -> dict[str, int]:
    """A legal shape within ``budget`` tensor bytes. M is drawn first (within ``m_range``
    when given) and kept; the other free dims are drawn over their ranges, and when the
    shape is over budget they are drawn again with their upper bounds halved, so M keeps
    its log-uniform law and the other dims give way."""
    m_rule = rules.get(ROW_DIM)
    m = None
    if m_rule is not None:
        if m_range is not None:
            m = _pick(rng, m_rule, low=m_range[0], high=m_range[1], ragged=True if m_range[1] < ALIGNED_TO else None)
        else:
            m = _pick(rng, m_rule)
    shrink = 1
    for _ in range(DRAW_TRIES):
        dims = {} if m is None else {ROW_DIM: m}
        for d, rule in rules.items():
            if d == ROW_DIM:
                continue
            high = None if "choices" in rule else max(rule["low"], rule["high"] // shrink)
            dims[d] = _pick(rng, rule, high=high)
        legal = _nudge(spec, dims, rules, rng)
        if legal is not None and _tensor_bytes(spec, legal) <= budget:
            return legal
        if legal is not None:
            shrink *= 2
    # the other dims at their smallest and still over budget: fewer rows, else the smallest case
    base = min((dict(c.dims) for c in spec.shapes.correctness), key=lambda c: _tensor_bytes(spec, c))
    if m is not None:
        while m > 1 and _tensor_bytes(spec, {**base, ROW_DIM: m}) > budget:
            m = max(1, m // 2) | 1
        base[ROW_DIM] = m
    return _nudge(spec, base, rules, rng) or dict(spec.shapes.correctness[0].dims)


def production_shape(spec: Any, rng: random.Random, rules: dict[str, dict[str, Any]]) -> dict[str, int] | None:
    """A benchmark shape with every free dim of 512 or more moved down to a legal value no
    multiple of 64 (within 8 steps of its multiple), then M redrawn ragged (odd) in [M/2, 2M]
    (fewer rows where the spec's own checks refuse more, e.g. a workspace budget that
    outgrows its cap); None when the spec has no benchmark shapes or no legal shape is
    found."""
    if not spec.shapes.benchmark:
        return None
    dims = dict(rng.choice(spec.shapes.benchmark).dims)
    for d, v in dims.items():
        rule = rules.get(d, {})
        if "choices" in rule or d == ROW_DIM or v < 512:
            continue
        step = max(rule.get("multiple_of", 1), 8)
        for k in rng.sample(range(1, 9), 8):
            cand = v - k * step
            if cand >= rule.get("low", 1) and cand % RAGGED_TO and _legal(spec, {**dims, d: cand}):
                dims[d] = cand
                break
    if ROW_DIM in dims and "choices" not in rules.get(ROW_DIM, {}):
        m0 = dims[ROW_DIM]
        for lo, hi in ((max(1, m0 // 2), 2 * m0), (max(1, m0 // 2), m0)):
            for _ in range(8):
                m = rng.randint(lo, hi) | 1
                if _legal(spec, {**dims, ROW_DIM: m}):
                    return {**dims, ROW_DIM: m}
    return _nudge(spec, dims, rules, rng)


def _label(j: int, draw: str, dims: dict[str, int]) -> str:
    return f"secret-{j} {draw}: " + ", ".join(f"{k}={v}" for k, v in dims.items())


def coverage_runs(spec: Any, secret: int, device: str = "cuda") -> list[Run]:
    """The secret coverage cases of one verification (see the module doc), as runs judged
    with the correctness trials. Deterministic in ``(spec, secret, device)``; the secret
    alone decides shapes, draws and seeds."""
    from .inputs import DRAWS

    rng = random.Random(f"coda-coverage:{secret}")
    rules = dim_rules(spec, device)
    cpu = device != "cuda"
    budget = CPU_MEDIUM_BYTES if cpu else MEDIUM_BYTES
    draws = [d for d in DRAWS if d not in ("spec", "nonfinite")]
    if spec.coverage.nonfinite:
        draws.append("nonfinite")
    cases: list[tuple[str, dict[str, int], int]] = []  # (draw, dims, sample)
    if not cpu:
        prod = production_shape(spec, rng, rules)
        if prod is not None:
            cases.append(("spec", prod, BENCH_CHECK_SAMPLE))
    if ROW_DIM in rules:
        cases.append(("spec", draw_shape(spec, rng, rules, budget, m_range=(1, TINY_M)), 0))
    for draw in draws:
        cases.append((draw, draw_shape(spec, rng, rules, budget), 0))
    runs = []
    for j, (draw, dims, sample) in enumerate(cases):
        runs.append(
            Run(
                key=f"{KEY_PREFIX}{j}",
                case=_label(j, draw, dims),
                dims=dims,
                seed=SEED_BASE + secret + j,
                draw=draw,
                sample=sample,
            )
        )
    return runs

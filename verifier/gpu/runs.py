"""Which trials a verification runs: the public correctness cases, the secret coverage
cases, the post-timing recheck and the benchmark shapes with their checks.

The parent builds the plan from these (:mod:`~coda_agent.verifier.pipeline`); the records
and file names the workers share are in :mod:`~coda_agent.verifier.gpu.protocol`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..spec import RECHECK_ROW_DIM
from .coverage import coverage_runs
from .protocol import BENCH_CHECK_SAMPLE, BenchShape, Run, _slug

RECHECK_SEED_OFFSET = 1000
"""The post-timing recheck uses seed ``spec.shapes.seeds[0] + RECHECK_SEED_OFFSET``."""
BENCH_CHECK_SEED_OFFSET = 2000


def _ragged(dims: dict[str, int], tile: int = 128) -> bool:
    return any(v % tile for v in dims.values())


def recheck_rows(m: int, secret: int) -> int:
    """The recheck's secret row count: uniform in ``[ceil(m / 2), 2 m]``, drawn from the
    per-verification secret, so the candidate cannot know the shape it will be judged at
    (correctness shapes are public: a kernel right only at those would pass them)."""
    import random

    return random.Random(secret ^ 0x2EC4ECC).randint(-(-m // 2), 2 * m)


def secret_seed(seed: int, secret: int) -> int:
    """The seed a public correctness case actually runs with: the spec's ``seed`` itself
    without a secret (tests), else one the candidate cannot predict from the spec."""
    if not secret:
        return seed
    return int.from_bytes(hashlib.sha256(f"coda-seed:{secret}:{seed}".encode()).digest()[:4], "little")


def make_runs(spec: Any, secret: int = 0, device: str = "cuda") -> list[Run]:
    """Every correctness case x seed, the secret coverage cases, then one post-timing recheck.

    ``spec`` is a :class:`~coda_agent.verifier.spec.KernelSpec`. With a ``secret`` (every
    real verification has one) the seeds of the public cases are secret too
    (:func:`secret_seed`; the run keys keep the spec's seed) and the secret coverage cases
    (:func:`~coda_agent.verifier.gpu.coverage.coverage_runs`) follow them. The recheck re-runs
    the last ragged correctness case (the hardest one) with seed ``seeds[0] + 1000 +
    secret``, a seed the candidate never saw before timing; with a secret its ``M`` is
    also redrawn (:func:`recheck_rows`) and the case is named ``"<case>, M=<rows>"``.
    """
    runs: list[Run] = []
    for i, case in enumerate(spec.shapes.correctness):
        name = case.name or f"case{i}"
        for seed in spec.shapes.seeds:
            runs.append(
                Run(key=f"c{i}-{_slug(name)}-s{seed}", case=name, dims=dict(case.dims), seed=secret_seed(seed, secret))
            )
    if secret:
        runs += coverage_runs(spec, secret, device)
    cases = list(enumerate(spec.shapes.correctness))
    ragged = [(i, c) for i, c in cases if _ragged(c.dims)]
    i, case = (ragged or cases)[-1]
    name = case.name or f"case{i}"
    seed = spec.shapes.seeds[0] + RECHECK_SEED_OFFSET
    key = f"recheck-c{i}-{_slug(name)}-s{seed}"  # the key never tells the redrawn M
    dims = dict(case.dims)
    if secret and RECHECK_ROW_DIM in dims:
        dims[RECHECK_ROW_DIM] = recheck_rows(dims[RECHECK_ROW_DIM], secret)
        name = f"{name}, {RECHECK_ROW_DIM}={dims[RECHECK_ROW_DIM]}"
    runs.append(Run(key=key, case=name, dims=dims, seed=seed + secret, recheck=True))
    return runs


def make_bench_checks(spec: Any, shapes: list[BenchShape], secret: int = 0) -> list[Run]:
    """One post-timing check per benchmark shape (exactly the timed dims, a fresh seed),
    compared on :data:`BENCH_CHECK_SAMPLE` sampled elements per output."""
    seed = spec.shapes.seeds[0] + BENCH_CHECK_SEED_OFFSET
    return [
        Run(
            key=f"bench-{_slug(b.name)}-s{seed}",
            case=f"bench {b.name}",
            dims=dict(b.dims),
            seed=seed + secret,
            recheck=True,
            sample=BENCH_CHECK_SAMPLE,
        )
        for b in shapes
    ]


def make_bench_shapes(spec: Any, override: list[Any] | None = None) -> list[BenchShape]:
    """The benchmark shapes to time: the spec's, or ``override``.

    ``override`` items are shape names from ``spec.shapes.benchmark``, ``ShapeCase``
    objects or ``{"name", "dims"}`` dicts. Raises ``ValueError`` for an unknown name.
    """
    known = {c.name: c for c in spec.shapes.benchmark}
    if override is None:
        return [BenchShape(name=c.name or f"bench{i}", dims=dict(c.dims)) for i, c in enumerate(spec.shapes.benchmark)]
    out: list[BenchShape] = []
    for item in override:
        if isinstance(item, str):
            if item not in known:
                raise ValueError(f"unknown benchmark shape {item!r} (spec has {sorted(known)})")
            out.append(BenchShape(name=item, dims=dict(known[item].dims)))
        elif isinstance(item, dict):
            out.append(
                BenchShape(name=str(item.get("name", "custom")), dims={k: int(v) for k, v in item["dims"].items()})
            )
        else:
            out.append(BenchShape(name=item.name or "custom", dims=dict(item.dims)))
    return out

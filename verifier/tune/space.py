"""The GEMM config search space of ``coda-agent tune`` for one epilogue mod on SM90.

Stage 1 (:func:`stage1`): quack 0.6.5's own SM90 autotuning space for the mod's mode
(``quack.gemm_config.get_all_configs``: cooperative and pingpong tiles, clusters 1x2 and
2x1, swap-AB for element-mode mods without reduce sinks), plus every tile with a 1x1
cluster (not in quack's list; the CODA authors' repository adds it), all with the static
persistent scheduler. ``quick`` keeps the tiles that win at Llama widths in the project's
sweeps (``benchmarks/probes/tile_configs_vs_cublas.py``) and drops swap-AB.

Stage 2 (:func:`stage2`): the best stage-1 configs again with the dynamic persistent tile
scheduler (``is_dynamic_persistent=True``; also an addition to quack's SM90 list).

:func:`legal` mirrors quack's own per-mod pruning (``gemm_runtime/autotune.py``:
``_prune_for_mod``) so no compile is spent on a config quack would refuse; a config that
still fails to compile or launch is recorded and skipped by the tuner.
"""

from __future__ import annotations

import dataclasses
from typing import Any

QUICK_TILES = {
    (128, 192, True),
    (128, 160, True),
    (128, 128, True),
    (128, 256, False),
    (256, 128, False),
    (256, 192, False),
}
"""(tile_m, tile_n, pingpong) kept by ``--space quick``."""


def _hint(mod: Any) -> str | None:
    return "gated" if mod.mode in ("acc_pair", "packed_cd_b16x2") else None


def legal(mod: Any, cfg: Any) -> bool:
    """Whether quack accepts ``cfg`` for ``mod`` (the structural rules; see module docstring)."""
    if cfg.swap_ab and (mod.mode != "element" or mod.sinks):
        return False
    if mod.mode == "acc_pair" and (cfg.tile_n % 2 or (mod.outputs and cfg.tile_n % 32)):
        return False
    return True


def stage1(mod: Any, space: str = "full") -> list[Any]:
    """Stage-1 configs for ``mod`` (``space``: ``full`` or ``quick``), deduplicated, in a
    stable order. ValueError for another ``space``."""
    from quack.gemm_config import get_all_configs

    if space not in ("full", "quick"):
        raise ValueError(f"--space must be 'full' or 'quick', got {space!r}")
    base = [c for c in get_all_configs(epilogue=_hint(mod)) if c.device_capacity == 9]
    tiles = sorted({(c.tile_m, c.tile_n, c.pingpong) for c in base})
    extra = [
        dataclasses.replace(base[0], tile_m=m, tile_n=n, pingpong=pp, cluster_m=1, cluster_n=1, swap_ab=False)
        for m, n, pp in tiles
    ]
    out, seen = [], set()
    for c in base + extra:
        c = dataclasses.replace(c, is_dynamic_persistent=False)
        if space == "quick" and ((c.tile_m, c.tile_n, c.pingpong) not in QUICK_TILES or c.swap_ab):
            continue
        if c not in seen and legal(mod, c):
            seen.add(c)
            out.append(c)
    return out


def stage2(best: list[Any]) -> list[Any]:
    """The dynamic-persistent variants of ``best`` (stage 1's leaders)."""
    return [dataclasses.replace(c, is_dynamic_persistent=True) for c in best]

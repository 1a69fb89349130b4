"""The tuning table: per GPU, kernel, epilogue and shape bucket, the GEMM config to launch
with and the path (fused or standard) the dispatcher takes.

``generated_kernels/tuning.json`` is written by ``coda-agent tune`` and committed. Each
entry is one measurement, re-verified before it was written:

* ``kernel`` / ``kernel_sha256``: the accepted kernel the config was tuned and verified
  for. An entry whose hash is not the accepted kernel's is ignored (a new kernel is a new
  binary; tune it again), and ``coda-agent regress`` reports it.
* ``gpu``: ``torch.cuda.get_device_name`` of the GPU it was measured on (an H100 and an
  H200 have different winners: memory bandwidth moves the epilogue's cost).
* ``epilogue``: the module-level name of the ``@gemm_epilogue`` mod in the kernel;
  ``bucket``: :func:`bucket` of that GEMM call's (M, N, K).
* ``config``: a ``quack.gemm_config.GemmConfig`` as a dict (:func:`config_from_dict`).
* ``default_ms`` / ``tuned_ms``: the kernel entry at the benchmark shape with the kernel's
  own configs and with this one (medians, same run); ``cublas_ms``: the bare GEMM
  (``torch.mm``) of the same operands; ``standard_ms``: the standard path
  (``torch.compile`` of the spec's reference: cuBLAS + fused elementwise), same run.
* ``route``: ``"fused"`` where ``tuned_ms`` beats ``standard_ms``, else ``"standard"``;
  the ops glue (:mod:`coda_agent.kernels._dispatch`) reads it per kernel and shape.
* ``verified``: the re-verification's date, verdict status and verifier numbers.

Buckets. N and K are exact (weights fix them per model); M, the token rows, is bucketed by
its next power of two (M in (4096, 8192] -> 8192): tile choice moves with the grid's
wave count, which a power-of-two bucket tracks within one wave at these sizes. A shape
with no entry runs the kernel's own config on the fused path.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FORMAT = 1
TABLE_NAME = "tuning.json"


def bucket(m: int, n: int, k: int) -> str:
    """The shape bucket of a GEMM call: ``"M<=8192,N=14336,K=4096"`` (M by its next power
    of two, at least 64; N, K exact)."""
    mb = 64
    while mb < m:
        mb *= 2
    return f"M<={mb},N={n},K={k}"


def call_bucket(args) -> str:
    """The shape bucket of a kernel entry call, from its positional arguments (the first is
    the (M, ...) activation of every routed kernel): ``"M<=8192|x,2048;16384,2048"`` -- M
    by its next power of two, every tensor's shape with its leading M written ``x``,
    non-tensors skipped. The dispatcher's key: it is known before the kernel runs."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    m = int(tensors[0].shape[0])
    mb = 64
    while mb < m:
        mb *= 2
    dims = ";".join(",".join("x" if (i == 0 and d == m) else str(d) for i, d in enumerate(t.shape)) for t in tensors)
    return f"M<={mb}|{dims}"


class Entry(BaseModel):
    """One tuned (kernel, GPU, epilogue, bucket); see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kernel: str
    kernel_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    gpu: str
    epilogue: str
    bucket: str
    shape: str = Field(description="the spec benchmark shape it was measured at")
    config: dict[str, Any]
    default_ms: float = Field(gt=0)
    tuned_ms: float = Field(gt=0)
    cublas_ms: float | None = Field(default=None, gt=0)
    standard_ms: float | None = Field(default=None, gt=0)
    route: Literal["fused", "standard"] = "fused"
    call: str | None = Field(default=None, description="call_bucket() of the entry call it was routed at")
    verified: dict[str, Any] = Field(default_factory=dict)


class Table(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")
    format: Literal[1] = FORMAT
    entries: list[Entry] = Field(default_factory=list)

    def index(self) -> dict[tuple[str, str, str, str], Entry]:
        """(kernel, gpu, epilogue, bucket) -> entry (the last one wins)."""
        return {(e.kernel, e.gpu, e.epilogue, e.bucket): e for e in self.entries}

    def merged(self, new: list[Entry]) -> "Table":
        """This table with ``new`` replacing entries of the same (kernel, gpu, epilogue,
        bucket); the order is stable (kernel, gpu, epilogue, bucket)."""
        idx = self.index()
        for e in new:
            idx[(e.kernel, e.gpu, e.epilogue, e.bucket)] = e
        return Table(entries=[idx[k] for k in sorted(idx)])


def config_from_dict(d: dict[str, Any]):
    """A ``GemmConfig`` from its dict; ValueError naming an unknown field."""
    from quack.gemm_config import GemmConfig

    fields = {f.name for f in dataclasses.fields(GemmConfig)}
    unknown = set(d) - fields
    if unknown:
        raise ValueError(f"tuning config has unknown GemmConfig field(s) {sorted(unknown)} (known: {sorted(fields)})")
    return GemmConfig(**d)


def config_to_dict(cfg) -> dict[str, Any]:
    """The non-default fields of a ``GemmConfig`` plus its tile shape (stable, short)."""
    from quack.gemm_config import GemmConfig

    base = GemmConfig()
    d = dataclasses.asdict(cfg)
    keep = {"tile_m", "tile_n", "pingpong", "cluster_m", "cluster_n", "is_dynamic_persistent"}
    return {k: v for k, v in d.items() if k in keep or v != getattr(base, k)}


def config_name(cfg) -> str:
    """``128x192pp-c2x1`` style label: tile, pingpong (pp) or cooperative (co), cluster,
    then ``-dyn`` (dynamic persistent), ``-swap`` (swap-AB), ``-sw<n>`` (max swizzle) when set."""
    s = f"{cfg.tile_m}x{cfg.tile_n}{'pp' if cfg.pingpong else 'co'}-c{cfg.cluster_m}x{cfg.cluster_n}"
    if cfg.is_dynamic_persistent:
        s += "-dyn"
    if cfg.swap_ab:
        s += "-swap"
    if cfg.max_swizzle_size != 8:
        s += f"-sw{cfg.max_swizzle_size}"
    return s


def default_path() -> Path:
    """``tuning.json`` beside the accepted kernels (``coda_agent.kernels``' folder), found
    without importing that package."""
    spec = importlib.util.find_spec("coda_agent.kernels")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("coda_agent.kernels is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / TABLE_NAME


def load(path: Path | None = None) -> Table:
    """The table at ``path`` (default :func:`default_path`); an empty table when the file
    does not exist. ValueError naming the file and the field on a malformed table."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        return Table()
    try:
        return Table.model_validate(json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a valid tuning table: {e}") from None


def dump(table: Table) -> str:
    """The table as committed: sorted, indented JSON with a trailing newline."""
    return json.dumps(table.model_dump(mode="json"), indent=1, sort_keys=False) + "\n"


class Lookup:
    """Answers the launchers and the dispatcher for one kernel at its accepted hash.

    ``gpu_name(device)`` is injected for tests; by default the CUDA device's name."""

    def __init__(self, table: Table, kernel: str, kernel_sha256: str, gpu_name=None):
        self.kernel = kernel
        self._entries = {
            (e.gpu, e.epilogue, e.bucket): e
            for e in table.entries
            if e.kernel == kernel and e.kernel_sha256 == kernel_sha256
        }
        self._gpu_name = gpu_name or _cuda_name
        # Rationale: read on every residual_rmsnorm call (_rmsnorm._infinite_rows_rstd)
        self._tile_widths = frozenset(int(e.config["tile_n"]) for e in self._entries.values() if "tile_n" in e.config)
        self._configs: dict[tuple[str, str, str], Any] = {}

    def __bool__(self) -> bool:
        return bool(self._entries)

    def tile_widths(self) -> frozenset[int]:
        """Every ``tile_n`` a tuned config of this kernel (any GPU, epilogue, bucket) uses."""
        return self._tile_widths

    def entry(self, epilogue: str, m: int, n: int, k: int, device) -> Entry | None:
        if not self._entries:
            return None
        return self._entries.get((self._gpu_name(device), epilogue, bucket(m, n, k)))

    def config_for(self, epilogue: str, m: int, n: int, k: int, device):
        """The tuned ``GemmConfig`` for this call, or None (the kernel's own config)."""
        e = self.entry(epilogue, m, n, k, device)
        if e is None:
            return None
        key = (e.gpu, e.epilogue, e.bucket)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = config_from_dict(e.config)
        return cfg

    def route(self, call: str, device) -> str:
        """``"standard"`` when an entry of this kernel on ``device``'s GPU at entry-call
        bucket ``call`` (:func:`call_bucket`) routes there, else ``"fused"``."""
        name = self._gpu_name(device)
        for (gpu, _epi, _b), e in self._entries.items():
            if gpu == name and e.call == call and e.route == "standard":
                return "standard"
        return "fused"


@functools.lru_cache(maxsize=None)
def _cuda_name_of(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def _cuda_name(device) -> str:
    import torch

    if getattr(device, "type", "cuda") != "cuda":
        return "cpu"
    return _cuda_name_of(device.index if device.index is not None else torch.cuda.current_device())


def override_lookup(kernel: str, configs: dict[str, dict[str, dict[str, Any]]]):
    """A ``config_for`` callable from ``{epilogue: {bucket: config dict}}`` (the verifier's
    re-verification of tuned configs, ``coda-agent build``; no GPU name check). The bucket
    ``"*"`` stands for every shape of that epilogue."""
    parsed = {(epi, b): config_from_dict(c) for epi, per in configs.items() for b, c in per.items()}

    def config_for(epilogue: str, m: int, n: int, k: int, device):
        hit = parsed.get((epilogue, bucket(m, n, k)))
        return hit if hit is not None else parsed.get((epilogue, "*"))

    return config_for

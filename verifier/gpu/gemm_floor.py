"""The ``quack_gemm`` baseline: quack's own GEMM on the bare GEMM's operands.

Why it exists. The catalogue's forward target is "within 5 % of the bare GEMM", and the
spec's ``bare_gemm`` is ``torch.matmul`` (cuBLAS). A fused kernel, however, runs on
quack's mainloop (the design card forbids writing our own), so fused/bare_gemm mixes two
things: what the epilogue costs, and how quack's mainloop compares with cuBLAS at that
shape. ``quack_gemm`` separates them: it is quack's GEMM with the identity epilogue
(``quack.epilogue.library.identity_epi``, ``tuned=False``: quack's default SM90 config,
no autotuning) on exactly the operands the spec's ``bare_gemm`` hands to ``aten.mm``, so

* fused / quack_gemm   ~ the epilogue's own cost on quack's mainloop (the kernel may
  pick another tile than quack's default, so this can be below 1);
* quack_gemm / bare_gemm ~ quack's default mainloop against cuBLAS at that shape.

How the operands are found. ``bare_gemm`` is an arbitrary PyTorch function of the spec's
inputs (``x @ w.T``; two or three GEMMs for some backward specs), so instead of asking
every spec to restate its GEMMs for quack, :func:`capture_mm_operands` runs it once per
input set, outside any timing, under a ``TorchDispatchMode`` that records the
``(A (M, K), B (K, N))`` operands of every ``aten.mm``/``aten.addmm`` call (a 3-D ``x @ w.T``
folds to one ``mm``; a batched or scaled GEMM is refused), as views with their strides
(``w.T`` stays a transposed view: the K-major B the fused kernels pass too). The timed
call then runs ``identity_epi`` on each recorded pair in order. Intermediate operands
(``logits`` in cross_entropy_bwd's ``logits @ w``) are the tensors cuBLAS produced; only
their shapes and values matter for timing.

It is a timing baseline like the others (outputs not checked), built by the trusted
reference worker; it needs CUDA and quack, and reports an error string otherwise.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "quack_gemm"
"""The baseline's name in plans, verdicts and pages."""

_aten = torch.ops.aten
_UNSUPPORTED = {_aten.bmm.default, _aten.baddbmm.default, _aten.addmm_.default, _aten._scaled_mm.default}
"""GEMMs quack's 2-D identity GEMM cannot stand in for: seeing one is an error, never a
floor that silently times only some of the GEMMs."""


class _MMCapture(TorchDispatchMode):
    """Records the ``(A, B)`` operands of every ``aten.mm`` and ``aten.addmm`` (``F.linear``
    with a bias; the bias add is not a GEMM) dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.unsupported: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 -- torch's protocol
        if func is _aten.mm.default:
            self.pairs.append((args[0], args[1]))
        elif func is _aten.addmm.default:
            self.pairs.append((args[1], args[2]))
        elif func in _UNSUPPORTED:
            self.unsupported.append(str(func))
        return func(*args, **(kwargs or {}))


def capture_mm_operands(
    bare_gemm: Callable[..., Any], inputs: dict[str, Any]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run ``bare_gemm(**inputs)`` once and return the ``(A, B)`` operand pairs of its
    ``aten.mm``/``aten.addmm`` calls, in call order (A: (M, K), B: (K, N), the dtypes and
    strides the call saw). Raises ``ValueError`` when it issues none, or any batched or
    scaled GEMM (:data:`_UNSUPPORTED`): the floor would not time the same work."""
    with torch.no_grad(), _MMCapture() as cap:
        bare_gemm(**inputs)
    if cap.unsupported:
        raise ValueError(
            f"bare_gemm issued {', '.join(sorted(set(cap.unsupported)))}: quack's 2-D GEMM "
            "cannot stand in for it (no quack_gemm floor for this spec)"
        )
    if not cap.pairs:
        raise ValueError("bare_gemm issued no aten.mm call: no operands for quack's GEMM")
    return cap.pairs


def quack_gemm_call(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], Any]:
    """A no-argument callable running quack's identity-epilogue GEMM (default config,
    ``tuned=False``) on each ``(A, B)`` pair; returns the last D (M, N), A's dtype.
    Raises ``ImportError`` when quack is not installed."""
    from quack.epilogue.library import identity_epi

    def call() -> Any:
        d = None
        for a, b in pairs:
            d = identity_epi(a, b, tuned=False)["D"]
        return d

    return call


class Floor:
    """The ``quack_gemm`` baseline of one spec: ``prepare(sets)`` captures ``bare_gemm``'s
    operands for each input set (outside timing) and returns one no-argument call per set.
    Raises as :func:`capture_mm_operands` / :func:`quack_gemm_call` do."""

    def __init__(self, bare_gemm: Callable[..., Any]):
        self.bare_gemm = bare_gemm

    def prepare(self, sets: list[dict[str, Any]]) -> list[Callable[[], Any]]:
        return [quack_gemm_call(capture_mm_operands(self.bare_gemm, s)) for s in sets]

"""The allocator poison, and bit-exact comparison of tensors.

The candidate worker fills the CUDA caching allocator with the 16-bit word
:data:`POISON_WORD16` before every trial (a NaN in bf16 and fp16, and ``0x7FC17FC1``, also
a NaN, in fp32), a bit pattern no arithmetic produces; the correctness stage counts it in
the saved outputs (:func:`poison_count`: memory the kernel never wrote). Pure torch, no
GPU needed: the worker and the parent share these definitions.
"""

from __future__ import annotations

import torch

POISON_WORD16 = 0x7FC1
"""The 16-bit word the candidate worker fills free GPU memory with (a NaN payload)."""

_POISON_BY_SIZE = {
    2: (torch.int16, POISON_WORD16),
    4: (torch.int32, (POISON_WORD16 << 16) | POISON_WORD16),
    8: (torch.int64, (((POISON_WORD16 << 16) | POISON_WORD16) << 32) | (POISON_WORD16 << 16) | POISON_WORD16),
}


def poison_count(t: torch.Tensor) -> int:
    """How many elements of ``t`` (any shape/dtype, CPU) still hold the allocator poison."""
    size = t.element_size()
    if size not in _POISON_BY_SIZE or t.numel() == 0:
        return 0
    itype, word = _POISON_BY_SIZE[size]
    bits = t.detach().contiguous().reshape(-1).view(itype)
    return int((bits == word).sum())


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same shape, dtype and bytes (NaNs compare by bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))

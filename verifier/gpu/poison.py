"""The allocator poison, and bit-exact comparison of tensors.

The candidate worker fills the CUDA caching allocator with the 16-bit word
:data:`POISON_WORD16` before every trial (a NaN in bf16 and fp16, and ``0x7FC17FC1``, also
a NaN, in fp32), a bit pattern no arithmetic produces; the correctness stage counts it in
the saved outputs (:func:`poison_count`: memory the kernel never wrote). The worker lays
the poison (:func:`fill_free_memory`); the parent only reads it, on the CPU.
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import torch

POISON_WORD16 = 0x7FC1
"""The 16-bit word the candidate worker fills free GPU memory with (a NaN payload)."""

_POISON_BY_SIZE = {
    2: (torch.int16, POISON_WORD16),
    4: (torch.int32, (POISON_WORD16 << 16) | POISON_WORD16),
    8: (torch.int64, (((POISON_WORD16 << 16) | POISON_WORD16) << 32) | (POISON_WORD16 << 16) | POISON_WORD16),
}


def poison_count(t: torch.Tensor) -> int:
    """How many elements of ``t`` (any shape/dtype, CPU) still hold the allocator poison. A
    1-byte tensor (fp8) holds the 16-bit word over two elements (a NaN in both fp8
    formats every other byte): each aligned pair holding it counts twice."""
    size = t.element_size()
    if size == 1 and t.numel() >= 2:
        pairs = t.detach().contiguous().reshape(-1)[: t.numel() // 2 * 2].view(torch.int16)
        return 2 * int((pairs == POISON_WORD16).sum())
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


MAX_POISON_BYTES = 16 << 30
"""The largest slack block reserved (and poisoned) before a trial: half the room left in
the worker's memory budget, at most this."""
SMALL_POISON_BLOCKS = 32  # 1 MiB each: allocations <= 1 MiB come from the small pool
SLACK_TRIES = 4
"""Slack sizes tried (halving) when the device cannot hand out the first: another process
holding memory beyond the budgets the scheduler assigned."""

# bound when the worker imports this module, before any candidate code runs
_reserved = torch.cuda.memory_reserved


class PoisonError(RuntimeError):
    """The poison's slack could not be allocated within the worker's budget: the device is
    short of memory that the budgets promised (another process holds it). The verifier's
    trouble; the scheduler re-runs such a verification alone on its GPU
    (``verifier/schedule/retry.py``)."""


def free_block_sizes(snapshot: list[dict[str, Any]], device: int = 0) -> list[int]:
    """Sizes (bytes, largest first) of the free ("inactive") blocks in a
    ``torch.cuda.memory_snapshot()`` for ``device``; allocating them in this order makes
    the allocator's best fit return each block exactly."""
    sizes = []
    for seg in snapshot:
        if seg.get("device", device) != device:
            continue
        for blk in seg.get("blocks", []):
            if blk.get("state") == "inactive" and int(blk.get("size", 0)) > 0:
                sizes.append(int(blk["size"]))
    return sorted(sizes, reverse=True)


def slack_bytes(budget: int, reserved: int) -> int:
    """The slack block's size (bytes, a multiple of 2 MiB): half the room the budget leaves
    beside the ``reserved`` bytes the allocator holds, at most :data:`MAX_POISON_BYTES`.
    Never read from the device's free memory, which another process changes at any time."""
    return max(0, min((budget - reserved) // 2, MAX_POISON_BYTES)) // (2 << 20) * (2 << 20)


def fill_free_memory(device: torch.device, sync: Callable[[], None], budget: int) -> int:
    """Fill every free byte the caching allocator holds (plus slack) with the poison word.

    Called right before each trial's call, with the inputs alive: first slack is
    reserved (one large block of :func:`slack_bytes` within ``budget``, the worker's memory
    budget in bytes (:mod:`~coda_agent.verifier.gpu.memory_budget`), and
    :data:`SMALL_POISON_BLOCKS` small-pool blocks) so the candidate's allocations come from
    cached memory, then every free block in the allocator's snapshot is allocated exactly
    (largest first, so best-fit hands out that very block), everything is filled and
    released; ``sync`` waits for the fill. Returns bytes poisoned. CUDA devices only.

    When the device cannot hand out the slack although the budget allows it, smaller slack
    is tried (:data:`SLACK_TRIES` sizes, halving); then :class:`PoisonError` is raised.
    """
    gc.collect()
    torch.cuda.empty_cache()
    big = slack_bytes(budget, int(_reserved(device)))
    blocks: list[torch.Tensor] = []
    for i in range(SLACK_TRIES):
        try:
            if big > 0:
                blocks.append(torch.empty(big, dtype=torch.uint8, device=device))
            blocks += [torch.empty(1 << 20, dtype=torch.uint8, device=device) for _ in range(SMALL_POISON_BLOCKS)]
            break
        except torch.OutOfMemoryError as e:
            blocks.clear()
            if i == SLACK_TRIES - 1:
                raise PoisonError(
                    f"the allocator poison could not reserve {big} bytes of slack within its budget of "
                    f"{budget} bytes ({_reserved(device)} reserved): the GPU is short of memory the "
                    f"budgets promised ({e})"
                ) from None
            big = big // 2 // (2 << 20) * (2 << 20)
    for size in free_block_sizes(torch.cuda.memory_snapshot(), device.index or 0):
        blocks.append(torch.empty(size, dtype=torch.uint8, device=device))
    for b in blocks:
        b[: b.numel() // 2 * 2].view(torch.int16).fill_(POISON_WORD16)
    sync()
    n = sum(b.numel() for b in blocks)
    del blocks
    return n

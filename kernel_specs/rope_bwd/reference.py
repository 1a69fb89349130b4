"""RoPE backward (CODA catalogue item 10), from the standard definition: the gradient of the
forward rotation, taken by autograd.

The forward (gemm_rope) rotates the query/key column pairs (2j, 2j+1) of rotated head r at
row m by theta[m, r, j] = positions[m] * inv_freq[r, j] (Meta Llama / RoFormer
interleaved pairs: out = (x cos - y sin, x sin + y cos)) and passes the value columns
through. Its backward maps the upstream gradient with the transposed rotation R^T. Here
the upstream gradient is the output of the GEMM it is fused into, dqkv_rot = g @ w^T; the
reference takes d rope(qkv) / d qkv with torch.autograd, through the same forward as
gemm_rope's reference (rope is linear, so the point it is taken at does not matter: a zero
leaf), never through a hand-written inverse. The fused kernel applies R^T (rotation by
-theta) to the fp32 accumulator in the GEMM epilogue.
"""

import torch
import torch.nn.functional as F

ROPE_THETA = 500000.0
"""Llama 3's RoPE base."""


def llama3_inv_freq(*, dims, **_earlier):
    """inv_freq (HQ+HKV, HD/2) float32: 1 / 500000^(2j/HD) for pair j, the same row for
    every rotated head (the HQ query heads, then the HKV key heads).

    A ``derived`` input: computed from the shape binding ``dims`` (HQ, HKV, HD) alone; the
    earlier inputs it receives are ignored. Llama 3.1's long-context frequency scaling is
    another transform of these values and is not applied here."""
    hd = dims["HD"]
    row = 1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    return row.float().expand(dims["HQ"] + dims["HKV"], -1).contiguous()


def rope(qkv, positions, inv_freq):
    """The forward RoPE (gemm_rope's), differentiable: interleaved pairs of the query/key
    heads rotated, value heads unchanged.

    qkv (M, N) any float dtype, N = (HQ+2*HKV)*HD; positions (M,) integer; inv_freq
    (HQ+HKV, HD/2). Returns (M, N) in qkv's dtype: the rotation in fp32 (or qkv's dtype
    when wider) from float64 angles, one rounding to qkv's dtype; the value columns are
    qkv's own."""
    acc = torch.promote_types(qkv.dtype, torch.float32)
    m = qkv.shape[0]
    heads, half = inv_freq.shape
    n_rot = heads * 2 * half  # the query and key columns
    theta = positions.double()[:, None, None] * inv_freq.double()[None, :, :]  # (M, H, HD/2)
    cos, sin = theta.cos().to(acc), theta.sin().to(acc)
    pairs = qkv[:, :n_rot].to(acc).reshape(m, heads, half, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).reshape(m, n_rot)
    return torch.cat((rotated.to(qkv.dtype), qkv[:, n_rot:]), dim=1)


def reference(*, g, w, positions, inv_freq):
    """dqkv (M, (HQ+2*HKV)*HD) in the inputs' dtype: the vector-Jacobian product of rope
    with the upstream gradient g @ w^T (rounded to the inputs' dtype, as the producing
    GEMM's output would be), by torch.autograd. Works under no_grad (the verifier's)."""
    upstream = g @ w.T
    with torch.enable_grad():
        qkv = torch.zeros_like(upstream, requires_grad=True)
        (dqkv,) = torch.autograd.grad(rope(qkv, positions, inv_freq), qkv, grad_outputs=upstream)
    return {"dqkv": dqkv.detach()}


def baseline(*, g, w, positions, inv_freq):
    """The unfused PyTorch code the kernel replaces: the cuBLAS GEMM producing the gradient,
    then the inverse rotation written out in fp32 (one cos/sin table of the positions,
    broadcast over the heads -- Llama's heads share their frequencies), cast back."""
    d = F.linear(g, w)
    heads, half = inv_freq.shape
    n_rot = heads * 2 * half
    theta = positions.double()[:, None] * inv_freq[0].double()[None, :]  # (M, HD/2)
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    pairs = d[:, :n_rot].float().unflatten(1, (heads, half, 2))
    dx, dy = pairs[..., 0], pairs[..., 1]
    back = torch.stack((dx * cos + dy * sin, dy * cos - dx * sin), dim=-1).flatten(1)
    return {"dqkv": torch.cat((back.type_as(d), d[:, n_rot:]), dim=1)}


def bare_gemm(*, g, w, positions, inv_freq):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return g @ w.T


def quack_freq_table(inv_freq, n):
    """quack's per-column frequency table (n,) float32 for rope_posfreq_epi, NEGATED:
    make_interleaved_inv_freq's float-float (hi, lo) split of inv_freq / 2pi at columns
    (2j, 2j+1) of each rotated head, zeros over the value columns, times -1. Negating both
    halves of a float-float pair is exact and negates its value, so the kernel's angle
    pos * (hi + lo) becomes -theta: the rotation R(-theta) = R(theta)^T. The zeros stay
    zeros (angle 0, V unchanged)."""
    from quack.epilogue.rotary import make_interleaved_inv_freq

    n_rot = 2 * inv_freq.numel()
    return -make_interleaved_inv_freq(inv_freq, n_rot, n - n_rot)


def quack_library(*, g, w, positions, inv_freq):
    """quack's hand-written equivalent: the forward's rope_posfreq_epi with the negated
    frequency table (rotation by -theta = R^T), positions as a per-row fp32 vector."""
    from quack.epilogue.rotary import rope_posfreq_epi

    freq = quack_freq_table(inv_freq, w.shape[0])
    out = rope_posfreq_epi(g, w.T, tuned=False, pos=positions.float(), freq=freq)
    return {"dqkv": out["D"]}

"""RoPE backward (CODA catalogue item 10), from the standard definition: the gradient of the
forward rotation, taken by autograd.

The forward (gemm_rope) rotates the column pairs (2j, 2j+1) of the HQ query and HKV key
heads at row m by theta[m, j] = positions[m] * inv_freq[j] (Meta Llama / RoFormer
interleaved pairs: out = (x cos - y sin, x sin + y cos)) and passes the HKV value heads
through (HQ, HKV: the spec's constants, keyword ints). Its backward maps the upstream
gradient with the transposed rotation R^T. Here the upstream gradient is the output of the
GEMM it is fused into, dqkv_rot = g @ w^T; the reference takes d rope(qkv) / d qkv with
torch.autograd, through the same forward as gemm_rope's reference (rope is linear, so the
point it is taken at does not matter: a zero leaf), never through a hand-written inverse.
The fused kernel applies R^T (rotation by -theta) to the fp32 accumulator in the GEMM
epilogue.
"""

import torch
import torch.nn.functional as F

ROPE_THETA = 500000.0
"""Llama 3's RoPE base."""


def llama3_inv_freq(*, dims, **_earlier):
    """inv_freq (HD/2,) float32: 1 / 500000^(2j/HD) for rotation pair j (Llama 3).

    A ``derived`` input: computed from the shape binding ``dims`` (HD) alone; the earlier
    inputs it receives are ignored. Llama 3.1's long-context frequency scaling is another
    transform of these values and is not applied here."""
    hd = dims["HD"]
    return (1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float()


def rope(qkv, positions, inv_freq, n_rot):
    """The forward RoPE (gemm_rope's), differentiable: the interleaved pairs of the first
    n_rot columns (the query and key heads) rotated, the value columns unchanged.

    qkv (M, N) any float dtype; positions (M,) integer; inv_freq (HD/2,); n_rot a multiple
    of HD. Returns (M, N) in qkv's dtype: the rotation in fp32 (or qkv's dtype when wider)
    from float64 angles, one rounding to qkv's dtype; the value columns are qkv's own."""
    acc = torch.promote_types(qkv.dtype, torch.float32)
    m, half = qkv.shape[0], inv_freq.shape[0]
    theta = positions.double()[:, None] * inv_freq.double()[None, :]  # (M, HD/2)
    cos, sin = theta.cos().to(acc)[:, None, :], theta.sin().to(acc)[:, None, :]
    pairs = qkv[:, :n_rot].to(acc).reshape(m, n_rot // (2 * half), half, 2)  # (M, heads, HD/2, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).reshape(m, n_rot)
    return torch.cat((rotated.to(qkv.dtype), qkv[:, n_rot:]), dim=1)


def reference(*, g, w, positions, inv_freq, HQ, HKV):
    """dqkv (M, (HQ+2*HKV)*HD) in the inputs' dtype: the vector-Jacobian product of rope
    with the upstream gradient g @ w^T (in the inputs' dtype, as the producing GEMM's
    output would be), by torch.autograd. Works under no_grad (the verifier's)."""
    n_rot = (HQ + HKV) * 2 * inv_freq.shape[0]
    upstream = g @ w.T
    with torch.enable_grad():
        qkv = torch.zeros_like(upstream, requires_grad=True)
        y = rope(qkv, positions, inv_freq, n_rot)
        (dqkv,) = torch.autograd.grad(y, qkv, grad_outputs=upstream)
    return {"dqkv": dqkv.detach()}


def baseline(*, g, w, positions, inv_freq, HQ, HKV):
    """The unfused PyTorch code the kernel replaces: the cuBLAS GEMM producing the gradient,
    then the inverse rotation written out in fp32 (one cos/sin table of the positions,
    broadcast over the Q and K heads), cast back."""
    d = F.linear(g, w)
    half = inv_freq.shape[0]
    n_rot = (HQ + HKV) * 2 * half
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    pairs = d[:, :n_rot].float().unflatten(1, (HQ + HKV, half, 2))
    dx, dy = pairs[..., 0], pairs[..., 1]
    back = torch.stack((dx * cos + dy * sin, dy * cos - dx * sin), dim=-1).flatten(1)
    return {"dqkv": torch.cat((back.type_as(d), d[:, n_rot:]), dim=1)}


def bare_gemm(*, g, w, positions, inv_freq, HQ, HKV):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return g @ w.T


def quack_freq_table(inv_freq, HQ, HKV):
    """quack's per-column frequency table ((HQ+2*HKV)*HD,) float32 for rope_posfreq_epi,
    NEGATED: make_interleaved_inv_freq's float-float (hi, lo) split of inv_freq / 2pi at
    columns (2j, 2j+1) of each query and key head, zeros over the value columns, times -1.
    Negating both halves of a float-float pair is exact and negates its value, so the
    kernel's angle pos * (hi + lo) becomes -theta: the rotation R(-theta) = R(theta)^T.
    The zeros stay (signed) zeros: angle 0, V unchanged."""
    from quack.epilogue.rotary import make_interleaved_inv_freq

    hd = 2 * inv_freq.shape[0]
    return -make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)


def quack_library(*, g, w, positions, inv_freq, HQ, HKV):
    """quack's hand-written equivalent: the forward's rope_posfreq_epi with the negated
    frequency table (rotation by -theta = R^T), positions as a per-row fp32 vector."""
    from quack.epilogue.rotary import rope_posfreq_epi

    freq = quack_freq_table(inv_freq, HQ, HKV)
    out = rope_posfreq_epi(g, w.T, tuned=False, pos=positions.float(), freq=freq)
    return {"dqkv": out["D"]}

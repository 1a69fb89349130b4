"""QKV projection + rotary position embedding (CODA catalogue item 5), from the standard
definition.

qkv = x @ W_qkv^T, columns laid out as HQ query heads, then HKV key heads, then HKV value
heads, HD contiguous columns each (HQ and HKV are the spec's constants: keyword ints, since
no tensor shape tells them apart; HD = 2 * len(inv_freq)). Every query and key head is
rotated by RoPE in the Meta Llama / RoFormer interleaved-pair convention: the pair
(2j, 2j+1) of a head, at row m, turns by theta[m, j] = positions[m] * inv_freq[j]:

    out[2j]     = x cos(theta) - y sin(theta)
    out[2j + 1] = x sin(theta) + y cos(theta)        (x = column 2j, y = column 2j+1)

The value heads pass through unchanged. As in Meta's apply_rotary_emb, the rotation runs
in fp32 (float64 when the inputs are float64) on the projection's output and is rounded
to the activation dtype; the angles are computed in float64 before cos/sin, so long
positions keep their precision. The fused kernel instead rotates the fp32 accumulator in
the GEMM epilogue (one rounding, no qkv round trip through memory).
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


def _rope(qkv, positions, inv_freq, n_rot):
    """Standard interleaved RoPE of the first n_rot columns of qkv (the query and key heads),
    the other columns (the value heads) unchanged.

    qkv (M, N) any float dtype; positions (M,) integer; inv_freq (HD/2,); n_rot a multiple
    of HD. Returns (M, N) in qkv's dtype: the rotation in fp32 (or qkv's dtype when wider)
    from float64 angles, one rounding to qkv's dtype; the value columns are qkv's own, bit
    for bit."""
    acc = torch.promote_types(qkv.dtype, torch.float32)
    m, half = qkv.shape[0], inv_freq.shape[0]
    theta = positions.double()[:, None] * inv_freq.double()[None, :]  # (M, HD/2)
    cos, sin = theta.cos().to(acc)[:, None, :], theta.sin().to(acc)[:, None, :]
    pairs = qkv[:, :n_rot].to(acc).reshape(m, n_rot // (2 * half), half, 2)  # (M, heads, HD/2, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).reshape(m, n_rot)
    return torch.cat((rotated.to(qkv.dtype), qkv[:, n_rot:]), dim=1)


def reference(*, x, w_qkv, positions, inv_freq, HQ, HKV):
    """qkv (M, (HQ+2*HKV)*HD) in the activations' dtype: RoPE(x @ w_qkv^T)."""
    n_rot = (HQ + HKV) * 2 * inv_freq.shape[0]
    return {"qkv": _rope(x @ w_qkv.T, positions, inv_freq, n_rot)}


def baseline(*, x, w_qkv, positions, inv_freq, HQ, HKV):
    """The unfused PyTorch code the kernel replaces: the cuBLAS GEMM, then the rotation in
    fp32 (HF/Meta style: one cos/sin table of the positions, broadcast over the Q and K
    heads, applied to the pairs, cast back). The angles are float64, as in the reference:
    fp32 angles (Meta's precompute_freqs_cis) are off by ~4e-3 rad at 128k positions, and
    the (M, HD/2) table costs nothing either way."""
    qkv = F.linear(x, w_qkv)
    half = inv_freq.shape[0]
    n_rot = (HQ + HKV) * 2 * half
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    pairs = qkv[:, :n_rot].float().unflatten(1, (HQ + HKV, half, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(1)
    return {"qkv": torch.cat((rotated.type_as(qkv), qkv[:, n_rot:]), dim=1)}


def bare_gemm(*, x, w_qkv, positions, inv_freq, HQ, HKV):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return x @ w_qkv.T


def quack_freq_table(inv_freq, HQ, HKV):
    """quack's per-column frequency table ((HQ+2*HKV)*HD,) float32 for rope_posfreq_epi:
    inv_freq / 2pi (the kernel's angle unit is turns) split into float-float (hi, lo) pairs
    at columns (2j, 2j+1) of each query and key head, and zeros over the HKV*HD value
    columns (angle 0: an exact identity, so V passes through bit for bit)."""
    from quack.epilogue.rotary import make_interleaved_inv_freq

    hd = 2 * inv_freq.shape[0]
    return make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)


def quack_library(*, x, w_qkv, positions, inv_freq, HQ, HKV):
    """quack's hand-written equivalent: rope_posfreq_epi (acc_pair mode), positions as a
    per-row fp32 vector (ColVecLoad; exact below 2^24) and the float-float frequency table
    as a per-column vector (RowVecLoad); sin/cos are computed in the epilogue."""
    from quack.epilogue.rotary import rope_posfreq_epi

    freq = quack_freq_table(inv_freq, HQ, HKV)
    out = rope_posfreq_epi(x, w_qkv.T, tuned=False, pos=positions.float(), freq=freq)
    return {"qkv": out["D"]}

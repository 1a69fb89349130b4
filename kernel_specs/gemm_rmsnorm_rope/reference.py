"""Deferred RMSNorm + QKV projection + rotary position embedding (CODA catalogue item 5,
the deferred-rstd variant), from the standard definition.

Standard order: normalize, project, rotate. The input a = y * gamma comes from the
producing GEMM (gemm_residual_partial_rms) with the row scale rstd deferred, so
h = a * rstd[:, None] is exactly RMSNorm(y) with weight gamma; the reference computes h
first (fp32, rounded to the activation dtype as nn.RMSNorm's output is, as gemm_rmsnorm's
reference does), then qkv = h @ W_qkv^T, columns laid out as HQ query heads, then HKV key
heads, then HKV value heads, HD contiguous columns each. Every query and key head is
rotated by RoPE in the Meta Llama / RoFormer interleaved-pair convention: the pair
(2j, 2j+1) of rotated head r, at row m, turns by theta[m, r, j] = positions[m] * inv_freq[r, j]:

    out[2j]     = x cos(theta) - y sin(theta)
    out[2j + 1] = x sin(theta) + y cos(theta)        (x = column 2j, y = column 2j+1)

The value heads pass through unchanged. As in Meta's apply_rotary_emb, the rotation runs
in fp32 (float64 when the inputs are float64) on the projection's output and is rounded
to the activation dtype; the angles are computed in float64 before cos/sin, so long
positions keep their precision. The fused kernel instead scales the fp32 accumulator by
rstd (the row scale commutes with the GEMM and with the rotation) and rotates it in the
GEMM epilogue (one rounding, no round trip of h or qkv through memory).

inv_freq holds one row per rotated head (HQ query heads, then HKV key heads): its shape
is what tells where the value heads begin. Llama uses the same row for every head,
1 / 500000^(2j/HD) (llama3_inv_freq).
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


def _rope(qkv, positions, inv_freq):
    """Standard interleaved RoPE of the query/key heads of qkv, value heads unchanged.

    qkv (M, N) any float dtype, N = (HQ+2*HKV)*HD; positions (M,) integer; inv_freq
    (HQ+HKV, HD/2). Returns (M, N) in qkv's dtype: the rotation in fp32 (or qkv's dtype
    when wider) from float64 angles, one rounding to qkv's dtype; the value columns are
    qkv's own, bit for bit."""
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


def _rmsnorm(a, rstd):
    """RMSNorm(y) * gamma from its deferred form, computed in fp32 (or wider), activation dtype out."""
    acc = torch.promote_types(a.dtype, torch.float32)
    return (a.to(acc) * rstd.to(acc)[:, None]).to(a.dtype)


def reference(*, a, rstd, w_qkv, positions, inv_freq):
    """qkv (M, (HQ+2*HKV)*HD) in the activations' dtype: RoPE(RMSNorm(y) @ w_qkv^T)."""
    return {"qkv": _rope(_rmsnorm(a, rstd) @ w_qkv.T, positions, inv_freq)}


def baseline(*, a, rstd, w_qkv, positions, inv_freq):
    """The unfused PyTorch code the kernel replaces: the RMSNorm row scale, the cuBLAS GEMM,
    then the rotation in fp32 (HF/Meta style: one cos/sin table of the positions, broadcast
    over the heads -- Llama's heads share their frequencies -- applied to the pairs, cast
    back). The angles are float64, as in the reference: fp32 angles (Meta's
    precompute_freqs_cis) are off by ~4e-3 rad at 128k positions, and the (M, HD/2) table
    costs nothing either way."""
    h = (a.float() * rstd[:, None]).to(a.dtype)
    qkv = F.linear(h, w_qkv)
    heads, half = inv_freq.shape
    n_rot = heads * 2 * half
    theta = positions.double()[:, None] * inv_freq[0].double()[None, :]  # (M, HD/2)
    cos, sin = theta.cos().float()[:, None, :], theta.sin().float()[:, None, :]
    pairs = qkv[:, :n_rot].float().unflatten(1, (heads, half, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(1)
    return {"qkv": torch.cat((rotated.type_as(qkv), qkv[:, n_rot:]), dim=1)}


def bare_gemm(*, a, rstd, w_qkv, positions, inv_freq):
    """The GEMM alone, same M/N/K: the speed-of-light floor for a hidden epilogue."""
    return a @ w_qkv.T


def quack_freq_table(inv_freq, n):
    """quack's per-column frequency table (n,) float32 for rope_posfreq_epi: inv_freq / 2pi
    (the kernel's angle unit is turns) split into float-float (hi, lo) pairs at columns
    (2j, 2j+1) of each rotated head, and zeros over the n - 2*inv_freq.numel() value
    columns (angle 0: an exact identity, so V passes through bit for bit)."""
    from quack.epilogue.rotary import make_interleaved_inv_freq

    n_rot = 2 * inv_freq.numel()
    return make_interleaved_inv_freq(inv_freq, n_rot, n - n_rot)


def quack_library(*, a, rstd, w_qkv, positions, inv_freq):
    """quack's hand-written equivalent: rstd_rope_posfreq_epi (acc_pair mode): the
    accumulator scaled by rstd (ColVecLoad), then rotated as rope_posfreq_epi does --
    positions as a per-row fp32 vector (ColVecLoad; exact below 2^24), the float-float
    frequency table as a per-column vector (RowVecLoad), sin/cos computed in the epilogue."""
    from quack.epilogue.rotary import rstd_rope_posfreq_epi

    freq = quack_freq_table(inv_freq, w_qkv.shape[0])
    out = rstd_rope_posfreq_epi(
        a, w_qkv.T, tuned=False, pos=positions.float(), freq=freq, rstd=rstd
    )
    return {"qkv": out["D"]}


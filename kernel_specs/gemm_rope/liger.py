"""Liger Kernel baseline for gemm_rope (``coda-agent bench``'s ``liger`` column).

A comparison, not the definition: this file is deliberately NOT part of the spec hash
(verifier/spec/loading.py ``spec_hash`` covers spec.toml and reference.py only), so adding or
fixing it never invalidates an accepted kernel. Only its time is compared; its outputs
are not checked against the reference. Needs liger-kernel (``pip install
coda-agent[bench]``); it is imported inside ``liger`` so this module imports without it.
"""

import torch
import torch.nn.functional as F


def liger(*, x, w_qkv, positions, inv_freq, HQ, HKV):
    """How a Liger-patched HF Llama attention computes QKV + RoPE: the q, k and v
    projections on cuBLAS (F.linear on the row blocks of w_qkv: contiguous slices, no
    copy; outputs contiguous), the HF cos/sin table of the positions (angles
    positions * inv_freq in fp32, duplicated to HD columns, shape (1, M, HD)), then
    Liger's Triton RoPE (liger_kernel.ops.rope.LigerRopeFunction) on
    q (1, HQ, M, HD) and k (1, HKV, M, HD), views of the projections' (M, H*HD) outputs,
    rotated in place (batch 1, sequence = the M rows).

    Not the same outputs as the fused kernel: Liger implements HF's rotate_half
    convention (pair j with j + HD/2), which is the spec's interleaved (2j, 2j+1) rotation
    with each head's columns permuted (equivalently, W_qkv's rows permuted once per head),
    so the cost is the same; the ratio compares time only. q, k, v come back as three
    tensors, not one packed (M, N) qkv: attention consumes them separately, and packing
    them would add a copy no HF model makes (one projection of the packed w_qkv followed
    by q/k views would instead make Liger copy q and k to contiguous buffers). The cos/sin
    table (a few tiny (M, HD) kernels, built once per forward and shared by all layers
    in a model) is timed here, as in the torch_eager baseline. cos/sin are fp32, so the
    rotation runs in fp32 and is rounded to bf16 at the store (HF casts the table to the
    activation dtype; the kernel's cost is the same).

    Returns {"q": (1, HQ, M, HD), "k": (1, HKV, M, HD), "v": (1, HKV, M, HD)} in the input
    dtype (q and k rotated)."""
    from liger_kernel.ops.rope import LigerRopeFunction

    hd = 2 * inv_freq.shape[0]
    m = x.shape[0]
    nq, nk = HQ * hd, HKV * hd
    q = F.linear(x, w_qkv[:nq]).view(1, m, HQ, hd).transpose(1, 2)
    k = F.linear(x, w_qkv[nq : nq + nk]).view(1, m, HKV, hd).transpose(1, 2)
    v = F.linear(x, w_qkv[nq + nk :]).view(1, m, HKV, hd).transpose(1, 2)
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # (M, HD/2)
    emb = torch.cat((freqs, freqs), dim=-1)[None]  # (1, M, HD), HF layout
    q, k = LigerRopeFunction.apply(q, k, emb.cos(), emb.sin())
    return {"q": q, "k": k, "v": v}

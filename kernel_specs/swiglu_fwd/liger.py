"""Liger Kernel baseline for swiglu_fwd (``coda-agent bench``'s ``liger`` column).

A comparison, not the definition: this file is deliberately NOT part of the spec hash
(verifier/spec/loading.py ``spec_hash`` covers spec.toml and reference.py only), so adding or
fixing it never invalidates an accepted kernel. Only its time is compared; its outputs
are not checked against the reference. Needs liger-kernel (``pip install
coda-agent[bench]``); it is imported inside ``liger`` so this module imports without it.
"""

import torch.nn.functional as F


def liger(*, x, w1):
    """How a Liger-patched Llama MLP computes the gate/up projection and SwiGLU
    (liger_kernel.transformers.swiglu.LigerSwiGLUMLP): two cuBLAS projections, gate = x @
    W_gate^T and up = x @ W_up^T, then Liger's Triton SiLU-mul kernel
    (liger_kernel.ops.swiglu.LigerSiLUMulFunction: postact = silu(gate) * up, silu in fp32
    rounded to the input dtype before the multiply).

    w1 interleaves the gate and up rows (row 2j gate unit j, row 2j+1 up unit j), so
    W_gate = w1[0::2] and W_up = w1[1::2]: row-strided views that cuBLAS reads in place
    (leading dimension 2K, no copy), and each projection's output is contiguous, which
    Liger needs (its forward is wrapped in ``ensure_contiguous``, which would otherwise
    copy). Splitting one interleaved preact = x @ w1^T instead (gate = preact[:, 0::2],
    up = preact[:, 1::2]) would make Liger copy both strided halves (an extra read and
    write of the (M, 2I) preact) that no Liger model pays; this layout keeps Liger's
    best case. The same bytes are written as by the fused kernel (gate and up = preact,
    plus postact), but preact is returned as two (M, I) halves, not interleaved.

    Returns {"gate", "up", "postact"} in the input dtype."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    gate = F.linear(x, w1[0::2])
    up = F.linear(x, w1[1::2])
    return {"gate": gate, "up": up, "postact": LigerSiLUMulFunction.apply(gate, up)}

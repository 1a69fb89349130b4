"""Liger Kernel baseline for gemm_residual_partial_rms (``coda-agent bench``'s ``liger`` column).

A comparison, not the definition: this file is deliberately NOT part of the spec hash
(verifier/spec/loading.py ``spec_hash`` covers spec.toml and reference.py only), so adding or
fixing it never invalidates an accepted kernel. Only its time is compared; its outputs
are not checked against the reference. Needs liger-kernel (``pip install
coda-agent[bench]``); it is imported inside ``liger`` so this module imports without it.
"""

import torch.nn.functional as F

EPS = 1e-6  # the spec's RMSNorm eps


def liger(*, x, w_o, residual, gamma):
    """The out-projection on cuBLAS, then Liger's fused residual-add + RMSNorm
    (liger_kernel.ops.fused_add_rms_norm.LigerFusedAddRMSNormFunction, the op behind
    liger_kernel.transformers.LigerFusedAddRMSNorm; Llama casting mode, eps 1e-6, no
    offset): one Triton pass reads acc and residual and writes y = acc + residual and
    RMSNorm(y) * gamma. That is Liger's strongest form of this op: the HF monkey patch
    instead adds the residual in torch and runs LigerRMSNorm on y, one more (M, N) pass.

    Not the same outputs as the fused kernel: Liger writes the fully normalized row
    y * rstd * gamma (its rstd stays in its autograd context), not y * gamma and rstd
    separately. It is the same memory-traffic class (two (M, N) writes after the GEMM,
    plus the (M, N) acc round trip the fused kernel avoids); the ratio compares time only.

    Returns {"resid_out": y, "normed_w": RMSNorm(y) * gamma} in the input dtype."""
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    acc = F.linear(x, w_o)
    # apply(X, R, W, eps, offset, casting_mode, in_place) -> (normed, X + R)
    normed, y = LigerFusedAddRMSNormFunction.apply(acc, residual, gamma, EPS, 0.0, "llama", False)
    return {"resid_out": y, "normed_w": normed}

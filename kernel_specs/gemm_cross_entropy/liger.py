"""Liger Kernel baseline for gemm_cross_entropy (``coda-agent bench``'s ``liger`` column).

A comparison, not the definition: this file is deliberately NOT part of the spec hash
(verifier/spec/loading.py ``spec_hash`` covers spec.toml and reference.py only), so adding or
fixing it never invalidates an accepted kernel. Only its time is compared; its outputs
are not checked against the reference. Needs liger-kernel (``pip install
coda-agent[bench]``); it is imported inside ``liger`` so this module imports without it.
"""


def liger(*, h, w_vocab, target):
    """Liger's fused linear cross-entropy, forward only
    (liger_kernel.ops.fused_linear_cross_entropy.LigerFusedLinearCrossEntropyFunction,
    reduction="none", no bias / class weights / smoothing / softcap).

    What Liger does (0.8.5): it splits the M rows into chunks of about M*K/V rows
    (next power of two; 256 rows at the 1B shapes), and per chunk writes the bf16 logits
    (chunk, V) with cuBLAS into one reused buffer, then runs its Triton cross-entropy
    kernel over them (per-row loss; the lse stays inside the kernel). So the logits do
    make a round trip through memory, a chunk at a time, and the call does one host sync
    (``(target != ignore_index).sum().item()``).

    Gradients: Liger normally computes dh and dW inside this forward (into the logits
    buffer, then two GEMMs per chunk) when h or W requires grad; with reduction="none"
    and inputs that require grad it defers them to its backward instead. Here h and
    w_vocab do not require grad (and the bench runs under no_grad), so its forward skips
    all gradient work (HAS_GRADIENTS=False in the CE kernel, no dgrad/wgrad GEMMs); it
    still allocates a zero (M, K) grad_input it never fills (a memset). That makes this a
    like-for-like forward comparison with the fused kernel.

    Returns {"loss": (M,) fp32}: Liger does not expose the per-row lse."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    # apply(_input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
    #       label_smoothing, reduction) -> (loss, z_loss, token_accuracy, predicted_tokens)
    loss = LigerFusedLinearCrossEntropyFunction.apply(h, w_vocab, target, None, None, -100, 0.0, 0.0, "none")[0]
    return {"loss": loss}

"""Threat 18: quack's own library epilogue shipped as the kernel.

SPEC: gemm_rope
EXPECT: static library-epilogue

``quack.epilogue.library`` is off limits because its ready-made mods are the
``quack_library`` baseline, but ``quack.epilogue.rotary`` (allowed for its helpers such as
``make_interleaved_inv_freq``) re-exports the same mods. The candidate's own epilogue is
named only in a branch that never runs (so ``no-epilogue-call`` holds) and the work is
``rope_posfreq_epi``: correct, within the launch budget, and exactly the baseline. Any
quack epilogue mod reached through an allowed module is now ``library-epilogue``.
"""
import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.rotary import make_interleaved_inv_freq, rope_posfreq_epi  # expect: library-epilogue


@gemm_epilogue()
def my_rope_epi(acc):
    return {"D": acc}


def gemm_rope(x, w_qkv, positions, inv_freq, *, HQ, HKV):
    hd = 2 * inv_freq.shape[0]
    if hd < 0:
        my_rope_epi(x, w_qkv.T, tuned=False)
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)
    return rope_posfreq_epi(x, w_qkv.T, tuned=False, pos=positions.float(), freq=freq)["D"]  # expect: library-epilogue

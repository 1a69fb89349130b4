"""Threat 17: an unfused op inside the launch budget.

SPEC: gemm_cross_entropy
EXPECT: gpu workspace

The epilogue stores the raw fp32 accumulator -- the whole (M, V) logits tensor -- and
selects each row's target logit; the log-sum-exp is then the spec's own finalize function
(`torch.logsumexp`, allowed for the (M, n_tiles) partials) run over the full logits.
Numerically it is the reference (fp32 throughout), and one GEMM + 9 logsumexp kernels +
1 subtraction fit the spec's 13 launches. The spec says the logits are never
materialized: the worker measures each counted call's workspace (device memory beyond
inputs and outputs) against the spec's budget, at every correctness and benchmark shape.
"""
import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import ColVecLoad, ColVecSelect

TARGET = ColVecLoad("target")


@gemm_epilogue(outs={"tgt": ColVecSelect("tgt", idx_op=TARGET)}, extra_ops=(TARGET,))
def logits_epi(acc):
    return {"D": acc, "tgt": acc}


def gemm_cross_entropy(h, w_vocab, target):
    m = h.shape[0]
    tgt = torch.empty(m, dtype=torch.float32, device=h.device)
    res = logits_epi(h, w_vocab.T, tuned=False, out_dtype=torch.float32, target=target, tgt=tgt)
    lse = torch.logsumexp(res["D"], dim=-1)   # over the (M, V) fp32 logits in HBM
    return lse - tgt, lse

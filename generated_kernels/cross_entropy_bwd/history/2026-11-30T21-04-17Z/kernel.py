import torch
import cutlass
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import ColVecLoad, RowVecLoad


# GEMM 1 epilogue: recompute the logits in registers and turn them into dlogits.
#   g = softmax(logits)[m, v] * dloss[m] = exp(acc - lse[m]) * dloss[m]
#   dlogits = g - dloss[m] at column target[m], g elsewhere
# The column index comes in as data: a fp32 row vector col[v] = v, compared with the
# target index (a column vector that arrives as fp32). All four vectors are pinned,
# so the call still works when M == V.
@gemm_epilogue(
    ops={
        "lse": ColVecLoad("lse"),
        "dloss": ColVecLoad("dloss"),
        "target": ColVecLoad("target"),
        "col": RowVecLoad("col"),
    }
)
def ce_dlogits_epi(acc, lse, dloss, target, col):
    g = cute.math.exp(acc - lse, fastmath=True) * dloss
    return {"D": cutlass.select_(col == target, g - dloss, g)}


# Plain GEMM: identity epilogue, D = acc rounded once to bf16 at the store.
@gemm_epilogue()
def plain_gemm_epi(acc):
    return {"D": acc}


def cross_entropy_bwd(h, w_vocab, target, lse, dloss):
    # h (M, K) bf16, w_vocab (V, K) bf16 (nn.Linear layout), target (M,) int64,
    # lse (M,) fp32, dloss (M,) fp32
    v = w_vocab.shape[0]

    # The one allowed host op: the column indices (exact fp32 integers, V < 2^24).
    col = torch.arange(v, dtype=torch.float32, device=h.device)

    # GEMM 1: M x V x K, logits = h @ W^T kept in registers; the epilogue writes dlogits (bf16).
    dlogits = ce_dlogits_epi(
        h, w_vocab.T, tuned=False,
        lse=lse.view(1, -1), dloss=dloss.view(1, -1),
        target=target.view(1, -1), col=col.view(1, -1),
    )["D"]

    # GEMM 2 (dgrad): M x K x V, dh = dlogits @ W_vocab (B = W_vocab (V, K) as is).
    dh = plain_gemm_epi(dlogits, w_vocab, tuned=False)["D"]

    # GEMM 3 (wgrad): V x K x M, dw_vocab = dlogits^T @ h (A is a transposed view, no copy).
    dw_vocab = plain_gemm_epi(dlogits.T, h, tuned=False)["D"]

    return dh, dw_vocab

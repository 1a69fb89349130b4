import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import ColVecLoad, ColVecSelect, OnlineLSEReduce
from quack.gemm_config import GemmConfig

# quack's SM90 default tile (128x192 pingpong), pinned so the LSE partial buffer's
# width ceil(V / tile_n) is known; measured best for the online-LSE epilogue at K <= 4096.
CFG_PINGPONG = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1,
                          is_dynamic_persistent=False)
# 128x256 cooperative: ties/wins from K=8192 up (quack's default-tile library kernel is
# slower there).
CFG_COOP = GemmConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1,
                      is_dynamic_persistent=False)

TARGET = ColVecLoad("target")            # per-row class index feeding ColVecSelect


# acc = fp32 logit[m, v]; never stored (store_d=False).
# lse: per-row, per-N-tile online (max, sum-exp) LSE partials (ragged-N masked by the op).
# tgt: the fp32 logit at column target[m] of each row.
@gemm_epilogue(
    outs={"lse": OnlineLSEReduce("lse"), "tgt": ColVecSelect("tgt", idx_op=TARGET)},
    extra_ops=(TARGET,),
)
def ce_lse_epi(acc):
    return {"lse": acc, "tgt": acc}


def gemm_cross_entropy(h, w_vocab, target):
    # h (M, K) bf16, w_vocab (V, K) bf16 nn.Linear layout, target (M,) int64
    m, k = h.shape
    v = w_vocab.shape[0]
    cfg = CFG_COOP if k >= 8192 else CFG_PINGPONG
    n_tiles = -(-v // cfg.tile_n)
    lse_part = torch.empty(m, n_tiles, dtype=torch.float32, device=h.device)
    tgt = torch.empty(m, dtype=torch.float32, device=h.device)
    ce_lse_epi(
        h, w_vocab.T,
        tuned=False, store_d=False, config=cfg,
        target=target, lse=lse_part, tgt=tgt,
    )
    # tiny finalize: fold the per-tile LSEs, then loss = lse - logit[target]
    lse = torch.logsumexp(lse_part, dim=-1)
    loss = lse - tgt
    return loss, lse

import torch
from quack.epilogue import gemm_epilogue
from quack.epilogue.ops import ColVecLoad, ColVecSelect, OnlineLSEReduce
from quack.gemm_config import GemmConfig

# SM90 default tile (128x192 pingpong) for small K; 128x256 cooperative for larger K
# (tricks log: the 256 pin is slower at K=2048 but much faster at K=8192).
CFG_SMALL_K = GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1,
                         is_dynamic_persistent=False)
CFG_LARGE_K = GemmConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1,
                         is_dynamic_persistent=False)

TARGET = ColVecLoad("target")            # index load feeding ColVecSelect (pinned)


@gemm_epilogue(
    outs={"lse": OnlineLSEReduce("lse"), "tgt": ColVecSelect("tgt", idx_op=TARGET)},
    extra_ops=(TARGET,),
)
def ce_epi(acc):
    # fp32 logit: folded into the per-tile online LSE and gathered at column target[m]
    return {"lse": acc, "tgt": acc}


def gemm_cross_entropy(h, w_vocab, target):
    # h (M, K) bf16, w_vocab (V, K) bf16 nn.Linear layout, target (M,) int64
    m, k = h.shape
    v = w_vocab.shape[0]
    cfg = CFG_SMALL_K if k <= 2048 else CFG_LARGE_K
    n_tiles = -(-v // cfg.tile_n)
    lse_part = torch.empty(m, n_tiles, dtype=torch.float32, device=h.device)
    tgt = torch.empty(m, dtype=torch.float32, device=h.device)
    ce_epi(h, w_vocab.T, tuned=False, store_d=False, config=cfg,
           target=target, lse=lse_part, tgt=tgt)
    # tiny finalize over the (M, n_tiles) per-tile LSE partials
    lse = torch.logsumexp(lse_part, -1)
    loss = lse - tgt
    return loss, lse

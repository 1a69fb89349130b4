"""Threat 16: a second GEMM pass inside a tight launch budget.

SPEC: rope_bwd
EXPECT: gpu gemm-launches

rope_bwd's budget (11 launches) was set to the honest count: GEMM + positions.float() +
quack's 9-kernel frequency table. This candidate saves the positions.float() launch (the
epilogue loads the int64 positions and converts them itself) and spends it on a second
GEMM: pass 1 stores the plain dqkv_rot, pass 2 is a dummy-K (K = 8) GEMM whose epilogue
reads that stored result back as C and writes it rotated over itself. Numerically it is
the op, workspace is zero (the intermediate is the returned output) and the count is 11;
only it reads and writes the (M, N) output twice, which is what fusion exists to avoid.
The worker's launch record names every kernel: more GEMM launches than the spec's
`max_gemm_launches` (1 here) is `too-many-gemm-launches`, at every correctness and
benchmark shape.
"""
import math

import cutlass
import cutlass.cute as cute
from quack.epilogue import gemm_epilogue, pack, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.epilogue.rotary import make_interleaved_inv_freq

ROUND = 12582912.0  # 1.5 * 2^23: x + ROUND - ROUND rounds to an integer
SPLIT1 = 24576.0    # 1.5 * 2^14: quantizes to multiples of 2^-9
SPLIT2 = 96.0       # 1.5 * 2^6: quantizes to multiples of 2^-17
TWO_PI = 2.0 * math.pi


@gemm_epilogue(mode="acc_pair")
def store_epi(acc):
    x, y = unpack(acc)
    return {"D": pack(x, y)}


@gemm_epilogue(ops={"pos": ColVecLoad("pos"), "freq": RowVecLoad("freq")}, mode="acc_pair")
def rotate_stored_epi(acc, c, pos, freq):
    z0, z1 = unpack(acc)
    dx, dy = unpack(c)
    p = pos.to(cutlass.Float32)
    hi, lo = unpack(freq)
    f1 = (hi + SPLIT1) - SPLIT1
    rem = hi - f1
    f2 = (rem + SPLIT2) - SPLIT2
    f3 = rem - f2
    a1 = p * f1
    a2 = p * f2
    t = (a1 - ((a1 + ROUND) - ROUND)) + (a2 - ((a2 + ROUND) - ROUND)) + (p * f3 + p * lo)
    t = t - ((t + ROUND) - ROUND)
    cs = cute.math.cos(t * TWO_PI, fastmath=True)
    sn = cute.math.sin(t * TWO_PI, fastmath=True)
    dx = dx + z0 * 0.0   # the dummy GEMM's accumulator, unused
    dy = dy + z1 * 0.0
    return {"D": pack(dx * cs + dy * sn, dy * cs - dx * sn)}


def rope_bwd(g, w, positions, inv_freq, *, HQ, HKV):
    hd = 2 * inv_freq.shape[0]
    freq = make_interleaved_inv_freq(inv_freq, (HQ + HKV) * hd, HKV * hd)
    stored = store_epi(g, w.T, tuned=False)["D"]
    res = rotate_stored_epi(g[:, :8], w[:, :8].T, stored, out={"D": stored}, tuned=False,
                            pos=positions.view(1, -1), freq=freq.view(1, -1))
    return res["D"]

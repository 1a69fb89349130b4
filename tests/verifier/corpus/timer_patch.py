"""Threat 5, patching the timer: make every benchmark report 1 microsecond.

SPEC: swiglu_bwd
EXPECT: static attribute-write

The module replaces triton.testing.do_bench and torch.cuda.Event.elapsed_time at import
time, so a harness timing in the same process reports whatever the candidate wants.
Rejected statically: triton is not importable and no attribute of an imported module or
object may be assigned. (The GPU stage also times in a process the candidate cannot
reach.)
"""

import torch
import triton.testing

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


def _instant(fn, *args, **kwargs):
    fn()
    return 0.001


triton.testing.do_bench = _instant  # expect: attribute-write
torch.cuda.Event.elapsed_time = lambda start, end: 0.001  # expect: attribute-write


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=preact.dtype, device=preact.device)
    postact = torch.empty(m, i, dtype=preact.dtype, device=preact.device)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

"""Threat 13a, crash: outputs allocated in host memory, handed to a GPU kernel.

SPEC: swiglu_bwd
EXPECT: gpu crash

A very common slip: `torch.empty(m, i, dtype=...)` without `device=` allocates on the
CPU. The kernel then gets host addresses for D and postact: on the GPU this is an
illegal memory access (which poisons the CUDA context -- the worker must die and be
reported, not hang the verifier), a launcher error about the device, or, on systems
where the GPU can address pageable host memory, outputs that come back on the wrong
device. Passes static (allocation is allowed) and the compile stage (which runs on CPU
tensors, so host memory is exactly right there); only the GPU stage can see it. The
verifier must report it as a crash/error of this candidate and carry on.
"""

import torch

from quack.activation import dswiglu
from quack.epilogue import gemm_epilogue, pack, unpack


@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")
def dswiglu_epi(acc, c):
    gate, up = unpack(c)
    dgate, dup, postact = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "postact": postact}


def swiglu_bwd(dout, w_down, preact):
    m = dout.shape[0]
    i = w_down.shape[1]
    dpreact = torch.empty(m, 2 * i, dtype=torch.bfloat16)
    postact = torch.empty(m, i, dtype=torch.bfloat16)
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

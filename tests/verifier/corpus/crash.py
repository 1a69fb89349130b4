"""Threat 13a, crash: outputs allocated in host memory, handed to a GPU kernel.

SPEC: swiglu_bwd
EXPECT: static host-escape

A very common slip: `torch.empty(m, i, dtype=...)` without `device=` allocates on the
CPU. The kernel then gets host addresses for D and postact: on the GPU this is an
illegal memory access (which poisons the CUDA context -- the worker must die and be
reported, not hang the verifier), a launcher error about the device, or, on systems
where the GPU can address pageable host memory, outputs that come back on the wrong
device. Without a static rule it would pass static and the compile stage (which runs
on CPU tensors) and crash only on the GPU; allocations must say `device=<input>.device` (a host
tensor of stale heap memory keeps state across calls, read without a sync the guard
sees), so the static stage names the slip in a fraction of a second. The verifier's survival of a crashing worker is tested on the CPU device
(`test_pipeline_cpu.py`: SIGSEGV, hang, raised errors).
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
    dpreact = torch.empty(m, 2 * i, dtype=torch.bfloat16)  # expect: host-escape
    postact = torch.empty(m, i, dtype=torch.bfloat16)  # expect: host-escape
    dswiglu_epi(dout, w_down, preact, out={"D": dpreact, "postact": postact}, tuned=False)
    return dpreact, postact

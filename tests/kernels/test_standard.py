"""The dispatcher's standard paths against each spec's baseline (the unfused PyTorch code), on the CPU: same output
names' order, shapes and dtypes as the kernel entry, values within bf16 rounding."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from coda_agent.kernels import _standard
from coda_agent.verifier.gpu.inputs import make_inputs
from coda_agent.verifier.spec import load_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kernel", sorted(_standard.routable()))
def test_standard_path_matches_the_reference(kernel):
    loaded = load_spec(ROOT / "kernel_specs" / kernel)
    dims = dict(loaded.spec.shapes.correctness[0].dims)
    ins = make_inputs(loaded, dims, 3, "cpu")
    consts = loaded.spec.constants_of(dims)
    args = [ins[t.name] for t in loaded.spec.entry.inputs]
    got = _standard.eager(kernel)(*args, **consts)
    want = loaded.load_reference().baseline(**ins, **consts)  # the unfused code the kernel replaces
    outs = loaded.spec.entry.outputs
    assert len(got) == len(outs)
    for o, g in zip(outs, got, strict=True):
        w = want[o.name]
        assert g.shape == w.shape, o.name
        assert g.dtype == getattr(torch, o.dtype), o.name
        err = (g.double() - w.double()).abs().max().item()
        scale = w.double().abs().max().item() or 1.0
        assert err <= 0.02 * scale, f"{kernel}.{o.name}: max |diff| {err} vs scale {scale}"


def test_no_training_op_body_dispatches_another_custom_op():
    """An op body calls run_kernel, never another coda_agent custom op (each nested op is one
    more trip through the dispatcher per call)."""
    ops = set()
    trees = {}
    for p in (ROOT / "generated_kernels").glob("_*.py"):
        trees[p.name] = t = ast.parse(p.read_text())
        for n in t.body:
            if isinstance(n, ast.FunctionDef) and any("custom_op" in ast.unparse(d) for d in n.decorator_list):
                ops.add(n.name)
    assert len(ops) > 10
    nested = []
    for name, t in trees.items():
        for n in t.body:
            if isinstance(n, ast.FunctionDef) and n.name in ops:
                for c in ast.walk(ast.Module(body=n.body, type_ignores=[])):
                    if isinstance(c, ast.Call) and ast.unparse(c.func) in ops:
                        nested.append(f"{name}:{n.name} -> {ast.unparse(c.func)}")
    assert nested == []

"""Stage 1 (static): the rules on quack's wider epilogue surface -- accumulator prepass fns,
custom op classes over quack's op bases, the grouped-statistics and fp8 modules.

Each test starts from :data:`GOOD` (a prepass feeding a custom grouped-stats op) and
changes one thing, so a failure names the rule that regressed. The corpus
(tests/verifier/corpus/prepass_*.py, op_class_*.py) holds the whole-file attacks;
tests/verifier/corpus_good/ the honest candidates that compile.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coda_agent.verifier.spec import load_spec
from coda_agent.verifier.static import check_static
from coda_agent.verifier.static.op_bases import OP_BASES, declared_hook_params, op_base

ROOT = Path(__file__).resolve().parents[2]
FWD = load_spec(ROOT / "kernel_specs" / "swiglu_fwd").spec

HEADER = '''\
"""candidate"""
import cutlass.cute as cute
import torch
from quack.activation import swiglu
from quack.epilogue import gemm_epilogue, unpack
from quack.epilogue.ops import GroupedColStatsBase, GroupedColStatsOut
'''

CLASS = '''
class GroupMean(GroupedColStatsBase):
    """Per-(row, group) mean."""

    combine = "add"

    def stat_value(self, total, group_cols):
        return total * (1.0 / group_cols)
'''

PREPASS = """
def mean_prepass(acc):
    return {"mu": acc}
"""

EPI = """
MU = GroupMean("mu")


@gemm_epilogue(
    outputs=("postact",),
    mode="acc_pair",
    ops={"mu": MU},
    prepass=mean_prepass,
    prepass_outs=("mu",),
    extra_ops=(GroupedColStatsOut("mu_out", MU),),
)
def swiglu_epi(acc, mu):
    gate, up = unpack(acc - mu)
    return {"postact": swiglu(gate, up)}
"""

ENTRY = """
def swiglu_fwd(x, w1):
    m = x.shape[0]
    n = w1.shape[0]
    BODY
    preact = torch.empty(m, n, dtype=x.dtype, device=x.device)
    postact = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    swiglu_epi(x, w1.T, out={"D": preact, "postact": postact}, tuned=False, mu=128)
    return preact, postact
"""


def module(*, header="", cls=CLASS, prepass=PREPASS, epi=EPI, body="", extra="") -> str:
    return HEADER + header + cls + prepass + epi + extra + ENTRY.replace("BODY", body or "pass")


GOOD = module()


def findings(src: str):
    return check_static(FWD, src).findings


def assert_flags(src: str, kind: str, needle: str) -> None:
    """``src`` fails with a ``kind`` finding on the (first) line containing ``needle``."""
    lines = src.splitlines()
    want = next(i for i, ln in enumerate(lines, 1) if needle in ln)
    got = findings(src)
    assert any(f.kind == kind and f.line == want for f in got), [(f.kind, f.line, f.message) for f in got]


def test_good_module_passes():
    assert findings(GOOD) == []


def test_op_base_table_matches_quack():
    """Each hook in OP_BASES has the parameters quack's base declares, and each allowed
    class-attribute value is one the base's code reads."""
    for base, rules in OP_BASES.items():
        for hook, params in rules.hooks.items():
            assert declared_hook_params(base, hook) == params, (base, hook)
    from quack.epilogue.ops import GroupedColStatsBase

    for value in OP_BASES["quack.epilogue.ops.GroupedColStatsBase"].attrs["combine"]:
        op = type("Probe", (GroupedColStatsBase,), {"combine": value})("probe")
        assert callable(op._combine_op())
    bogus = type("Probe", (GroupedColStatsBase,), {"combine": "min"})("probe")
    with pytest.raises(KeyError):
        bogus._combine_op()


@pytest.mark.parametrize(
    "path,ok",
    [
        ("quack.epilogue.ops.GroupedColStatsBase", True),
        ("quack.epilogue.head_rmsnorm.HeadRstd", True),
        ("quack.epilogue.scaled_exp.MaxLog2", True),
        ("quack.epilogue.ops.GroupedColStatsOut", False),
        ("quack.epilogue.ops.EpiOp", False),
        ("quack.epilogue.ops.Scalar", False),
        ("quack.epilogue.ops.ColVecReduce", False),
        ("cutlass.NumericMeta", False),
        ("cutlass.Float32", False),
        ("quack.epilogue.ops.NoSuchBase", False),
        ("quack.epilogue.library.HeadRstd", False),
    ],
)
def test_op_bases_resolve_by_introspection(path, ok):
    assert (op_base(path) is not None) is ok


# --------------------------------------------------------------------------- op classes


@pytest.mark.parametrize(
    "cls,kind,needle",
    [
        # class header: where, how many bases, which, keywords, decorators
        ("\nclass GroupMean:\n    pass\n", "class-definition", "class GroupMean"),
        ("\nclass GroupMean(torch.nn.Module):\n    pass\n", "class-definition", "class GroupMean"),
        ("\nclass GroupMean(GroupedColStatsOut):\n    pass\n", "class-definition", "class GroupMean"),
        (
            CLASS.replace("(GroupedColStatsBase)", "(GroupedColStatsBase, GroupedColStatsOut)"),
            "class-definition",
            "class",
        ),
        (
            CLASS.replace("(GroupedColStatsBase)", "(GroupedColStatsBase, metaclass=cute.NumericMeta)"),
            "class-definition",
            "class",
        ),
        ("\n@cute.jit" + CLASS, "class-definition", "class GroupMean"),
        # body: only a docstring, the base's literal attributes and its hooks
        (CLASS + "\n    def __init__(self, name):\n        pass\n", "op-class", "def __init__"),
        (CLASS + "\n    def __init_subclass__(cls):\n        pass\n", "op-class", "def __init_subclass__"),
        (CLASS + "\n    def __getattr__(self, name):\n        return name\n", "op-class", "def __getattr__"),
        (CLASS + "\n    def __del__(self):\n        pass\n", "op-class", "def __del__"),
        (CLASS + "\n    def config_key(self):\n        return ()\n", "op-class", "def config_key"),
        (CLASS + "\n    def host_call_arg(self, value, key):\n        return value\n", "op-class", "def host_call_arg"),
        (
            CLASS + "\n    def fn_prepare(self, gemm, state, paired):\n        return state\n",
            "op-class",
            "def fn_prepare",
        ),
        (CLASS.replace('combine = "add"', "calls = 0"), "op-class", "calls = 0"),
        (CLASS.replace('combine = "add"', 'combine = "min"'), "op-class", 'combine = "min"'),
        (CLASS.replace('combine = "add"', "combine = operator.add"), "op-class", "combine = operator.add"),
        (CLASS.replace('combine = "add"', "probe = cute.math.rsqrt"), "op-class", "probe = cute.math.rsqrt"),
        (CLASS.replace('combine = "add"', 'combine = "add"\n    combine = "max"'), "op-class", 'combine = "max"'),
        (CLASS.replace('combine = "add"', "__slots__ = ()"), "op-class", "__slots__"),
        (CLASS + "\n    class Inner:\n        pass\n", "op-class", "class Inner"),
        (CLASS + "\n    stat_value = GroupedColStatsBase.stat_value\n", "op-class", "stat_value = "),
        # hooks: exactly the base's parameters, no decorators, never `self`
        (CLASS.replace("(self, total, group_cols)", "(self, total, cols)"), "op-class", "def stat_value"),
        (CLASS.replace("(self, total, group_cols)", "(self, total, group_cols, k=1)"), "op-class", "def stat_value"),
        (CLASS.replace("(self, total, group_cols)", "(self, *args)"), "op-class", "def stat_value"),
        (CLASS.replace("    def stat_value", "    @cute.jit\n    def stat_value"), "op-class", "def stat_value"),
        (CLASS.replace("return total * (1.0 / group_cols)", "return total * self.eps"), "op-class", "self.eps"),
        (
            CLASS.replace("return total * (1.0 / group_cols)", "return self.to_params(0, total)"),
            "op-class",
            "self.to_params",
        ),
        (
            CLASS.replace("return total * (1.0 / group_cols)", "return super().stat_value(total, group_cols)"),
            "banned-call",
            "super()",
        ),
        (CLASS + CLASS.split('combine = "add"\n')[1], "op-class", "def stat_value"),
    ],
)
def test_op_class_rules(cls, kind, needle):
    src = module(cls=cls, header="import operator\n")
    want = max(i for i, ln in enumerate(src.splitlines(), 1) if needle in ln)  # the last such line
    got = findings(src)
    assert any(f.kind == kind and f.line == want for f in got), [(f.kind, f.line, f.message) for f in got]


def test_a_class_inside_a_function_is_no_op():
    assert_flags(module(body="class Local(GroupedColStatsBase):\n        pass"), "class-definition", "class Local")


@pytest.mark.parametrize(
    "body_or_extra,kind,needle",
    [
        ("k = GroupMean", "op-class", "k = GroupMean"),
        ('op = GroupMean("mu")', "op-class", 'op = GroupMean("mu")'),
        ("ok = isinstance(x, GroupMean)", "op-class", "isinstance(x, GroupMean)"),
    ],
)
def test_op_class_is_only_constructed_at_import_time(body_or_extra, kind, needle):
    assert_flags(module(body=body_or_extra), kind, needle)


@pytest.mark.parametrize(
    "extra,kind,needle",
    [
        ("\nNAME = 3\nMU2 = GroupMean(NAME)\n", "op-class", "GroupMean(NAME)"),
        ("\nMU2 = GroupMean(name=3)\n", "op-class", "GroupMean(name=3)"),
        ('\nMU2 = GroupMean("m2", *())\n', "op-class", 'GroupMean("m2", *())'),
        ("\nGroupMean = 3\n", "name-redefined", "class GroupMean"),
        ("\ndef _f(GroupMean):\n    return 0\n", "name-redefined", "class GroupMean"),
    ],
)
def test_op_class_arguments_are_literals_and_its_name_is_bound_once(extra, kind, needle):
    assert_flags(module(extra=extra), kind, needle)


def test_string_config_and_op_names_are_in_place():
    src = module(extra='\nMU2 = GroupMean("mu2")\n')
    assert [f.kind for f in findings(src)] == []


def test_quack_subclasses_of_the_base_are_bases_too():
    cls = (
        "\nfrom quack.epilogue.head_rmsnorm import HeadRstd\n\n\n"
        "class LooseRstd(HeadRstd):\n    def stat_value(self, total, group_cols):\n"
        "        return cute.math.rsqrt(total * (1.0 / group_cols) + 1e-5)\n" + CLASS
    )
    assert findings(module(cls=cls)) == []


# --------------------------------------------------------------------------- prepass fns


@pytest.mark.parametrize(
    "epi_change,kind,needle",
    [
        (("prepass=mean_prepass", 'prepass=lambda acc: {"mu": acc}'), "prepass-fn", "prepass=lambda"),
        (("prepass=mean_prepass", "prepass=cute.math.exp"), "prepass-fn", "prepass=cute.math.exp"),
        (("prepass=mean_prepass", "prepass=swiglu_epi"), "prepass-fn", "prepass=swiglu_epi"),
        (("prepass=mean_prepass", "prepass=MU"), "prepass-fn", "prepass=MU"),
        (('    prepass_outs=("mu",),\n', ""), "prepass-fn", "@gemm_epilogue("),
        (('prepass_outs=("mu",)', "prepass_outs=OUTS"), "non-literal-declaration", "prepass_outs=OUTS"),
    ],
)
def test_prepass_names_a_module_level_def(epi_change, kind, needle):
    src = module(epi=EPI.replace(*epi_change), extra='\nOUTS = ("mu",)\n')
    assert_flags(src, kind, needle)


@pytest.mark.parametrize(
    "prepass,kind,needle",
    [
        ('\n@cute.jit\ndef mean_prepass(acc):\n    return {"mu": acc}\n', "prepass-fn", "def mean_prepass"),
        ('\ndef mean_prepass(x):\n    return {"mu": x}\n', "epilogue-signature", "def mean_prepass"),
        ('\ndef mean_prepass(acc, *rest):\n    return {"mu": acc}\n', "epilogue-signature", "def mean_prepass"),
        ('\ndef mean_prepass(acc):\n    return {"mu": acc, "D": acc}\n', "unknown-return-key", 'return {"mu"'),
        ('\ndef mean_prepass(acc):\n    return {"mo": acc}\n', "unknown-return-key", 'return {"mo"'),
        ('\ndef mean_prepass(acc):\n    return {"D": acc}\n', "missing-declared-key", 'return {"D"'),
        ("\ndef mean_prepass(acc):\n    return acc\n", "epilogue-return", "return acc"),
        ('\ndef mean_prepass(acc):\n    return {"mu": acc.__class__}\n', "banned-attribute", "__class__"),
        ('\ndef mean_prepass(acc):\n    return {"mu": eval("acc")}\n', "banned-call", "eval("),
        (
            '\ndef mean_prepass(acc):\n    return {"mu": acc}\n\n\nmean_prepass = swiglu\n',
            "prepass-fn",
            "prepass=mean_prepass",
        ),
    ],
)
def test_prepass_fn_is_held_to_the_epilogue_rules(prepass, kind, needle):
    assert_flags(module(prepass=prepass), kind, needle)


def test_prepass_body_is_an_epilogue_body():
    """Augmented assignment is epilogue math there, as in an epilogue fn."""
    prepass = '\ndef mean_prepass(acc):\n    s = acc\n    s += acc\n    return {"mu": s * 0.5}\n'
    assert findings(module(prepass=prepass)) == []


@pytest.mark.parametrize(
    "body,needle",
    [
        ("s = mean_prepass(x)", "mean_prepass(x)"),
        ("f = mean_prepass", "f = mean_prepass"),
    ],
)
def test_prepass_fn_is_named_only_in_prepass(body, needle):
    assert_flags(module(body=body), "prepass-fn", needle)


def test_prepass_fn_from_a_factory_is_refused():
    prepass = (
        "\ndef _factory():\n    seen = (0,)\n\n    def mean_prepass(acc):\n"
        '        return {"mu": acc + seen[0]}\n\n    return 0\n'
    )
    assert_flags(module(prepass=prepass), "prepass-fn", "prepass=mean_prepass")


# --------------------------------------------------------------------------- modules and fp8


@pytest.mark.parametrize(
    "header,kind",
    [
        ("from quack.epilogue.scaled_exp import scaled_exp_epi\n", "library-epilogue"),
        ("from quack.epilogue.quantize_out import math as qmath\n", "banned-import"),
        ("from quack.epilogue.quantize_out import layout_utils\n", "banned-import"),
        ("from quack.epilogue.head_rmsnorm import cute as hcute\n", "banned-import"),
        ("from quack.epilogue.library import HeadRstd\n", "banned-import"),
    ],
)
def test_new_library_modules_keep_the_surface_rules(header, kind):
    assert kind in [f.kind for f in findings(module(header=header))]


def test_new_library_modules_are_importable():
    header = (
        "from quack.epilogue.head_rmsnorm import HeadRstd\n"
        "from quack.epilogue.scaled_exp import MaxLog2\n"
        "from quack.epilogue.quantize_out import BlockScaleFactorStore\n"
    )
    extra = '\nRSTD = HeadRstd("rstd", eps=1e-6)\nKMAX = MaxLog2("kmax")\nSF = BlockScaleFactorStore("sf")\n'
    assert findings(module(header=header, extra=extra)) == []


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_buffers_are_allocations(dtype):
    body = f"q = torch.empty(m, n, dtype=torch.{dtype}, device=x.device)"
    assert findings(module(body=body)) == []
    assert_flags(module(body=f"q = x.to(torch.{dtype})"), "precision-cast", "x.to(")


def test_attacks_on_the_new_surface_are_registered():
    """Every corpus file attacking through a prepass, an op class or the new modules is in
    the corpus README's table and in a row of docs/threat-model.md."""
    corpus = ROOT / "tests" / "verifier" / "corpus"
    readme = (corpus / "README.md").read_text()
    threats = (ROOT / "docs" / "threat-model.md").read_text()
    files = [
        *corpus.glob("prepass_*.py"),
        *corpus.glob("op_class_*.py"),
        corpus / "library_epilogue_scaled_exp.py",
        corpus / "escape_quantize_out_reexport.py",
    ]
    assert len(files) >= 16
    for f in files:
        assert f"| {f.name} |" in readme, f.name
        assert f"`{f.name}`" in threats, f.name


def test_the_stats_writer_method_gets_its_fix():
    """quack's own mods write `op.out("name")`; the contract names the constructor instead."""
    epi = EPI.replace('GroupedColStatsOut("mu_out", MU)', 'MU.out("mu_out")')
    src = module(epi=epi)
    hits = [f for f in findings(src) if f.kind == "value-attribute"]
    assert hits and 'GroupedColStatsOut("<name>", MU)' in hits[0].message

"""The rendered prompt holds the docs, examples, tricks and the whole spec, and never
the target's own accepted kernel."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import jinja2
import pytest
from agent_helpers import (
    BWD_MARKER,
    DOC2_MARKER,
    DOC_MARKER,
    GELU_MARKER,
    OWN_MARKER,
    RMS_MARKER,
    TRICK_MARKER,
)

from coda_agent.agent.context import gather_context
from coda_agent.agent.render import (
    Prompt,
    _render,
    build_lesson_prompt,
    build_repair_prompt,
    number_lines,
    render_prompt,
)
from coda_agent.verifier.spec import ReferenceSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_prompt_contains_docs_examples_tricks_and_spec(workspace, fwd_spec):
    p = render_prompt(fwd_spec, workspace)
    text = p.as_text()
    for marker in (DOC_MARKER, DOC2_MARKER, BWD_MARKER, GELU_MARKER, RMS_MARKER, TRICK_MARKER):
        assert marker in text, marker
    # docs appear with their file names, sorted
    assert '<doc file="00_gemm_epilogue.md">' in text
    assert text.index("00_gemm_epilogue.md") < text.index("10_math.md")
    # examples carry the manifest header
    assert (
        "Accepted kernel: spec `swiglu_bwd`, pattern backward, CODA catalogue item 7, quack mode 'packed_cd_b16x2'."
        in text
    )
    # the spec
    task = p.messages[0]["content"]
    assert p.messages[0]["role"] == "user"
    assert "# Task: write the fused kernel `swiglu_fwd`" in task
    assert "def swiglu_fwd(x, w1) -> (preact, postact)" in task
    assert "- `x`: shape (M, K), dtype bfloat16 -- activations" in task
    assert "- `w1`: shape (2*I, K), dtype bfloat16" in task
    assert "Layout: row 2j is gate unit j, row 2j+1 is up unit j (interleaved along N)." in task
    assert "Test values: 1/sqrt(K) * N(0, 1)." in task
    assert "- `preact`: shape (M, 2*I), dtype bfloat16" in task
    assert "- `postact`: shape (M, I), dtype bfloat16 -- silu(gate) * up." in task
    assert "postact[m, j] = silu(gate[m, j]) * up[m, j]" in task  # the math
    assert "max |out - ref32| <= 2 * max |ref_lowp - ref32| + 1e-06" in task
    assert "the same reference computed in bfloat16." in task  # the low precision
    assert "- ragged-all: M=517, K=264, I=328 (ragged: I, K, M not a multiple of 128)" in task
    assert "inputs x(517, 264), w1(656, 264) -> outputs preact(517, 656), postact(517, 328)" in task
    assert "- llama3-70b/M16384: M=16384, K=8192, I=28672" in task
    assert "GEMM FLOPs = 2*M*K*2*I" in task
    assert "- bare_gemm: 1.03" in task and "- quack_library: 1.02" in task
    assert "Timed against: torch_eager, torch_compile, bare_gemm, quack_library." in task
    assert "quack mode 'acc_pair'" in task  # the hint
    assert "At most 1 CUDA kernel launch per call." in task


def test_own_accepted_kernel_is_never_leaked(workspace, fwd_spec):
    assert (workspace / "generated_kernels" / "swiglu_fwd" / "kernel.py").read_text().count(OWN_MARKER) == 1
    ctx = gather_context(workspace, fwd_spec, max_examples=10)
    assert ctx.excluded_own_kernel is True
    assert "swiglu_fwd" not in [e.spec_name for e in ctx.examples]
    text = render_prompt(fwd_spec, workspace, max_examples=10).as_text()
    assert OWN_MARKER not in text


def test_own_kernel_excluded_by_manifest_name_too(workspace, fwd_spec):
    d = workspace / "generated_kernels" / "renamed_copy"
    d.mkdir()
    (d / "kernel.py").write_text("# LEAK_BY_MANIFEST_NAME\n")
    (d / "manifest.json").write_text(json.dumps({"spec": "swiglu_fwd", "pattern": "forward"}))
    text = render_prompt(fwd_spec, workspace, max_examples=10).as_text()
    assert "LEAK_BY_MANIFEST_NAME" not in text


def test_examples_ranked_most_similar_first_and_capped(workspace, fwd_spec):
    ctx = gather_context(workspace, fwd_spec, max_examples=3)
    # forward first (gelu_fwd), then backward ones by shared words (swiglu_bwd shares the most)
    assert [e.spec_name for e in ctx.examples] == ["gelu_fwd", "swiglu_bwd", "rms_bwd"]
    assert ctx.examples[0].score[0] == 1 and ctx.examples[1].score[0] == 0
    assert ctx.examples[1].score[2] > ctx.examples[2].score[2]
    assert ctx.examples_available == 3
    assert [e.spec_name for e in gather_context(workspace, fwd_spec, max_examples=1).examples] == ["gelu_fwd"]
    # for the backward target: backward first, then (among equals) the same quack mode
    d = workspace / "generated_kernels" / "packed_bwd"
    d.mkdir()
    (d / "kernel.py").write_text('@gemm_epilogue(outputs=("postact",), mode="packed_cd_b16x2")\n')
    man = {"spec": "packed_bwd", "pattern": "backward", "description": "x"}
    (d / "manifest.json").write_text(json.dumps(man))
    bwd = load_spec(workspace / "kernel_specs" / "swiglu_bwd")
    # not an example until its manifest records a GPU verification of this very file
    assert "packed_bwd" not in [e.spec_name for e in gather_context(workspace, bwd, max_examples=5).examples]
    man.update(gpu_verified=True, kernel_sha256=hashlib.sha256((d / "kernel.py").read_bytes()).hexdigest())
    (d / "manifest.json").write_text(json.dumps(man))
    ctx_b = gather_context(workspace, bwd, max_examples=5)
    assert [e.spec_name for e in ctx_b.examples] == ["packed_bwd", "rms_bwd", "swiglu_fwd", "gelu_fwd"]
    assert ctx_b.examples[0].score[:2] == (1, 1) and ctx_b.examples[0].mode == "packed_cd_b16x2"
    (d / "kernel.py").write_text((d / "kernel.py").read_text() + "# edited after acceptance\n")
    assert "packed_bwd" not in [e.spec_name for e in gather_context(workspace, bwd, max_examples=5).examples]


def test_no_accepted_kernels_says_docs_examples_serve(workspace, fwd_spec):
    import shutil

    for d in (workspace / "generated_kernels").iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    ctx = gather_context(workspace, fwd_spec)
    assert ctx.examples == [] and ctx.examples_from_docs
    text = render_prompt(fwd_spec, workspace).as_text()
    assert "the examples inside the primitive docs above serve as the examples" in text
    assert "<example " not in text


def test_prompt_structure_and_token_estimate(workspace, fwd_spec):
    p = render_prompt(fwd_spec, workspace)
    assert p.kind == "task"
    assert p.static_blocks == len(p.system_blocks) == 4
    assert p.cache_block_index == 3
    assert p.system_blocks[0].startswith("You are an expert author of fused GEMM-epilogue GPU kernels")
    assert "exactly ONE fenced code block" in p.system_blocks[0]
    assert "imports only these modules (or names defined in them): `torch`, `math`, `functools`" in p.system_blocks[0]
    assert "try`/`except" in p.system_blocks[0]
    assert "the GEMM and its epilogue are one kernel" in p.system_blocks[0]
    assert DOC_MARKER in p.system_blocks[1]
    assert GELU_MARKER in p.system_blocks[2]
    assert TRICK_MARKER in p.system_blocks[3]
    chars = sum(map(len, p.system_blocks)) + sum(len(m["content"]) for m in p.messages)
    assert p.estimate_tokens() == math.ceil(chars / 4)
    text = p.as_text()
    assert text.startswith("=== SYSTEM ===\n\n")
    assert "\n=== USER ===\n\n# Task: write the fused kernel `swiglu_fwd`" in text
    for b in p.system_blocks:
        assert b.strip() in text
    # round trip through prompt.json
    q = Prompt.from_json(p.to_json())
    assert q == p and q.as_text() == text
    assert json.loads(p.to_json())["sha256"] == p.sha256()


def test_repair_prompt_has_feedback_and_previous_candidate(workspace, fwd_spec):
    base = render_prompt(fwd_spec, workspace)
    cand = "import torch\n\ndef swiglu_fwd(x, w1):\n    return x\n"
    r = build_repair_prompt(
        base,
        previous_response="prose\n```python\n" + cand + "```",
        previous_candidate=cand,
        feedback="Stage correctness fail: postact off by 0.75 at line 4",
        attempt=2,
        max_attempts=5,
    )
    assert r.kind == "repair"
    assert r.system_blocks == base.system_blocks and r.static_blocks == base.static_blocks
    assert [m["role"] for m in r.messages] == ["user", "assistant", "user"]
    assert r.messages[0] == base.messages[0]
    last = r.messages[2]["content"]
    assert "Stage correctness fail: postact off by 0.75 at line 4" in last
    assert "4 |     return x" in last  # numbered previous candidate
    assert "FULL" in last and "attempt 2 of 5" in last
    assert "```python" in r.messages[1]["content"]
    # extraction failure: no candidate section
    r2 = build_repair_prompt(
        base,
        previous_response="no code",
        previous_candidate=None,
        feedback="no ```python block",
        attempt=3,
        max_attempts=5,
    )
    assert "No module could be extracted" in r2.messages[2]["content"]
    assert "line numbers as the feedback uses them" not in r2.messages[2]["content"]


def test_lesson_prompt(workspace, fwd_spec):
    base = render_prompt(fwd_spec, workspace)
    lp = build_lesson_prompt(
        base, kernel="swiglu_fwd", failed_attempt=1, feedback="NaN in ragged tile", diff="-old line\n+new line"
    )
    assert lp.kind == "lesson" and lp.system_blocks == base.system_blocks
    msg = lp.messages[0]["content"]
    assert "NaN in ragged tile" in msg and "+new line" in msg
    assert "ONE sentence" in msg and "Attempt 2 passed" in msg


def test_templates_are_strict():
    with pytest.raises(jinja2.UndefinedError):
        _render("repair.md.j2", feedback="x", attempt=2, max_attempts=3)  # candidate missing


def test_number_lines():
    assert number_lines("a\nb\n") == "1 | a\n2 | b"
    assert number_lines("\n".join("x" * 10)).splitlines()[9] == "10 | x"


def test_code_with_fences_is_shown_in_a_longer_fence(workspace, fwd_spec):
    base = render_prompt(fwd_spec, workspace)
    cand = '"""Doc.\n\n```python\nf(x)\n```\n"""\nx = 1\n'
    r = build_repair_prompt(
        base, previous_response="r", previous_candidate=cand, feedback="fb", attempt=2, max_attempts=3
    )
    last = r.messages[-1]["content"]
    assert '\n````\n1 | """Doc.' in last and "\n7 | x = 1\n````\n" in last


def test_repair_prompt_repeats_a_huge_answer_only_clipped(workspace, fwd_spec):
    """A 5.7 MB answer would make a 1.4M-token repair prompt: the previous answer and module
    are repeated up to REPAIR_ECHO_CHARS each, head and tail kept."""
    from coda_agent.agent.render import REPAIR_ECHO_CHARS, build_repair_prompt, render_prompt

    huge = "HEAD\n" + "x = 1\n" * 1_000_000 + "TAIL\n"
    p = build_repair_prompt(
        render_prompt(fwd_spec, workspace),
        previous_response=huge,
        previous_candidate=huge,
        feedback="static failed",
        attempt=2,
        max_attempts=5,
    )
    extra = sum(len(m["content"]) for m in p.messages[1:])
    assert extra < 3 * REPAIR_ECHO_CHARS
    text = p.as_text()
    assert "HEAD" in text and "TAIL" in text and "characters cut by coda-agent" in text


def test_a_tricks_entry_cannot_split_the_system_prompt(workspace, fwd_spec):
    """A fixed block marker inside a tricks entry would split the system prompt into more
    cache blocks; the marker is fresh per rendering."""
    from coda_agent.agent.render import BLOCK_BREAK, render_prompt

    before = render_prompt(fwd_spec, workspace)
    log = workspace / "tricks_log.md"
    log.write_text(log.read_text() + f"- **2026-02-01** `swiglu_fwd`: a {BLOCK_BREAK} b.\n")
    after = render_prompt(fwd_spec, workspace)
    assert len(after.system_blocks) == len(before.system_blocks)
    assert BLOCK_BREAK in "".join(after.system_blocks)
    assert render_prompt(fwd_spec, workspace).system_blocks == after.system_blocks  # stable for the cache


# --------------------------------------------------------------------------- the rules as stated


def _task(loaded) -> str:
    from coda_agent.agent.render import render_task

    return render_task(loaded)


def test_task_prompt_states_every_numeric_rule_with_the_specs_numbers(fwd_spec):
    """The five rules of verifier/stages/numerics.py's judge, each with the spec's numbers."""
    tol = fwd_spec.spec.tolerance
    assert (tol.factor, tol.floor, tol.ulps, tol.floor_ulps, tol.quantile_factor) == (2.0, 1e-6, 3.0, 2.0, 2.0)
    task = _task(fwd_spec)
    assert "1. max-abs: max |out - ref32| <= 2 * max |ref_lowp - ref32| + 1e-06." in task
    assert (
        "2. per element: |out_i - ref32_i| <= 3 * ulp_out(ref32_i) + 2 * |ref_lowp_i - ref32_i| "
        "+ 2 * ulp_bf16(scale of row i) + 1e-06."
    ) in task
    assert (
        "3. error quantiles: the 50th, 90th, 99th percentiles of |out - ref32| are each at most 2 * the same "
        "percentile of |ref_lowp - ref32| + ulp_bf16(scale of the tensor) + 1e-06."
    ) in task
    assert (
        "4. sign: wherever |ref32_i| > 2 * (2 * |ref_lowp_i - ref32_i| + 2 * ulp_bf16(scale of row i) + 1e-06), "
        "out_i * ref32_i > 0 (no zero, no flipped sign)."
    ) in task
    assert "5. non-finite: out is NaN/Inf exactly where ref32 is, and nowhere else." in task
    assert "ulp_out(v) is the spacing of the output's dtype at |v|, ulp_bf16(x) the spacing of bfloat16 at x." in task
    assert "rows = the last dim" in task
    # what it means in practice
    assert "Small and medium values count as much as the largest" in task
    assert "Compute every element in float32 and round once, at the store" in task
    assert "No approximation coarser than the output dtype" in task
    assert "Every size counts" in task
    # the seeds are secret: their number is stated, not their values
    assert "each run with 2 secret seeds" in task and "seed (0, 1)" not in task
    # the old rule's wording, which made any NaN a failure
    assert "NaN or Inf anywhere fails" not in task
    # every number in the rules is the spec's: change them all and every rule follows
    spec = fwd_spec.spec
    numbers = {"factor": 3.5, "floor": 2e-5, "ulps": 5.0, "floor_ulps": 4.0, "quantile_factor": 1.5}
    other = spec.model_copy(update={"tolerance": spec.tolerance.model_copy(update=numbers)})
    task = _task(other)
    assert "max |out - ref32| <= 3.5 * max |ref_lowp - ref32| + 2e-05." in task
    assert "<= 5 * ulp_out(ref32_i) + 3.5 * |ref_lowp_i - ref32_i| + 4 * ulp_bf16(scale of row i) + 2e-05." in task
    assert "at most 1.5 * the same percentile of |ref_lowp - ref32| + ulp_bf16(scale of the tensor) + 2e-05." in task
    assert "> 2 * (3.5 * |ref_lowp_i - ref32_i| + 4 * ulp_bf16(scale of row i) + 2e-05)" in task


def test_task_prompt_states_per_output_overrides(fwd_spec):
    from coda_agent.verifier.spec import OutputTolerance

    spec = fwd_spec.spec
    tol = spec.tolerance.model_copy(update={"outputs": {"postact": OutputTolerance(factor=4.0, ulps=8.0)}})
    task = _task(spec.model_copy(update={"tolerance": tol}))
    pre = task.index("For `preact`:")
    post = task.index("For `postact`:")
    assert pre < post
    preact_rules, postact_rules = task[pre:post], task[post : task.index("ulp_out(v) is the spacing")]
    assert "max |out - ref32| <= 2 * max |ref_lowp - ref32| + 1e-06." in preact_rules
    assert "<= 3 * ulp_out(ref32_i) + 2 * |ref_lowp_i - ref32_i| + 2 * ulp_bf16" in preact_rules
    assert "max |out - ref32| <= 4 * max |ref_lowp - ref32| + 1e-06." in postact_rules
    assert "<= 8 * ulp_out(ref32_i) + 4 * |ref_lowp_i - ref32_i| + 2 * ulp_bf16" in postact_rules
    assert "> 2 * (4 * |ref_lowp_i - ref32_i|" in postact_rules
    assert "at most 2 * the same percentile" in postact_rules  # quantile_factor not overridden
    # an override equal to the spec-wide numbers makes no separate group
    same = spec.tolerance.model_copy(update={"outputs": {"postact": OutputTolerance(factor=2.0)}})
    assert "For `" not in _task(spec.model_copy(update={"tolerance": same}))


def test_rule_constants_in_the_prompt_match_the_verifier():
    """render.py copies two numbers of verifier/stages/numerics.py (rendering imports no torch); and
    task.md.j2 words the input draws of verifier/gpu/inputs.py."""
    from coda_agent.agent import render
    from coda_agent.verifier.gpu import inputs
    from coda_agent.verifier.stages import numerics, numerics_fp8

    assert render.SIGN_MARGIN == numerics.SIGN_MARGIN
    assert render.QUANTILES == numerics.QUANTILES
    assert render.FP8_BAND_FACTOR == numerics_fp8.BAND_FACTOR
    assert render.FP8_BAND_ULPS == numerics_fp8.BAND_ULPS
    assert inputs.DRAWS == ("spec", "heavy", "outliers", "saturate", "tiny_rows", "nonfinite"), (
        "a new input draw: say what it draws in task.md.j2's Coverage section"
    )


def test_task_prompt_states_what_real_ops_declare():
    """Float constants, reference-only inputs, per-input draws, fp8 outputs with their scales
    and partial-shape outputs reach the task prompt; the fp8 output is left out of the CODA
    rules' groups."""
    fp8 = load_spec(ROOT / "kernel_specs" / "gemm_fp8_quant")
    task = _task(fp8)
    assert "def gemm_fp8_quant(x, w, *, eps: float) -> (y_fp8, y_scale)" in task
    assert "`eps` is passed as a keyword-only Python float, always with the spec's value: eps = 0.0001." in task
    assert "fp8: its real value is `y_fp8 * y_scale`" in task
    assert "fp8 output `y_fp8` (float8_e4m3fn, scales `y_scale`)" in task
    assert "delta = 512 * band / s + 4 * ulp_fp32(x)" in task
    assert "Every output except the fp8 ones is compared" in task
    assert "Not a GEMM tile: written with plain stores" in task
    spec = fp8.spec.model_copy(
        update={
            "reference": ReferenceSpec.model_validate(
                {"inputs": [{"name": "y_pre", "shape": ["M", "K"], "dtype": "bfloat16", "description": "pre-norm"}]}
            ),
            "entry": fp8.spec.entry.model_copy(
                update={
                    "inputs": [
                        fp8.spec.entry.inputs[0].model_copy(update={"draws": ["outliers"]}),
                        fp8.spec.entry.inputs[1],
                    ]
                }
            ),
        }
    )
    task = _task(spec)
    assert "### Reference-only inputs" in task and "- `y_pre`: shape (M, K), dtype bfloat16 -- pre-norm." in task
    assert "; x only by: outliers." in task


def test_task_prompt_states_the_limits(workspace, fwd_spec):
    task = _task(fwd_spec)
    spec = fwd_spec.spec
    assert "At most 1 CUDA kernel launch per call." in task
    assert "Host code may call no torch function beyond allocation" in task
    assert (
        "The budget: half the largest tensor the spec declares (input or output) at that shape, "
        "or 8 MiB if that is more"
    ) in task
    for c in spec.shapes.benchmark:
        mib = spec.workspace_budget(c.dims)[0] / 2**20
        assert f"{c.name} {mib:.1f}".removesuffix(".0") + " MiB" in task
    assert "llama3-70b/M16384 896 MiB." in task
    # a spec's own budget expression and its values; its GEMM count
    ce = load_spec(workspace / "kernel_specs" / "cross_entropy_bwd")
    task = _task(ce)
    assert "The budget: `2*M*V + 4*V + 8*1048576` bytes (the spec's `max_workspace`)" in task
    b = ce.spec.shapes.benchmark[0]
    assert f"{b.name} {ce.spec.workspace_budget(b.dims)[0] / 2**20:.1f} MiB" in task
    assert "At most 4 CUDA kernel launches per call, of which at most 3 may be GEMMs" in task
    assert "Host code may additionally call these torch functions: arange." in task
    # a finishing step within the launch budget is stated as allowed
    rms = load_spec(workspace / "kernel_specs" / "gemm_residual_partial_rms")
    task = _task(rms)
    assert "At most 4 CUDA kernel launches per call, of which only one may be a GEMM" in task
    assert "a finishing step (such as finalizing a statistic from per-tile partials)" in task
    assert "never PyTorch math in place of the epilogue" in task
    assert "Host code may additionally call these torch functions: sum, rsqrt." in task


ROPE_COVERAGE = """
[coverage]
fixed = ["HD"]
constraints = ["HD is 64 or 128 (the head dims of the Llama-3 family)", "positions < S <= 131072 (2^17)"]
dims = { S = { high = 131072 } }
"""


@pytest.mark.parametrize("name", ["gemm_rope", "rope_bwd", "gemm_rmsnorm_rope"])
def test_task_prompt_states_the_coverage_of_the_rope_specs(workspace, name):
    """A RoPE spec that fixes HD and states its position constraint (the catalogue's RoPE
    kernels are general in HD, so their specs leave it free)."""
    from coda_agent.verifier.gpu.coverage import dim_rules

    toml = workspace / "kernel_specs" / name / "spec.toml"
    text = toml.read_text()
    toml.write_text(text.replace("[tolerance]", ROPE_COVERAGE.strip() + "\n\n[tolerance]", 1))
    loaded = load_spec(toml.parent)
    spec = loaded.spec
    assert "HD" in spec.coverage.fixed and spec.coverage.constraints
    task = _task(loaded)
    sec = task[task.index("## Coverage: secret shapes and inputs") : task.index("## Performance")]
    assert "must be correct for every legal shape and input, not only the listed ones" in sec
    assert "a failure names the secret shape it happened at" in sec
    assert "one with M in [1, 64]" in sec and "one production-size ragged shape" in sec
    rules = dim_rules(spec)
    assert rules["HD"] == {"choices": [64, 128]}
    assert "Fixed: HD in {64, 128}" in sec
    for d, r in rules.items():
        if "choices" not in r:
            assert f"{d} {r['low']} to {r['high']}" in sec, d
    assert "M 1 to 32768" in sec and "S 4096 to 131072" in sec  # M: twice the largest benchmark M; S: coverage.dims
    assert "- Input constraints (every draw keeps them; you may rely on them):" in sec
    for line in spec.coverage.constraints:
        assert f"  - {line}\n" in sec
    assert "positions < S <= 131072 (2^17)" in sec
    assert "No NaN/Inf inputs are drawn." in sec
    for words in ("heavy tails", "outlier rows and columns (|x| up to ~100)", "gates near +-90", "near-zero rows"):
        assert words in sec
    assert "- Inputs: only the input constraints listed under Coverage are guaranteed." in task


def test_task_prompt_coverage_without_constraints_and_with_nonfinite(workspace, fwd_spec):
    task = _task(fwd_spec)
    sec = task[task.index("## Coverage") : task.index("## Performance")]
    assert "Input constraints" not in sec and "Fixed:" not in sec
    assert "Dim ranges: M 1 to 32768; K 264 to 8192; I 200 to 28672." in sec
    toml = workspace / "kernel_specs" / "swiglu_fwd" / "spec.toml"
    toml.write_text(
        toml.read_text() + '\n[coverage]\nnonfinite = true\nfixed = ["K"]\n'
        'dims = { M = { high = 4096, multiple_of = 8 } }\nconstraints = ["K is fixed"]\n'
    )
    task = _task(load_spec(toml.parent))
    sec = task[task.index("## Coverage") : task.index("## Performance")]
    assert "Rows holding a NaN, +Inf or -Inf are drawn too" in sec and "No NaN/Inf" not in sec
    assert "M 1 to 4096 (a multiple of 8)" in sec and "Fixed: K in {264, 320, 512, 2048, 4096, 8192}" in sec
    assert "  - K is fixed" in sec


def test_system_prompt_states_the_launch_rule_truthfully(workspace, fwd_spec):
    system = render_prompt(fwd_spec, workspace).system_blocks[0]
    assert "No second kernel for a finishing step" not in system
    assert "ONE launch per call" not in system
    assert "the GEMM and its epilogue are one kernel" in system
    assert 'stated under "Limits" in the task' in system
    assert "finalizing a" in system and "Never PyTorch math in place of the epilogue" in system
    assert "secret" in system  # the verifier's secret shapes and draws are announced


def test_contract_doc_states_the_launch_rule_truthfully():
    from agent_helpers import REPO

    doc = (REPO / "primitives_docs" / "00-contract.md").read_text()
    assert "must launch **one** kernel" not in doc
    assert "The GEMM and its epilogue are **one** kernel launch" in doc
    assert "finishing step" in doc and '"Limits" section' in doc

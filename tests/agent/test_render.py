"""The rendered prompt holds the docs, examples, tricks and the whole spec, and never
the target's own accepted kernel."""

from __future__ import annotations

import hashlib
import json
import math

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
from coda_agent.verifier.spec import load_spec


def test_prompt_contains_docs_examples_tricks_and_spec(workspace, fwd_spec):
    p = render_prompt(fwd_spec, workspace)
    text = p.as_text()
    for marker in (DOC_MARKER, DOC2_MARKER, BWD_MARKER, GELU_MARKER, RMS_MARKER, TRICK_MARKER):
        assert marker in text, marker
    # docs appear with their file names, sorted
    assert '<doc file="00_gemm_epilogue.md">' in text
    assert text.index("00_gemm_epilogue.md") < text.index("10_math.md")
    # examples carry the manifest header
    assert "Accepted kernel: spec `swiglu_bwd`, pattern backward, CODA catalogue item 7, quack mode 'packed_cd_b16x2'." in text
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
    assert "(bfloat16)" in task
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
    # not an example until its manifest records a GPU verification of this very file (red team 16)
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
    assert "try`/`except" in p.system_blocks[0] and "ONE launch per call" in p.system_blocks[0]
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
        base, previous_response="prose\n```python\n" + cand + "```", previous_candidate=cand,
        feedback="Stage correctness fail: postact off by 0.75 at line 4", attempt=2, max_attempts=5,
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
    r2 = build_repair_prompt(base, previous_response="no code", previous_candidate=None,
                             feedback="no ```python block", attempt=3, max_attempts=5)
    assert "No module could be extracted" in r2.messages[2]["content"]
    assert "line numbers as the feedback uses them" not in r2.messages[2]["content"]


def test_lesson_prompt(workspace, fwd_spec):
    base = render_prompt(fwd_spec, workspace)
    lp = build_lesson_prompt(base, kernel="swiglu_fwd", failed_attempt=1,
                             feedback="NaN in ragged tile", diff="-old line\n+new line")
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
    r = build_repair_prompt(base, previous_response="r", previous_candidate=cand, feedback="fb",
                            attempt=2, max_attempts=3)
    last = r.messages[-1]["content"]
    assert "\n````\n1 | \"\"\"Doc." in last and "\n7 | x = 1\n````\n" in last


def test_repair_prompt_repeats_a_huge_answer_only_clipped(workspace, fwd_spec):
    """A 5.7 MB answer made a 1.4M-token repair prompt (red team 16): the previous answer and
    module are repeated up to REPAIR_ECHO_CHARS each, head and tail kept."""
    from coda_agent.agent.render import REPAIR_ECHO_CHARS, build_repair_prompt, render_prompt

    huge = "HEAD\n" + "x = 1\n" * 1_000_000 + "TAIL\n"
    p = build_repair_prompt(render_prompt(fwd_spec, workspace), previous_response=huge, previous_candidate=huge,
                            feedback="static failed", attempt=2, max_attempts=5)
    extra = sum(len(m["content"]) for m in p.messages[1:])
    assert extra < 3 * REPAIR_ECHO_CHARS
    text = p.as_text()
    assert "HEAD" in text and "TAIL" in text and "characters cut by coda-agent" in text


def test_a_tricks_entry_cannot_split_the_system_prompt(workspace, fwd_spec):
    """The fixed block marker inside a tricks entry split the system prompt into more
    cache blocks (red team 16); the marker is fresh per rendering."""
    from coda_agent.agent.render import BLOCK_BREAK, render_prompt

    before = render_prompt(fwd_spec, workspace)
    log = workspace / "tricks_log.md"
    log.write_text(log.read_text() + f"- **2026-02-01** `swiglu_fwd`: a {BLOCK_BREAK} b.\n")
    after = render_prompt(fwd_spec, workspace)
    assert len(after.system_blocks) == len(before.system_blocks)
    assert BLOCK_BREAK in "".join(after.system_blocks)
    assert render_prompt(fwd_spec, workspace).system_blocks == after.system_blocks  # stable for the cache

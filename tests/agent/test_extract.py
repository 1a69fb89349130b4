"""extract_module: exactly one Python module out of a model reply, or a clear error."""

from __future__ import annotations

import pytest

from coda_agent.agent.extract import ExtractError, extract_module

MOD = "import torch\n\n\ndef f(x):\n    return x\n"


def test_single_block_with_prose_around():
    r = f"Sure! Here is the kernel:\n\n```python\n{MOD}```\n\nIt fuses everything. Let me know.\n"
    assert extract_module(r) == MOD


@pytest.mark.parametrize("label", ["py", "python3", "Python", "python title=kernel.py"])
def test_label_variants(label):
    assert extract_module(f"```{label}\n{MOD}```") == MOD


def test_crlf_and_cr_line_endings():
    r = "Intro\r\n```python\r\n" + MOD.replace("\n", "\r\n") + "```\r\nbye\r\n"
    assert extract_module(r) == MOD
    assert extract_module(r.replace("\r\n", "\r")) == MOD


def test_single_unlabeled_block_with_python_ok():
    assert extract_module(f"text\n```\n{MOD}```\n") == MOD


def test_unlabeled_non_python_block_is_not_a_module():
    with pytest.raises(ExtractError, match=r"no ```python code block"):
        extract_module("Run this:\n```\n$ make -j && ./run --flag=[\n```\n")


def test_two_python_blocks_rejected_with_lines():
    r = f"Part 1\n```python\n{MOD}```\nPart 2\n```python\nx = 1\n```\n"
    with pytest.raises(ExtractError) as ei:
        extract_module(r)
    msg = str(ei.value)
    assert "2 ```python blocks" in msg and "lines 2, 10" in msg and "single block" in msg


def test_no_block_rejected():
    with pytest.raises(ExtractError) as ei:
        extract_module("I think the kernel should use acc_pair mode.")
    assert "no ```python code block" in str(ei.value)
    assert "exactly ONE fenced code block" in str(ei.value)


def test_other_language_blocks_ignored():
    r = f"```bash\npip install quack\n```\n\n```python\n{MOD}```\n```text\noutput\n```\n"
    assert extract_module(r) == MOD


def test_only_other_language_blocks_named_in_error():
    with pytest.raises(ExtractError, match=r"found only blocks labelled bash"):
        extract_module("```bash\nls\n```\n")


def test_fenced_snippet_inside_docstring_keeps_whole_module():
    mod = '"""Kernel.\n\nUsage:\n\n```python\nout = f(x)\n```\n"""\nimport torch\n\n\ndef f(x):\n    return x\n'
    assert extract_module(f"Here:\n```python\n{mod}```\nDone.\n") == mod


def test_longer_fence_contains_triple_backticks():
    mod = 'S = """\n```\nnot a fence for the outer block\n```\n"""\n'
    assert extract_module(f"````python\n{mod}````\n") == mod


def test_inline_backticks_in_strings_are_fine():
    mod = 'x = "```python"\ny = 1  # ``` inline\n'
    assert extract_module(f"```python\n{mod}```") == mod


def test_tilde_fence_and_indented_fence():
    assert extract_module(f"~~~python\n{MOD}~~~\n") == MOD
    assert extract_module(f"   ```python\n{MOD}   ```\n") == MOD


def test_unclosed_block_is_an_error():
    with pytest.raises(ExtractError, match=r"never closed.*cut off"):
        extract_module(f"```python\n{MOD}")


def test_closed_block_then_truncated_second_python_block():
    with pytest.raises(ExtractError, match=r"2 ```python blocks"):
        extract_module(f"```python\n{MOD}```\nAnd usage:\n```python\nf(")


def test_empty_block_is_an_error():
    with pytest.raises(ExtractError, match=r"is empty"):
        extract_module("```python\n\n```")


def test_result_ends_with_single_newline():
    assert extract_module("```python\n\n\nx = 1   \n\n\n```") == "x = 1\n"


def test_unlabeled_block_plus_python_block_takes_python():
    r = f"```\nsome output\n```\n```python\n{MOD}```"
    assert extract_module(r) == MOD


def test_a_leading_byte_order_mark_is_ignored():
    """A BOM before the first fence does not make the answer read as cut off."""
    assert extract_module("\ufeff```python\n" + MOD + "```\n") == MOD


def test_a_degenerate_answer_of_many_broken_blocks_is_fast():
    """Trying every later closing fence for every broken block is cubic (800 blocks take
    35 s); only a block cut inside a docstring is extended, at most MAX_EXTENSIONS."""
    import time

    t0 = time.monotonic()
    with pytest.raises(ExtractError):
        extract_module("```python\ndef f(:\n```\n" * 800)
    assert time.monotonic() - t0 < 5


# A module whose docstring holds a fenced snippet, cut off (max_tokens) after the snippet:
# the snippet's closing fence closes the ```python block, so the block is "closed" but
# holds an unterminated docstring.
CUT_IN_DOCSTRING = '```python\n"""Epilogue.\n\nExample:\n```python\nout = f(x)\n```\nThe row scale is applied'


def test_a_cut_inside_a_docstring_snippet_is_reported_as_cut_off():
    with pytest.raises(
        ExtractError,
        match=r"stopped at the output token limit and the code block at line 1 "
        r"does not parse \(line 1 of its 5: unterminated triple-quoted string.*cut off",
    ):
        extract_module(CUT_IN_DOCSTRING, stopped_at_limit=True)
    # Without the backend's word that it stopped at the limit this is an ordinary broken
    # module: returned, and the verifier's static stage reports the syntax error.
    assert extract_module(CUT_IN_DOCSTRING).startswith('"""Epilogue.')
    # A complete module in an answer that ran on past its block into the limit is fine.
    assert extract_module(f"```python\n{MOD}```\nAnd a long explanation that was cut", stopped_at_limit=True) == MOD


def test_a_cut_in_an_unfinished_tail_statement_is_cut_off():
    body = "import torch\n" + "x = 1\n" * 40 + "y = torch.cat((x,\n    x,"
    with pytest.raises(ExtractError, match=r"line 42 of its 43: '\(' was never closed\): it was cut off"):
        extract_module("```python\n" + body + "\n```\nmore", stopped_at_limit=True)


def test_a_real_syntax_error_far_from_the_end_is_left_to_the_verifier():
    """A complete module with ``def f(x:`` near its top, then prose that ran into the limit:
    a real syntax error, not a cut-off (which would lose its line), returned so the static
    stage reports it with its line."""
    body = "import torch\n\ndef f(x:\n    return x\n" + "y = 2\n" * 50
    got = extract_module("```python\n" + body + "```\nThe kernel works because", stopped_at_limit=True)
    assert got == body


def test_a_module_nested_too_deeply_is_extracted_for_the_static_stage():
    """A RecursionError from ast.parse must not escape the extractor (the loop would crash
    on the answer, and on every resume): it counts as 'does not parse', the module is handed
    on and the static stage reports it; a cut-off answer says so."""
    module = "import torch\nm = 1\nk = " + " + ".join(["m"] * 3000) + "\n"
    assert extract_module(f"Here:\n\n```python\n{module}```\n") == module
    # not a cut: a module that stopped at the token limit is called cut off only for a
    # syntax error near its end, and this one is whole
    assert extract_module(f"```python\n{module}```\n", stopped_at_limit=True) == module
    # an unlabeled block that does not parse is no module (ambiguity is judged by parsing)
    with pytest.raises(ExtractError, match="no ```python code block"):
        extract_module(f"```\n{module}```\n")

"""Pull the candidate module out of a model response.

Design
------
The system prompt asks for exactly one fenced ```python block holding the whole module.
Anything else is an error whose message is written *to the model* (it becomes the
feedback of the failed attempt), so the messages say what was wrong and what to send.

The scanner follows CommonMark's fence rules closely enough for model output:

* a fence is a line of >= 3 backticks (or tildes) indented at most 3 spaces, with an
  optional info string (``python``, ``py``, ``python3`` ... count as Python);
* a block is closed by a bare fence of the same character at least as long;
* line endings are normalized first (CRLF / CR), so Windows-style responses work.

Two pragmatic additions:

* a docstring inside the module may itself contain a fenced snippet; its bare closing
  fence would end the block early. When the naive block does not parse as Python, the
  scanner extends it to a later bare fence where the whole content does parse;
* one *unlabeled* block is accepted when it is the only code block that parses as
  Python (models sometimes drop the label); blocks labelled with another language
  (``bash``, ``text`` ...) are ignored.

An unclosed block is an error (the response was most likely cut off at ``max_tokens``),
never silently accepted: a truncated module can still parse.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

PYTHON_LABELS = frozenset({"python", "py", "python3", "py3"})
_FENCE_RE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$")

FORMAT_REMINDER = (
    "Reply with exactly ONE fenced code block that starts with ```python on its own line, "
    "holds the whole module, and ends with ``` on its own line."
)


class ExtractError(ValueError):
    """No single Python module could be extracted; ``str(err)`` is meant for the model."""


@dataclass
class _Block:
    label: str
    start: int  # 1-based line of the opening fence
    body: str
    closed: bool


def _parses(src: str) -> bool:
    return _parse_error(src) is None


def _parse_error(src: str) -> str | None:
    e = _syntax_error(src)
    return None if e is None else str(getattr(e, "msg", e))


def _syntax_error(src: str) -> SyntaxError | ValueError | RecursionError | MemoryError | None:
    """Why ``src`` does not parse, or None. A tree deeper than the parser's recursion limit
    (a chain of ~3000 ``+`` terms) counts as not parsing: otherwise it would raise out of
    the loop and leave the run stuck on that answer."""
    try:
        ast.parse(src)
    except (SyntaxError, ValueError) as e:
        return e
    except (RecursionError, MemoryError) as e:
        return type(e)(f"nested too deeply to parse ({type(e).__name__}); split long expressions into statements")
    return None


CUT_TAIL_LINES = 20
"""A module that stopped at the output token limit and does not parse is called cut off
when its error is an unterminated triple-quoted string (a cut inside a docstring) or lies
in its last this many lines (an unfinished statement or bracket); an error further up is
a real syntax error, left for the verifier's static stage to report with its line."""


MAX_EXTENSIONS = 64
"""Later closing fences tried when a block ends inside a docstring (each try parses the
block again: trying every one makes a degenerate answer of 800 broken blocks take 35 s)."""


def _is_closing(line: str, char: str, length: int) -> bool:
    s = line.strip()
    return len(line) - len(line.lstrip(" ")) <= 3 and len(s) >= length and set(s) == {char}


def _scan(text: str) -> list[_Block]:
    lines = text.split("\n")
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, label = m.group(2), m.group(3).lower()
        char, length = fence[0], len(fence)
        closers = [j for j in range(i + 1, len(lines)) if _is_closing(lines[j], char, length)]
        if not closers:
            blocks.append(_Block(label, i + 1, "\n".join(lines[i + 1 :]), closed=False))
            break
        end = closers[0]
        if label in PYTHON_LABELS or not label:
            body = "\n".join(lines[i + 1 : end])
            err = _parse_error(body)
            if err is not None and "unterminated triple-quoted string" in err:
                # A fenced snippet inside a docstring closed the block early: take the
                # first later closing fence where the whole content parses.
                for j in closers[1 : 1 + MAX_EXTENSIONS]:
                    if _parses("\n".join(lines[i + 1 : j])):
                        end = j
                        break
        blocks.append(_Block(label, i + 1, "\n".join(lines[i + 1 : end]), closed=True))
        i = end + 1
    return blocks


def extract_module(response: str, *, stopped_at_limit: bool = False) -> str:
    """The single Python module in ``response`` (ends with a newline).

    ``stopped_at_limit``: the backend reported that the response stopped at the output
    token limit (``stop_reason`` ``max_tokens`` or ``model_context_window_exceeded``). A
    module that then does not parse near its end (:data:`CUT_TAIL_LINES`) or inside a
    docstring is reported as cut off, not left to fail as a syntax error: a cut inside a
    docstring that holds a fenced snippet leaves a *closed* block (the snippet's fence
    closes it).

    Raises :class:`ExtractError` when there is no Python block, several, an empty one,
    one that is never closed, or (``stopped_at_limit``) one cut off as above; the
    message tells the model what to send instead.
    """
    # a leading byte-order mark (a Windows editor, --llm manual) hid the first fence
    text = response.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    blocks = _scan(text)
    unclosed = [b for b in blocks if not b.closed and (b.label in PYTHON_LABELS or not b.label)]
    labelled = [b for b in blocks if b.closed and b.label in PYTHON_LABELS]
    if not labelled and unclosed:
        b = unclosed[0]
        raise ExtractError(
            f"The code block opened at line {b.start} of your response is never closed -- the "
            "response was probably cut off (too long). Nothing was verified. Send the complete "
            f"module again, as compactly as you can. {FORMAT_REMINDER}"
        )
    if labelled and any(b.label in PYTHON_LABELS for b in unclosed):
        labelled = labelled + [b for b in unclosed if b.label in PYTHON_LABELS]
    if len(labelled) > 1:
        where = ", ".join(str(b.start) for b in labelled)
        raise ExtractError(
            f"Your response contains {len(labelled)} ```python blocks (opening at lines {where}); "
            "only one module can be verified and it is ambiguous which. Put the whole module -- "
            f"imports, epilogues, helpers and the entry function -- in a single block. {FORMAT_REMINDER}"
        )
    if labelled:
        chosen = labelled[0]
    else:
        plain = [b for b in blocks if b.closed and not b.label and b.body.strip()]
        python_like = [b for b in plain if _parses(b.body)]
        if len(python_like) == 1:
            chosen = python_like[0]
        elif len(python_like) > 1:
            raise ExtractError(
                f"Your response has no ```python block and {len(python_like)} unlabeled code "
                f"blocks; it is ambiguous which one is the module. {FORMAT_REMINDER}"
            )
        else:
            others = sorted({b.label for b in blocks if b.label})
            extra = f" (found only blocks labelled {', '.join(others)})" if others else ""
            raise ExtractError(f"Your response contains no ```python code block{extra}. {FORMAT_REMINDER}")
    body = chosen.body.strip("\n")
    if not body.strip():
        raise ExtractError(f"The ```python block at line {chosen.start} of your response is empty. {FORMAT_REMINDER}")
    err = _syntax_error(body) if stopped_at_limit else None
    if isinstance(err, SyntaxError):  # a tree too deep, or a null byte, is no sign of a cut
        line = getattr(err, "lineno", None) or 0
        msg = str(getattr(err, "msg", err))
        n_lines = body.count("\n") + 1
        if "unterminated triple-quoted string" in msg or line > n_lines - CUT_TAIL_LINES:
            raise ExtractError(
                f"Your response stopped at the output token limit and the code block at line {chosen.start} "
                f"does not parse (line {line} of its {n_lines}: {msg}): it was cut off. Nothing was verified. "
                f"Send the complete module again, as compactly as you can. {FORMAT_REMINDER}"
            )
    return body.rstrip() + "\n"

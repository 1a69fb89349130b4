"""Render a spec and its prompt pack into the exact prompt the model receives.

Design
------
A :class:`Prompt` is structured -- ``system_blocks`` plus chat ``messages`` -- rather
than one string, because the Anthropic backend sends the system prompt as a list of
text blocks and marks the *last static block* with ``cache_control``: the rules, the
primitive docs, the examples and the tricks log are identical for every attempt of a
run (and the lesson prompt), so after the first call they are read from the prompt
cache at a tenth of the price. The backends that take plain text (``command``,
``manual``) and ``coda-agent prompt SPEC`` use :meth:`Prompt.as_text`, which
serializes the same structure, so what a human reads is what the model gets.

All wording lives in ``agent/prompts/*.md.j2`` (jinja2 with ``StrictUndefined``: a
typo in a template variable is an error, never an empty string in a prompt).
``system.md.j2`` renders every system block in one go, separated by a sentinel line
that this module splits on; so one template file shows the whole system prompt.

Prompts of a run:

* ``task``   -- system blocks + one user message: the spec.
* ``repair`` -- same system blocks; user: the task, assistant: the previous response,
  user: the verifier's feedback, the previous candidate (line-numbered, as the
  feedback's line numbers refer to it) and the instruction to return the whole
  corrected module. Only the *latest* attempt is replayed, so the context does not grow
  with the number of attempts.
* ``lesson`` -- same system blocks; user: attempt k's failure feedback and the diff
  that made attempt k+1 pass; asks for one sentence for ``tricks_log.md``.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from pathlib import Path
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, Field

from .context import PromptContext, gather_context, spec_mode

PROMPTS_DIR = Path(__file__).parent / "prompts"
BLOCK_BREAK = "<<<CODA-SYSTEM-BLOCK-BREAK>>>"
CHARS_PER_TOKEN = 4
"""Token estimate heuristic: ~4 characters per token for English + code (an estimate,
not the tokenizer; the real counts come back in the API's usage)."""


class Prompt(BaseModel):
    """What one LLM call receives.

    ``system_blocks[:static_blocks]`` are static (identical across a run's attempts);
    the backend puts ``cache_control`` on ``system_blocks[static_blocks - 1]`` (see
    :attr:`cache_block_index`). ``cache_messages`` lists message indices whose content
    is also stable across attempts (the task message) and may carry a second cache
    breakpoint.
    """

    kind: Literal["task", "repair", "lesson"]
    spec: str | None = None
    system_blocks: list[str]
    static_blocks: int = Field(ge=0)
    messages: list[dict[str, str]]
    cache_messages: list[int] = Field(default_factory=list)

    @property
    def cache_block_index(self) -> int | None:
        """Index of the last static system block (where ``cache_control`` goes)."""
        return self.static_blocks - 1 if self.static_blocks > 0 else None

    @property
    def system_text(self) -> str:
        return "\n\n".join(self.system_blocks)

    def as_text(self) -> str:
        """The whole prompt as one text: system blocks then each message, with headers.

        This is what ``coda-agent prompt SPEC`` prints, what the ``command`` backend
        pipes into its command and what the ``manual`` backend writes to ``prompt.md``.
        """
        parts = ["=== SYSTEM ===", self.system_text]
        for m in self.messages:
            parts += [f"=== {m['role'].upper()} ===", m["content"]]
        return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"

    def estimate_tokens(self) -> int:
        """Rough input-token count: characters / 4 (a heuristic, not the tokenizer)."""
        n = sum(len(b) for b in self.system_blocks) + sum(len(m["content"]) for m in self.messages)
        return (n + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN

    def sha256(self) -> str:
        """Hash of :meth:`as_text` (recorded as provenance of an accepted kernel)."""
        return hashlib.sha256(self.as_text().encode()).hexdigest()

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        data["estimated_tokens"] = self.estimate_tokens()
        data["sha256"] = self.sha256()
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Prompt":
        data = json.loads(text)
        data.pop("estimated_tokens", None)
        data.pop("sha256", None)
        return cls.model_validate(data)


# --------------------------------------------------------------------------- jinja


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(PROMPTS_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def fence(text: str) -> str:
    """A backtick fence longer than any backtick run in ``text`` (so code holding
    ``` lines, e.g. in a docstring, cannot close the block it is shown in)."""
    longest = max((len(m) for m in re.findall(r"`+", str(text))), default=0)
    return "`" * max(3, longest + 1)


def _render(template: str, **kw: Any) -> str:
    return _env().get_template(template).render(fence=fence, **kw).strip() + "\n"


def number_lines(source: str) -> str:
    """``source`` with right-aligned 1-based line numbers (the feedback refers to them)."""
    lines = source.splitlines()
    w = len(str(len(lines))) if lines else 1
    return "\n".join(f"{i:>{w}} | {line}" if line else f"{i:>{w}} |" for i, line in enumerate(lines, 1))


# --------------------------------------------------------------------------- spec view


def _fmt_num(x: float | int | str) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x)) if abs(x) < 1e15 else repr(x)
    return str(x)


def _init_words(init: Any) -> str:
    if init.dist == "normal":
        mean = f"{_fmt_num(init.mean)} + " if init.mean else ""
        std = "" if init.std in (1, 1.0, "1") else f"{_fmt_num(init.std)} * "
        return f"{mean}{std}N(0, 1)"
    if init.dist == "uniform":
        return f"U({_fmt_num(init.low)}, {_fmt_num(init.high)})"
    if init.dist == "derived":
        return "not random: computed from the inputs above, as its description says"
    return f"integers in [{_fmt_num(init.low)}, {_fmt_num(init.high)})"


def _shape_str(shape: list[str | int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


SIGN_MARGIN = 2.0
"""``verifier.numerics.SIGN_MARGIN``, which the sign rule's text states (a copy: the prompt
is rendered without importing torch; ``tests/agent/test_render.py`` checks they agree)."""
QUANTILES = (0.5, 0.9, 0.99)
"""``verifier.numerics.QUANTILES``, the error percentiles the quantile rule compares (a copy,
checked like :data:`SIGN_MARGIN`)."""
_ULP_NAME = {"bfloat16": "ulp_bf16", "float16": "ulp_fp16", "float32": "ulp_fp32"}
FP8_BAND_FACTOR = 512.0
"""``verifier.stages.numerics_fp8.BAND_FACTOR``, which the fp8 rule's text states (a copy,
checked like :data:`SIGN_MARGIN`)."""
FP8_BAND_ULPS = 4.0
"""``verifier.stages.numerics_fp8.BAND_ULPS`` (a copy, checked like :data:`SIGN_MARGIN`)."""


def _tolerance_view(spec: Any) -> dict[str, Any]:
    """The numeric rules' numbers, grouped: outputs with the same effective numbers (after
    ``[tolerance.outputs.<name>]`` overrides) share one group, in output order."""
    tol = spec.tolerance
    groups: list[dict[str, Any]] = []
    for o in spec.entry.outputs:
        if o.scale is not None:
            continue  # an fp8 output: the fp8 rule (fp8 below)
        t = tol.for_output(o.name)
        nums = {
            "factor": _fmt_num(t.factor),
            "floor": f"{t.floor:g}",
            "ulps": _fmt_num(t.ulps),
            "floor_ulps": _fmt_num(t.floor_ulps),
            "quantile_factor": _fmt_num(t.quantile_factor),
        }
        for g in groups:
            if g["nums"] == nums:
                g["outputs"].append(o.name)
                break
        else:
            groups.append({"outputs": [o.name], "nums": nums})
    return {
        "rule": tol.rule,
        "lowp": spec.low_precision,
        "ulp_low": _ULP_NAME[spec.low_precision],
        "groups": [{"outputs": g["outputs"], **g["nums"]} for g in groups],
        "sign_margin": _fmt_num(SIGN_MARGIN),
        "quantiles": ", ".join(f"{round(q * 100)}th" for q in QUANTILES),
        "fp8": [{"name": o.name, "scale": o.scale, "dtype": o.dtype} for o in spec.entry.outputs if o.scale],
        "fp8_band_factor": _fmt_num(FP8_BAND_FACTOR),
        "fp8_band_ulps": _fmt_num(FP8_BAND_ULPS),
    }


def _fmt_mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f}".removesuffix(".0") + " MiB"


def _workspace_view(spec: Any) -> dict[str, Any]:
    """The workspace rule and its value at each benchmark shape (the correctness shapes
    when the spec has none)."""
    from ..verifier.spec import WORKSPACE_FLOOR

    cases = spec.shapes.benchmark or spec.shapes.correctness
    return {
        "expr": None if spec.entry.max_workspace is None else str(spec.entry.max_workspace),
        "floor": _fmt_mib(WORKSPACE_FLOOR),
        "where": "benchmark" if spec.shapes.benchmark else "correctness",
        "at": [
            {"name": c.name or f"case{i}", "budget": _fmt_mib(spec.workspace_budget(spec.dims_of(c))[0])}
            for i, c in enumerate(cases)
        ],
    }


def _coverage_view(spec: Any) -> dict[str, Any]:
    """The secret coverage draws of ``spec`` (``verifier/gpu/coverage.py``) in words."""
    from ..verifier.gpu import coverage as cov

    rules = cov.dim_rules(spec)
    order = list(dict.fromkeys(d for c in (*spec.shapes.correctness, *spec.shapes.benchmark) for d in c.dims))
    order = [cov.ROW_DIM] * (cov.ROW_DIM in rules) + [d for d in order if d != cov.ROW_DIM and d in rules]
    ranges, fixed, choices = [], [], []
    for d in order:
        r = rules[d]
        if "choices" in r:
            vals = ", ".join(str(v) for v in r["choices"])
            if d in spec.coverage.fixed or d not in spec.coverage.dims:
                fixed.append(f"{d} = {vals}" if len(r["choices"]) == 1 else f"{d} in {{{vals}}}")
            else:
                choices.append(f"{d} in {{{vals}}}")
        else:
            mult = f" (a multiple of {r['multiple_of']})" if r["multiple_of"] > 1 else ""
            ranges.append(f"{d} {r['low']} to {r['high']}{mult}")
    m = cov.ROW_DIM if cov.ROW_DIM in rules else None
    shapes = []
    if spec.shapes.benchmark:
        shapes.append(
            f"one production-size ragged shape (a benchmark shape{f' with {m} redrawn in [{m}/2, 2{m}]' if m else ''}, "
            f"the other free dims moved off multiples of {cov.RAGGED_TO})"
        )
    if m:
        shapes.append(f"one with {m} in [1, {cov.TINY_M}]")
    shapes.append(
        f"one per input draw below with each dim drawn log-uniform, ragged (no multiple of {cov.RAGGED_TO}) "
        f"or aligned (a multiple of {cov.ALIGNED_TO}) with equal odds"
    )
    return {
        "shapes": ", ".join(shapes[:-1]) + (", and " if len(shapes) > 1 else "") + shapes[-1],
        "ranges": "; ".join(ranges),
        "fixed": ", ".join(fixed),
        "choices": ", ".join(choices),
        "nonfinite": spec.coverage.nonfinite,
        "plain_inputs": list(spec.coverage.plain_inputs)
        + [t.name for t in spec.all_inputs if t.draws == [] and t.name not in spec.coverage.plain_inputs],
        "own_draws": [
            {"name": t.name, "draws": ", ".join(d.replace("_", " ") for d in t.draws)}
            for t in spec.all_inputs
            if t.draws
        ],
        "constraints": list(spec.coverage.constraints),
    }


def spec_view(loaded: Any) -> dict[str, Any]:
    """Plain data for ``task.md.j2`` from a ``LoadedSpec`` (or ``KernelSpec``)."""
    spec = getattr(loaded, "spec", loaded)

    def input_view(t: Any) -> dict[str, Any]:
        return {
            "name": t.name,
            "shape": _shape_str(t.shape),
            "dtype": t.dtype,
            "description": t.description,
            "layout": t.layout,
            "init": _init_words(t.init),
            "partial": t.partial,
        }

    inputs = [input_view(t) for t in spec.entry.inputs]
    outputs = []
    for t in spec.entry.outputs:
        g = t.gradient
        outputs.append(
            {
                "name": t.name,
                "shape": _shape_str(t.shape),
                "dtype": t.dtype,
                "description": t.description,
                "partial": t.partial,
                "scale": t.scale,
                "gradient": None
                if g is None
                else {
                    "of": g.of,
                    "wrt": g.wrt,
                    "upstream": g.upstream,
                    "args": ", ".join(f"{i.name}={i.name}" for i in spec.all_inputs if i.name != g.upstream),
                },
            }
        )

    def case_view(c: Any) -> dict[str, Any]:
        dims = spec.dims_of(c)
        ragged = sorted(k for k, v in dims.items() if v % 128 and k not in spec.entry.constants)
        return {
            "name": c.name or "-",
            "dims": ", ".join(f"{k}={v}" for k, v in dims.items()),
            "ragged": ragged,
            "inputs": ", ".join(f"{t.name}{spec.shape_of(t, dims)}" for t in spec.entry.inputs),
            "outputs": ", ".join(f"{t.name}{spec.shape_of(t, dims)}" for t in spec.entry.outputs),
        }

    return {
        "name": spec.name,
        "description": " ".join(spec.description.split()),
        "pattern": spec.pattern,
        "catalogue_item": spec.catalogue_item,
        "mode": spec_mode(spec),
        "math": spec.math.strip(),
        "signature": spec.signature(),
        "function": spec.entry.function,
        "input_names": ", ".join(
            [t.name for t in spec.entry.inputs] + (["*"] + spec.entry.keyword_names if spec.entry.keyword_names else [])
        ),
        "constants": list(spec.entry.constants),
        "float_constants": [{"name": k, "value": f"{v:g}"} for k, v in spec.entry.float_constants.items()],
        "reference_inputs": [input_view(t) for t in spec.reference.inputs],
        "output_names": ", ".join(t.name for t in spec.entry.outputs),
        "inputs": inputs,
        "outputs": outputs,
        "max_launches": spec.entry.max_launches,
        "max_gemm_launches": spec.entry.max_gemm_launches,
        "allowed_torch": list(spec.entry.allowed_torch),
        "workspace": _workspace_view(spec),
        "tolerance": _tolerance_view(spec),
        "coverage": _coverage_view(spec),
        "n_seeds": len(spec.shapes.seeds),
        "correctness": [case_view(c) for c in spec.shapes.correctness],
        "benchmark": [case_view(c) for c in spec.shapes.benchmark],
        "flops": spec.bench.flops,
        "baselines": list(spec.bench.baselines),
        "bar": [{"baseline": k, "ratio": str(v)} for k, v in sorted(spec.bench.bar.items())],
        "hints": list(spec.hints),
    }


# --------------------------------------------------------------------------- prompts


def render_system(ctx: PromptContext) -> list[str]:
    """The static system blocks: rules/output format, primitive docs, examples, tricks."""
    # a fresh marker per rendering: one that a tricks entry or a doc contains is never it
    # (a fixed marker inside a tricks entry would split the system prompt); the marker
    # never reaches the output, so the blocks stay byte-identical for the prompt cache
    brk = f"{BLOCK_BREAK[:-3]}-{secrets.token_hex(8)}>>>"
    text = _render("system.md.j2", ctx=ctx, BREAK=brk)
    blocks = [b.strip() + "\n" for b in text.split(brk)]
    return [b for b in blocks if b.strip()]


def render_task(loaded: Any) -> str:
    """The task message: the spec rendered for the model."""
    return _render("task.md.j2", s=spec_view(loaded))


def build_task_prompt(loaded: Any, ctx: PromptContext) -> Prompt:
    """The first prompt of a run: static system blocks + the task."""
    blocks = render_system(ctx)
    return Prompt(
        kind="task",
        spec=getattr(loaded, "name", None) or getattr(getattr(loaded, "spec", None), "name", None),
        system_blocks=blocks,
        static_blocks=len(blocks),
        messages=[{"role": "user", "content": render_task(loaded)}],
        cache_messages=[0],
    )


def render_prompt(loaded: Any, root: str | Path, *, max_examples: int = 3) -> Prompt:
    """The task prompt for ``loaded`` from the workspace at ``root`` (``coda-agent prompt``)."""
    return build_task_prompt(loaded, gather_context(root, loaded, max_examples=max_examples))


REPAIR_ECHO_CHARS = 100_000
"""Most characters of the previous answer, and of its module, a repair prompt repeats (an
answer within the default 16000 output tokens is ~64k characters; a 5.7 MB answer from a
command backend would make a 1.4M-token repair prompt). Longer ones keep their
head and tail around a marked cut."""


def _clip(text: str, limit: int = REPAIR_ECHO_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n[... {len(text) - 2 * half} characters cut by coda-agent ...]\n" + text[-half:]


def build_repair_prompt(
    base: Prompt,
    *,
    previous_response: str,
    previous_candidate: str | None,
    feedback: str,
    attempt: int,
    max_attempts: int,
) -> Prompt:
    """The prompt for attempt ``attempt`` (>= 2) after the previous one failed.

    ``base`` is the run's task prompt (its system blocks and task message are reused
    verbatim, so the cache prefix is unchanged). ``previous_candidate`` is ``None`` when
    the previous response had no usable code block (``feedback`` then holds the
    extraction error).
    """
    text = _render(
        "repair.md.j2",
        feedback=feedback.strip(),
        candidate=_clip(number_lines(previous_candidate)) if previous_candidate is not None else None,
        attempt=attempt,
        max_attempts=max_attempts,
    )
    prev = _clip(previous_response.strip()) or "(empty response)"
    return Prompt(
        kind="repair",
        spec=base.spec,
        system_blocks=list(base.system_blocks),
        static_blocks=base.static_blocks,
        messages=[
            base.messages[0],
            {"role": "assistant", "content": prev},
            {"role": "user", "content": text},
        ],
        cache_messages=[0],
    )


def build_lesson_prompt(base: Prompt, *, kernel: str, failed_attempt: int, feedback: str, diff: str) -> Prompt:
    """Ask for ONE sentence for ``tricks_log.md`` from a fail -> pass transition."""
    text = _render(
        "lesson.md.j2",
        kernel=kernel,
        failed_attempt=failed_attempt,
        passed_attempt=failed_attempt + 1,
        feedback=feedback.strip(),
        diff=diff.strip() or "(no textual difference)",
    )
    return Prompt(
        kind="lesson",
        spec=base.spec,
        system_blocks=list(base.system_blocks),
        static_blocks=base.static_blocks,
        messages=[{"role": "user", "content": text}],
    )

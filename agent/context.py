"""The prompt pack: everything the model sees besides the spec itself.

Design
------
The system prompt has a large *static* part that is identical for every attempt of a
run (and, apart from the examples, for every spec): the primitive docs, accepted
kernels shown as examples, and the tricks log. :func:`gather_context` collects it from
the workspace into a :class:`PromptContext`; :mod:`coda_agent.agent.render` turns it
into text. Keeping collection separate from rendering lets ``coda-agent prompt SPEC``
and the tests inspect exactly which files went in.

Examples are accepted kernels (``generated_kernels/<name>/kernel.py``). They are ranked
most-similar first so the best few fit in the budget:

1. same ``pattern`` (forward/backward) as the target,
2. same quack epilogue mode (``mode="acc_pair"`` ...) as the target mentions,
3. more words shared between the two descriptions (+ math + hints),

and ties are broken by name so the prompt -- and therefore the prompt cache -- is
deterministic. The target spec's *own* accepted kernel is never included: regenerating
a kernel while showing the model the answer would make the verifier's acceptance
meaningless (a leak). When nothing is accepted yet, the examples inside the primitive
docs serve, and the prompt says so.

Manifests are written by ``verifier/library/accept.py``; this module reads them leniently
(missing keys fall back to the example's own ``kernel_specs/<name>/spec.toml``), so a
manifest schema change never breaks prompt rendering.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

DOCS_DIR = "primitives_docs"
KERNELS_DIR = "generated_kernels"
TRICKS_FILE = "tricks_log.md"
KERNEL_FILE = "kernel.py"
MANIFEST_FILE = "manifest.json"

_MODE_RE = re.compile(r"""\bmode\s*=\s*["']([A-Za-z0-9_]+)["']""")
_KNOWN_MODES = ("acc_pair", "packed_cd_b16x2")
_WORD_RE = re.compile(r"[a-z][a-z0-9_]{2,}")
_STOP = frozenset(
    """the and for with from into that this are its has have was were which while when
    than then also not but all any each one two per via out over under same their there
    these those what where who will would can could may might must should only still
    too very just more most such own off""".split()
)


class DocFile(BaseModel):
    """One primitive doc: its file name (shown to the model) and its text."""

    name: str
    text: str


class Example(BaseModel):
    """An accepted kernel shown to the model as an example."""

    spec_name: str
    pattern: str | None = None
    catalogue_item: int | None = None
    mode: str | None = None
    description: str = ""
    source: str
    path: str = Field(description="workspace-relative path of kernel.py")
    score: tuple[int, int, int] = Field(
        default=(0, 0, 0), description="(same pattern, same mode, shared words): the sort key"
    )

    @property
    def header(self) -> str:
        """A short header for the prompt: spec name, pattern, catalogue item, mode."""
        bits = [f"spec `{self.spec_name}`"]
        if self.pattern:
            bits.append(f"pattern {self.pattern}")
        if self.catalogue_item is not None:
            bits.append(f"CODA catalogue item {self.catalogue_item}")
        if self.mode:
            bits.append(f"quack mode '{self.mode}'")
        return ", ".join(bits)


class PromptContext(BaseModel):
    """The static prompt pack gathered from a workspace for one target spec."""

    root: str
    target: str = Field(description="the target spec's name (its own kernel is excluded)")
    docs: list[DocFile] = Field(default_factory=list)
    examples: list[Example] = Field(default_factory=list)
    examples_available: int = Field(default=0, description="accepted kernels eligible before the cap")
    excluded_own_kernel: bool = Field(
        default=False, description="the target's own accepted kernel existed and was left out"
    )
    tricks: str = ""

    @property
    def examples_from_docs(self) -> bool:
        """True when no accepted kernel is shown and the docs' own examples serve."""
        return not self.examples


def _words(text: str) -> set[str]:
    return {w for w in _WORD_RE.findall(text.lower()) if w not in _STOP}


def spec_mode(spec: Any) -> str | None:
    """The quack epilogue mode a spec mentions (hints, description, math), if any."""
    text = " ".join([spec.description, spec.math, *spec.hints])
    for mode in _KNOWN_MODES:
        if mode in text:
            return mode
    m = re.search(r"mode\s*'([A-Za-z0-9_]+)'", text)
    return m.group(1) if m else None


def _read_manifest(d: Path) -> dict[str, Any]:
    p = d / MANIFEST_FILE
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_spec_toml(root: Path, name: str) -> dict[str, Any]:
    p = root / "kernel_specs" / name / "spec.toml"
    try:
        return tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _first(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        v = d.get(k)
        if v is not None:
            return v
    spec = d.get("spec")
    if isinstance(spec, dict):
        for k in keys:
            if spec.get(k) is not None:
                return spec[k]
    return None


def gather_docs(root: Path) -> list[DocFile]:
    """``primitives_docs/*.md`` sorted by file name."""
    d = Path(root) / DOCS_DIR
    if not d.is_dir():
        return []
    return [DocFile(name=p.name, text=p.read_text()) for p in sorted(d.glob("*.md")) if p.is_file()]


def gather_examples(root: Path, target: Any, *, max_examples: int = 3) -> tuple[list[Example], int, bool]:
    """Accepted kernels ranked most-similar to ``target`` (a KernelSpec) first.

    Returns ``(examples[:max_examples], number eligible, own kernel excluded)``.
    The target's own kernel (folder name or manifest spec name equal to the target's
    name) is never returned. Eligible: a folder whose manifest names it (``spec``), records
    a GPU verification and the sha256 of the ``kernel.py`` beside it -- what ``accept``
    writes; the prompt calls examples kernels that passed the verifier, so a draft or a
    kernel edited after acceptance is not one.
    """
    root = Path(root)
    base = root / KERNELS_DIR
    if not base.is_dir():
        return [], 0, False
    t_words = _words(" ".join([target.description, target.math, *target.hints]))
    t_mode = spec_mode(target)
    out: list[Example] = []
    excluded = False
    for d in sorted(base.iterdir()):
        kfile = d / KERNEL_FILE
        if not d.is_dir() or d.name.startswith((".", "_")) or not kfile.is_file():
            continue
        man = _read_manifest(d)
        spec_field = man.get("spec")
        name = spec_field if isinstance(spec_field, str) else _first(man, "spec_name", "name") or d.name
        if d.name == target.name or name == target.name:
            excluded = True
            continue
        data = kfile.read_bytes()
        if (
            spec_field != d.name
            or man.get("gpu_verified") is not True
            or man.get("kernel_sha256") != hashlib.sha256(data).hexdigest()
        ):
            continue
        toml = _read_spec_toml(root, name)
        pattern = _first(man, "pattern") or toml.get("pattern")
        cat = _first(man, "catalogue_item")
        if cat is None:
            cat = toml.get("catalogue_item")
        desc = _first(man, "description") or toml.get("description") or ""
        source = data.decode("utf-8", errors="replace")
        m = _MODE_RE.search(source)
        mode = m.group(1) if m else None
        words = _words(" ".join([desc, toml.get("math", ""), *toml.get("hints", [])]))
        score = (
            int(pattern == target.pattern),
            int(mode is not None and mode == t_mode),
            len(words & t_words),
        )
        out.append(
            Example(
                spec_name=str(name),
                pattern=pattern,
                catalogue_item=cat if isinstance(cat, int) else None,
                mode=mode,
                description=" ".join(str(desc).split()),
                source=source,
                path=str(kfile.relative_to(root)),
                score=score,
            )
        )
    out.sort(key=lambda e: (-e.score[0], -e.score[1], -e.score[2], e.spec_name))
    return out[: max(0, max_examples)], len(out), excluded


def gather_context(root: str | Path, target: Any, *, max_examples: int = 3) -> PromptContext:
    """Collect docs, examples and the tricks log for ``target``.

    ``target`` is a ``KernelSpec`` or a ``LoadedSpec`` (its ``.spec`` is used).
    """
    root = Path(root)
    spec = getattr(target, "spec", target)
    examples, available, excluded = gather_examples(root, spec, max_examples=max_examples)
    tricks_path = root / TRICKS_FILE
    tricks = tricks_path.read_text() if tricks_path.is_file() else ""
    return PromptContext(
        root=str(root),
        target=spec.name,
        docs=gather_docs(root),
        examples=examples,
        examples_available=available,
        excluded_own_kernel=excluded,
        tricks=tricks,
    )

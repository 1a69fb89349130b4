"""Loading a spec folder: ``spec.toml`` validated into a :class:`LoadedSpec`, the
reference module checked (function names and keyword signatures, statically), the spec's
hash (what re-verification keys on) and field-level diffs between two versions.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .models import KernelSpec, _Strict

SPEC_FILE = "spec.toml"
REFERENCE_FILE = "reference.py"
LIGER_FILE = "liger.py"
"""Optional Liger Kernel adapter beside reference.py (not hashed: a comparison, not the contract)."""
NO_LIGER = "no Liger equivalent for this spec"
"""The ``liger`` baseline's error when neither reference.py nor liger.py defines ``liger``."""
LIGER_MISSING = "liger-kernel is not installed (pip install coda-agent[bench])"
"""The ``liger`` baseline's error when ``import liger_kernel`` fails (optional dependency)."""


class SpecError(ValueError):
    """A spec that cannot be loaded; the message names the file, field and expectation."""


class LoadedSpec(BaseModel):
    """A validated spec plus where it came from and its content hash."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: KernelSpec
    directory: Path
    spec_hash: str = Field(description="sha256 over spec.toml and reference.py bytes")
    raw: dict[str, Any] = Field(description="the parsed TOML, for field-level diffs")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def reference_path(self) -> Path:
        return self.directory / REFERENCE_FILE

    def load_reference(self) -> ModuleType:
        """Import ``reference.py`` (trusted code) as a fresh module."""
        return _import_file(self.reference_path, f"coda_reference_{self.spec.name}")

    @property
    def liger_path(self) -> Path:
        return self.directory / LIGER_FILE

    @property
    def has_liger(self) -> bool:
        """True when the spec has a Liger adapter file (``liger.py``) beside its reference."""
        return self.liger_path.is_file()

    def load_liger(self) -> ModuleType | None:
        """Import ``liger.py`` (trusted code, the Liger baseline's adapter) as a fresh module;
        None when the spec has none. Importing it must not need liger-kernel itself (the
        adapter imports liger_kernel inside ``liger``)."""
        if not self.liger_path.is_file():
            return None
        return _import_file(self.liger_path, f"coda_liger_{self.spec.name}")


def _import_file(path: Path, modname: str) -> ModuleType:
    """Execute a spec-folder Python file (trusted code) as a fresh module named ``modname``,
    from its source bytes: never through ``__pycache__`` (an unchecked-hash pyc planted there
    would run instead of the reference that ``spec_hash`` covers)."""
    from ..confine.snapshot import load_module

    return load_module(path, modname, None, follow_symlinks=True)


def _field_names() -> set[str]:
    """Every field name of every spec model (for "did you mean" on a misspelt key)."""
    names, todo = set(), [_Strict]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        names |= set(getattr(cls, "model_fields", {}))
    return names


def _format_validation_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid kernel spec ({err.error_count()} problem(s))"]
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:  # a whole-spec check: its message names the fields itself
            lines.append(f"  {msg}")
            continue
        loc = ".".join(str(x) for x in e["loc"])
        got = e.get("input")
        got_s = "" if isinstance(got, dict) else f" (got {got!r})"
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), sorted(_field_names()), n=1)
            msg = "not a spec field" + (f" (did you mean {close[0]!r}?)" if close else "")
        lines.append(f"  field '{loc}': {msg}{got_s}")
    return "\n".join(lines)


def spec_hash(directory: Path) -> str:
    """sha256 over the spec's two files (name-prefixed, so moving bytes between them counts).

    An optional ``liger.py`` beside them is not hashed (a benchmark comparison, not the contract)."""
    h = hashlib.sha256()
    for fname in (SPEC_FILE, REFERENCE_FILE):
        p = directory / fname
        h.update(fname.encode() + b"\0")
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()


REQUIRED_REFERENCE_FUNCS = ("reference", "baseline", "bare_gemm")


def load_spec(path: str | Path) -> LoadedSpec:
    """Load and validate ``kernel_specs/<name>/`` (or a path to its ``spec.toml``).

    Raises :class:`SpecError` naming the file, field and what was expected when the
    directory, TOML syntax, any field, or the reference module's functions are wrong.
    The reference module is checked statically (function names), not imported.
    """
    p = Path(path)
    directory = p.parent if p.name == SPEC_FILE else p
    toml_path = directory / SPEC_FILE
    if not toml_path.is_file():
        raise SpecError(f"{toml_path}: no spec file (expected kernel_specs/<name>/{SPEC_FILE})")
    try:
        raw = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{toml_path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{toml_path}: not UTF-8 text (byte {e.start}: {e.reason}); TOML files are UTF-8") from None
    try:
        spec = KernelSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(_format_validation_error(toml_path, e)) from None
    if spec.name != directory.name:
        raise SpecError(f"{toml_path}: field 'name': expected the folder name {directory.name!r}, got {spec.name!r}")
    ref = directory / REFERENCE_FILE
    if not ref.is_file():
        raise SpecError(f"{ref}: missing (every spec needs a PyTorch reference module)")
    try:
        tree = ast.parse(ref.read_text(encoding="utf-8"), filename=str(ref))
    except SyntaxError as e:
        raise SpecError(f"{ref}:{e.lineno}: syntax error: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{ref}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    needed = set(REQUIRED_REFERENCE_FUNCS) | {o.gradient.of for o in spec.gradient_outputs if o.gradient is not None}
    needed |= {t.init.fn for t in spec.all_inputs if t.init.fn}
    if "quack_library" in spec.bench.baselines:
        needed.add("quack_library")
    missing = sorted(needed - defined)
    if missing:
        raise SpecError(f"{ref}: missing function(s) {missing} (the spec's fields refer to them)")
    call_names = [t.name for t in spec.all_inputs] + spec.entry.keyword_names
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in (*REQUIRED_REFERENCE_FUNCS, "quack_library"):
            problem = _keyword_call_problem(fn, call_names)
            if problem:
                raise SpecError(
                    f"{ref}:{fn.lineno}: {fn.name}() is called with the spec's inputs and constants "
                    f"as keywords ({', '.join(call_names)}): {problem}"
                )
    return LoadedSpec(spec=spec, directory=directory, spec_hash=spec_hash(directory), raw=raw)


def _keyword_call_problem(fn: ast.FunctionDef, names: list[str]) -> str | None:
    """Why ``fn(**{n: ... for n in names})`` would raise a TypeError, or None (read from
    the def, without importing the module)."""
    a = fn.args
    if a.posonlyargs:
        return "it has positional-only parameters"
    params = [x.arg for x in (*a.args, *a.kwonlyargs)]
    unknown = [n for n in names if n not in params] if a.kwarg is None else []
    n_defaults = len(a.defaults)
    required = [x.arg for x in a.args[: len(a.args) - n_defaults]] + [
        x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=False) if d is None
    ]
    unbound = [n for n in required if n not in names]
    if unknown:
        return f"it has no parameter {unknown[0]!r} (parameters: {', '.join(params) or 'none'})"
    if unbound:
        return f"its parameter {unbound[0]!r} is not one of them and has no default"
    return None


def resolve_spec(root: str | Path, name_or_path: str) -> LoadedSpec:
    """SPEC as a user gives it: a name under ``<root>/kernel_specs/`` or a path to a spec
    folder (or its ``spec.toml``). A bare name is a spec under kernel_specs/, also when the
    current folder holds a folder of that name (generated_kernels/<name>/, runs/...).
    Raises :class:`SpecError` naming the known specs (and the closest one) for an unknown
    name, or :func:`load_spec`'s error."""
    root = Path(root)
    p = Path(name_or_path)
    by_name = root / "kernel_specs" / name_or_path
    if not p.exists() or (p.is_dir() and not (p / "spec.toml").is_file() and by_name.is_dir()):
        p = by_name
    if not p.exists():
        known = sorted(d.name for d in (root / "kernel_specs").iterdir() if d.is_dir())
        close = difflib.get_close_matches(name_or_path, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SpecError(f"unknown spec {name_or_path!r}{hint}; known specs: {', '.join(known)}")
    return load_spec(p)


def find_specs(root: str | Path) -> list[LoadedSpec]:
    """Load every ``kernel_specs/*/spec.toml`` under the workspace ``root``, sorted by name."""
    base = Path(root) / "kernel_specs"
    return [load_spec(d) for d in sorted(base.iterdir()) if (d / SPEC_FILE).is_file()]


def diff_fields(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted field paths whose values differ between two parsed spec TOMLs."""
    out: list[str] = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        path = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_fields(a, b, path + ".")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(path)
    return out

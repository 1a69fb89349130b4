"""What ``coda-agent list`` shows: every spec of a workspace and the state of its kernel.

One :class:`CatalogueRow` per folder under ``kernel_specs/`` (a folder without
``spec.toml`` is shown, not hidden: a new spec whose file is misnamed or not written
yet) and per accepted kernel whose spec is gone. A row that needs a human
(:attr:`CatalogueRow.problem`: an invalid spec, an unreadable manifest, a kernel without
its spec) makes the command fail. Nothing here prints; the CLI renders the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..spec import SpecError, load_spec
from ..workspace import sha256_file
from .accept import ManifestError, read_manifest

PROBLEMS = ("invalid", "unreadable-manifest", "spec-missing")
"""Row states that make ``list`` fail."""


@dataclass
class CatalogueRow:
    """One spec (or orphaned kernel) and its state.

    ``status``: ``no-spec-file``, ``invalid``, ``unreadable-manifest``, ``accepted``,
    ``not-accepted`` or ``spec-missing``. ``detail``: what a folder without spec.toml
    holds, or the error of an invalid spec or unreadable manifest. For ``accepted``:
    ``accepted_at`` (the date), ``gpu`` (where it was verified, ``"no"`` without one) and
    ``changed`` (``"spec"``, ``"kernel.py"``: edited since acceptance, so re-verify)."""

    name: str
    status: str
    pattern: str = "-"
    entry: str = "-"
    detail: str = ""
    accepted_at: str = ""
    gpu: str = ""
    changed: list[str] = field(default_factory=list)

    @property
    def problem(self) -> bool:
        return self.status in PROBLEMS


def catalogue(root: Path) -> list[CatalogueRow]:
    """The rows of the workspace ``root``: its specs in name order, then accepted kernels
    whose spec is missing."""
    rows: list[CatalogueRow] = []
    specs = set()
    for d in sorted((root / "kernel_specs").iterdir()):
        if not (d / "spec.toml").exists():
            if d.is_dir() and not d.name.startswith((".", "_")):
                others = sorted(p.name for p in d.iterdir())[:4]
                rows.append(
                    CatalogueRow(
                        d.name, "no-spec-file", detail=f"holds {', '.join(others)}" if others else "empty folder"
                    )
                )
            continue
        specs.add(d.name)
        try:
            ls = load_spec(d)
        except SpecError as e:
            rows.append(CatalogueRow(d.name, "invalid", detail=str(e)))
            continue
        kdir = root / "generated_kernels" / ls.name
        man_path = kdir / "manifest.json"
        if not man_path.exists():
            rows.append(CatalogueRow(ls.name, "not-accepted", ls.spec.pattern, ls.spec.entry.function))
            continue
        try:
            man = read_manifest(man_path)
        except ManifestError as e:
            rows.append(
                CatalogueRow(ls.name, "unreadable-manifest", ls.spec.pattern, ls.spec.entry.function, detail=str(e))
            )
            continue
        env = man.get("environment", {})
        edits = []
        if man.get("spec_hash") != ls.spec_hash:
            edits.append("spec")
        if not (kdir / "kernel.py").is_file() or sha256_file(kdir / "kernel.py") != man.get("kernel_sha256"):
            edits.append("kernel.py")
        rows.append(
            CatalogueRow(
                ls.name,
                "accepted",
                ls.spec.pattern,
                ls.spec.entry.function,
                accepted_at=str(man.get("accepted_at", "?"))[:10],
                gpu=env.get("gpu") or "no",
                changed=edits,
            )
        )
    for kdir in sorted((root / "generated_kernels").glob("*/manifest.json")):
        if kdir.parent.name not in specs:  # accepted, but its spec is gone: never hidden
            rows.append(CatalogueRow(kdir.parent.name, "spec-missing"))
    return rows

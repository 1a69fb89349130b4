"""What a human reviewer needs before an accepted kernel is committed.

``coda-agent review SPEC`` renders, as plain text (markdown-ish, pasteable into a PR):

1. status: is kernel.py still what was verified (hash vs manifest)? was the spec changed
   since (hash vs manifest, with the changed fields)?
2. provenance: backend/model, prompt hash, attempts, run folder, when, on which GPU with
   which driver and versions;
3. the diff against the previous accepted version: ``history/<latest>/kernel.py`` when a
   forced re-acceptance archived one, else the version committed in git (``HEAD``) when
   it differs, else the full source of a first acceptance;
4. the numbers: REPORT.md (correctness errors vs allowed, benchmark vs baselines).

Read-only: nothing here writes.
"""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

from ..spec import LoadedSpec, diff_fields
from ..workspace import sha256_file
from .accept import read_manifest


def _git_head_version(root: Path, rel: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "show", f"HEAD:{rel}"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def previous_version(root: Path, name: str) -> tuple[str, str] | None:
    """(label, source) of the previous accepted kernel, or None for a first acceptance."""
    kdir = root / "generated_kernels" / name
    hist = sorted((kdir / "history").glob("*/kernel.py")) if (kdir / "history").is_dir() else []
    if hist:
        return f"history/{hist[-1].parent.name}", hist[-1].read_text()
    head = _git_head_version(root, f"generated_kernels/{name}/kernel.py")
    current = (kdir / "kernel.py").read_text()
    if head is not None and head != current:
        return "git HEAD", head
    return None


def review_text(root: Path, loaded: LoadedSpec) -> str:
    """The review page for the accepted kernel of ``loaded``.

    Raises FileNotFoundError naming the folder when nothing is accepted for the spec.
    """
    name = loaded.name
    kdir = root / "generated_kernels" / name
    man_path = kdir / "manifest.json"
    if not man_path.is_file():
        raise FileNotFoundError(f"{kdir}: no accepted kernel for {name!r} (run `coda-agent generate {name}`)")
    man = read_manifest(man_path)
    lines = [f"# Review: {name}", ""]

    # 1. status
    k_ok = sha256_file(kdir / "kernel.py") == man.get("kernel_sha256")
    lines.append("## Status")
    lines.append(f"- kernel.py matches the verified hash: {'yes' if k_ok else 'NO -- edited after verification'}")
    if man.get("spec_hash") == loaded.spec_hash:
        lines.append("- spec unchanged since acceptance")
    else:
        changed = diff_fields(man.get("spec_raw") or {}, loaded.raw)
        what = ", ".join(changed) if changed else "reference.py"
        lines.append(f"- SPEC CHANGED since acceptance ({what}): needs re-verification")
    env = man.get("environment", {})
    lines.append(
        f"- verified on: {env.get('gpu') or 'NO GPU'} (sm {env.get('compute_capability')}), driver "
        f"{env.get('driver')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, cutlass-dsl "
        f"{env.get('cutlass_dsl')}, quack {env.get('quack')}; accepted {man.get('accepted_at')}"
    )
    lines.append(
        f"- candidate confinement during verification: {env.get('worker_sandbox') or 'not recorded'}"
        + (" (ACCEPTED UNCONFINED, --allow-unconfined)" if man.get("accepted_unconfined") else "")
    )
    lines.append("")

    # 2. provenance
    prov = man.get("provenance", {})
    lines.append("## Provenance")
    for k in sorted(prov):
        lines.append(f"- {k}: {prov[k]}")
    run_dir = prov.get("run_dir")
    if run_dir and not (root / run_dir).is_dir() and not Path(run_dir).is_dir():
        kept = root / "benchmarks" / "results" / "runs" / Path(run_dir).name
        where = f"; a committed copy is in {kept.relative_to(root)}" if kept.is_dir() else ""
        lines.append(f"- (run folder not in this checkout: runs/ is git-ignored{where})")
    lines.append("")

    # 3. diff
    lines.append("## Diff against the previous accepted version")
    current = (kdir / "kernel.py").read_text()
    prev = previous_version(root, name)
    if prev is None:
        lines.append("First accepted version; full source:")
        lines.append("```python")
        lines.append(current.rstrip())
        lines.append("```")
    else:
        label, old = prev
        diff = difflib.unified_diff(
            old.splitlines(), current.splitlines(), f"{label}/kernel.py", "kernel.py", lineterm=""
        )
        lines.append("```diff")
        lines.extend(diff)
        lines.append("```")
    lines.append("")

    # 4. numbers
    report = kdir / "REPORT.md"
    lines.append("## Numbers (REPORT.md)")
    lines.append(report.read_text().rstrip() if report.is_file() else "REPORT.md missing")
    return "\n".join(lines) + "\n"

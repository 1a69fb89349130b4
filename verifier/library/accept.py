"""Accept a GPU-verified candidate into ``generated_kernels/<spec>/``.

Why so strict: ``generated_kernels/`` is what training code imports
(``coda_agent.kernels``), so a kernel lands there only with a verdict that passed every
stage *on a GPU* (``Verdict.gpu_verified``), for exactly this spec (name and spec hash)
and exactly these bytes (the candidate's sha256 must equal the verdict's).

What is written (JSON with sorted keys):

* ``kernel.py`` -- the candidate, byte for byte;
* ``manifest.json`` -- spec name/hash/pattern, kernel sha256, provenance (model,
  backend, prompt hash, attempts, run dir: whatever the caller passes), environment,
  every stage's status/summary/metrics (all bench numbers included), ``accepted_at``;
* ``REPORT.md`` -- the same for humans: correctness errors vs allowed per output, the
  benchmark table fused vs baselines with ratios and TFLOP/s.

Atomicity: the three files are written into a temporary sibling folder, fsynced, and
the folder is moved into place with ``os.replace``; an interrupted accept leaves either
the old kernel or the new one, never a mix. An existing accepted kernel is never
replaced without ``force=True``; with it, the old version (and its own history) is
carried into ``<spec>/history/<its accepted_at>/`` of the new folder first. Re-accepting
the same bytes keeps the author's provenance (:func:`reverified_provenance`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..spec import LoadedSpec
from ..verdict import STAGES, Verdict
from ..workspace import sha256_bytes

KERNELS_DIR = "generated_kernels"
HISTORY_DIR = "history"


class AcceptError(RuntimeError):
    """The candidate cannot be accepted; the message says why and what to do."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _why_not_verified(verdict: Verdict) -> str:
    if verdict.cpu_only:
        return "it comes from a CPU-only run (static + compile only)"
    failed = verdict.failed_stage
    if failed is not None:
        return f"stage {failed.stage!r} did not pass ({failed.status}: {failed.summary})"
    done = {s.stage: s.status for s in verdict.stages}
    missing = [s for s in ("correctness", "bench") if done.get(s) != "pass"]
    states = ", ".join(f"{s}={done.get(s, 'absent')}" for s in missing)
    return f"stage(s) {missing} did not pass on a GPU ({states})"


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _stamp(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "-", text) or "unknown"


CONFINED = "landlock"
"""How ``environment.worker_sandbox`` starts when the candidate's processes ran confined
(:func:`~coda_agent.verifier.confine.landlock.confine_worker`); "off (...)" / "unavailable: ..." otherwise."""


def unconfined_workers(verdict: Verdict) -> list[str]:
    """The processes that ran candidate code without the Landlock confinement, by the
    verdict's own record: the GPU candidate worker (``environment.worker_sandbox``) and
    the compile worker (the compile stage's ``metrics.sandbox``, when that stage ran here)."""
    out = []
    if not (verdict.environment.worker_sandbox or "").startswith(CONFINED):
        out.append(f"GPU candidate worker: {verdict.environment.worker_sandbox or 'not recorded'}")
    comp = verdict.stage("compile")
    sb = (comp.metrics or {}).get("sandbox") if comp is not None else None
    if sb is not None and not str(sb).startswith(CONFINED):
        out.append(f"compile worker: {sb}")
    return out


def build_manifest(
    loaded: LoadedSpec, kernel_bytes: bytes, verdict: Verdict, provenance: dict[str, Any], accepted_at: str
) -> dict[str, Any]:
    """The manifest.json content (a JSON-safe dict)."""
    vd = verdict.model_dump(mode="json")
    spec = loaded.spec
    return {
        "spec": spec.name,
        "spec_hash": loaded.spec_hash,
        # the accepted spec's parsed TOML: lets `regress` name the fields that changed since
        "spec_raw": loaded.raw,
        "pattern": spec.pattern,
        "catalogue_item": spec.catalogue_item,
        "description": " ".join(spec.description.split()),
        "entry": spec.entry.function,
        "kernel_file": "kernel.py",
        "kernel_sha256": sha256_bytes(kernel_bytes),
        "provenance": provenance,
        "environment": vd["environment"],
        "stages": {
            s["stage"]: {k: s[k] for k in ("status", "summary", "metrics", "duration_s", "findings")}
            for s in vd["stages"]
        },
        "verdict": {k: vd[k] for k in ("started_at", "wall_s", "cpu_only", "candidate_hash")},
        "gpu_verified": verdict.gpu_verified,
        "accepted_at": accepted_at,
    }


def _f(x: Any, fmt: str = ".3g") -> str:
    if isinstance(x, (int, float)):
        return format(x, fmt)
    return "-" if x is None else str(x)


def _one_line(v: Any, limit: int = 200) -> str:
    s = " ".join(str(v).split())
    return s if len(s) <= limit else s[:limit] + "..."


def render_report(manifest: dict[str, Any]) -> str:
    """REPORT.md: stages, correctness/gradient errors vs allowed, and the benchmark table."""
    env, prov = manifest["environment"], manifest["provenance"]
    lines = [
        f"# {manifest['spec']}: accepted kernel",
        "",
        f"- accepted at: {manifest['accepted_at']}",
        f"- kernel sha256: `{manifest['kernel_sha256']}`",
        f"- spec hash: `{manifest['spec_hash']}`",
        f"- GPU: {env.get('gpu')} (sm {env.get('compute_capability')}), driver {env.get('driver')}, CUDA {env.get('cuda')}",
        f"- versions: torch {env.get('torch')}, nvidia-cutlass-dsl {env.get('cutlass_dsl')}, quack-kernels {env.get('quack')}, python {env.get('python')}",
        # one line whatever the values hold: the model name comes from a run folder the
        # answerer writes, and a newline in it would forge lines of this report
        "- provenance: " + (", ".join(f"{k}={_one_line(v)}" for k, v in sorted(prov.items())) or "-"),
        "",
        "## Stages",
        "",
        "| stage | status | summary | s |",
        "|---|---|---|---|",
    ]
    stages = manifest["stages"]
    for name, s in stages.items():
        lines.append(f"| {name} | {s['status']} | {str(s['summary']).replace('|', '/')} | {s['duration_s']:.1f} |")
    for stage, title in (("correctness", "Correctness"), ("gradients", "Gradients (vs torch.autograd)")):
        worst = (stages.get(stage, {}).get("metrics") or {}).get("worst") or {}
        if not worst:
            continue
        lines += [
            "",
            f"## {title}: max |out - ref32| vs allowed (worst trial per output)",
            "",
            "| output | max error | allowed | ratio | trial |",
            "|---|---|---|---|---|",
        ]
        for out, m in sorted(worst.items()):
            lines.append(
                f"| {out} | {_f(m.get('max_err'))} | {_f(m.get('allowed'))} | {_f(m.get('ratio'), '.2f')} | {m.get('trial')} |"
            )
    c = stages.get("correctness", {}).get("metrics") or {}
    if c.get("launches") is not None:
        gemms = (
            f"; GEMMs {c['gemm_launches']} (max {c.get('max_gemm_launches')})"
            if c.get("gemm_launches") is not None
            else ""
        )
        lines += [
            "",
            f"Kernel launches per call: {c['launches']} (max {c.get('max_launches')}{gemms}): "
            f"{', '.join(c.get('kernels', []))}",
        ]
    b = stages.get("bench", {}).get("metrics") or {}
    shapes = b.get("shapes") or {}
    if shapes:
        names = sorted({n for m in shapes.values() for n in m.get("baselines", {})})
        head = (
            "| shape | fused ms | TFLOP/s | GB/s | speed of light ms | "
            + " | ".join(f"{n} ms | fused/{n}" for n in names)
            + " |"
        )
        lines += [
            "",
            f"## Benchmark on {b.get('gpu')} (median ms; ratio = fused / baseline, < 1 is faster)",
            "",
            head,
            "|" + "---|" * (5 + 2 * len(names)),
        ]
        # smallest problem first (JSON manifests keep keys sorted, not in spec order)
        shapes = dict(sorted(shapes.items(), key=lambda kv: (kv[1].get("flops") or 0, kv[0])))
        for shape, m in shapes.items():
            cells = [
                shape,
                _f(m.get("fused_ms"), ".4f"),
                _f(m.get("tflops"), ".0f"),
                _f(m.get("gbps"), ".0f"),
                _f(m.get("sol_ms"), ".4f"),
            ]
            for n in names:
                r = m.get("baselines", {}).get(n, {})
                cells += [
                    _f(r.get("ms"), ".4f") if "ms" in r else "error",
                    _f(r.get("ratio"), ".3f") if "ratio" in r else "-",
                ]
            lines.append("| " + " | ".join(cells) + " |")
        for n, v in sorted((b.get("bar") or {}).items()):
            missed = [sh for sh, m in shapes.items() if (m.get("bar", {}).get(n) or {}).get("met") is False]
            verdict = {True: "met", False: "MISSED"}.get(v.get("met"), "not measured")
            tail = f" (missed at {', '.join(missed)})" if missed else ""
            lines.append(
                f"\nBar fused/{n} <= {v.get('limit')}: {verdict}; met at {v.get('met_shapes')} of "
                f"{v.get('shapes')} shapes{tail}."
            )
    return "\n".join(lines) + "\n"


class ManifestError(ValueError):
    """An accepted kernel's ``manifest.json`` that cannot be read or is not a JSON object."""


def read_manifest(path: Path) -> dict[str, Any]:
    """The JSON object in an accepted kernel's ``manifest.json``.

    Raises :class:`ManifestError` naming the file when it cannot be read or parsed, or is
    not an object (a hand edit, a merge conflict): commands report it instead of a
    traceback."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(
            f"{path}: unreadable manifest ({type(e).__name__}: {e}); restore it "
            "(git checkout) or re-verify the kernel with --accept --force"
        ) from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: a manifest must be a JSON object, got {type(data).__name__}")
    return data


def verdict_from_manifest(manifest: dict[str, Any]) -> Verdict:
    """Rebuild the Verdict an accepted kernel was accepted with (from its manifest.json)."""
    # the manifest's keys are sorted (alphabetical); a Verdict's stages are in pipeline order
    order = {name: i for i, name in enumerate(STAGES)}
    stages = [
        {
            "stage": name,
            **{k: v for k, v in st.items() if k in ("status", "summary", "metrics", "duration_s", "findings")},
        }
        for name, st in sorted(manifest.get("stages", {}).items(), key=lambda kv: order.get(kv[0], len(order)))
    ]
    v = manifest.get("verdict", {})
    return Verdict.model_validate(
        {
            "spec": manifest["spec"],
            "spec_hash": manifest["spec_hash"],
            "candidate_hash": v.get("candidate_hash", manifest.get("kernel_sha256", "")),
            "stages": stages,
            "environment": manifest.get("environment", {}),
            "cpu_only": v.get("cpu_only", False),
            "started_at": v.get("started_at", ""),
            "wall_s": v.get("wall_s", 0.0),
        }
    )


def accepted_names(root: Path, names: list[str] | None = None) -> list[str]:
    """The accepted kernels of ``<root>/generated_kernels`` (folders with a manifest.json),
    sorted; or ``names``, in their order, after checking each is one. Raises ``ValueError``
    naming the unknown names and listing the accepted ones."""
    accepted = sorted(p.parent.name for p in (Path(root) / "generated_kernels").glob("*/manifest.json"))
    if not names:
        return accepted
    unknown = sorted(set(names) - set(accepted))
    if unknown:
        import difflib

        close = {n: c[0] for n in unknown if (c := difflib.get_close_matches(n, accepted, n=1))}
        hint = "".join(f" (did you mean {c!r} for {n!r}?)" for n, c in close.items())
        raise ValueError(f"not accepted kernels: {unknown}{hint} (accepted: {accepted})")
    return list(names)


def outside_library(root: Path, loaded: LoadedSpec) -> str | None:
    """Why ``loaded`` cannot accept a kernel into ``<root>/generated_kernels/``: it was not
    loaded from ``<root>/kernel_specs/<name>/`` (a spec folder elsewhere with the same name,
    e.g. a weakened copy, verifies only itself); None when it was. The CLI asks it before
    verifying, :func:`accept` again at the end."""
    home = Path(root) / "kernel_specs" / loaded.name
    if home.is_dir() and Path(loaded.directory).resolve() == home.resolve():
        return None
    return (
        f"{loaded.directory} is not this workspace's kernel_specs/{loaded.name}/ ({home}): only the library's "
        "own specs can accept a kernel into generated_kernels/"
    )


def accept(
    loaded: LoadedSpec,
    candidate: Path,
    verdict: Verdict,
    *,
    root: Path,
    provenance: dict[str, Any],
    force: bool = False,
    allow_unconfined: bool = False,
) -> Path:
    """Install ``candidate`` as ``<root>/generated_kernels/<spec>/`` and return that folder.

    Raises :class:`AcceptError` when the verdict is not GPU-verified, belongs to another
    spec / spec version / file, the spec was not loaded from ``<root>/kernel_specs/<name>/``,
    its candidate ran without the Landlock confinement
    (``environment.worker_sandbox``; ``allow_unconfined`` accepts it anyway and the
    manifest says so), or an accepted kernel exists and ``force`` is False.
    """
    candidate = Path(candidate)
    if not verdict.gpu_verified:
        raise AcceptError(
            f"refusing to accept {candidate}: the verdict is not GPU-verified: {_why_not_verified(verdict)}"
        )
    loose = unconfined_workers(verdict)
    if loose and not allow_unconfined:
        raise AcceptError(
            f"refusing to accept {candidate}: its code ran unconfined during verification "
            f"({'; '.join(loose)}), so nothing bounds what it wrote "
            "outside its scratch folder while it was judged. Verify again where Landlock works, or pass "
            "--allow-unconfined (recorded in the manifest as accepted_unconfined)"
        )
    if verdict.spec != loaded.name:
        raise AcceptError(f"the verdict is for spec {verdict.spec!r}, not {loaded.name!r}")
    if verdict.spec_hash != loaded.spec_hash:
        raise AcceptError(f"spec {loaded.name!r} changed since it was verified (spec hash differs): verify again")
    outside = outside_library(root, loaded)
    if outside:
        raise AcceptError(outside)
    data = candidate.read_bytes()
    if sha256_bytes(data) != verdict.candidate_hash:
        raise AcceptError(
            f"{candidate} changed since it was verified (sha256 differs from the verdict's): verify again"
        )
    base = Path(root) / KERNELS_DIR
    base.mkdir(parents=True, exist_ok=True)
    dest = base / loaded.name
    old_manifest: dict[str, Any] = {}
    if dest.exists():
        try:
            old_manifest = json.loads((dest / "manifest.json").read_text())
        except (OSError, ValueError):
            old_manifest = {}
        if not force:
            when = old_manifest.get("accepted_at", "unknown time")
            raise AcceptError(
                f"{dest} already holds an accepted kernel (accepted {when}); refusing to overwrite it. "
                f"Pass --force (force=True) to replace it; the old version is then kept in {dest / HISTORY_DIR}/<accepted_at>/"
            )
    accepted_at = _now()
    provenance = reverified_provenance(old_manifest, data, provenance, accepted_at)
    manifest = build_manifest(loaded, data, verdict, provenance, accepted_at)
    if loose:
        manifest["accepted_unconfined"] = True
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{loaded.name}.new-"))
    try:
        _write(tmp / "kernel.py", data)
        _write(tmp / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode())
        _write(tmp / "REPORT.md", render_report(manifest).encode())
        if dest.exists():
            _carry_history(dest, tmp, old_manifest)
        if dest.exists():
            trash = Path(tempfile.mkdtemp(dir=base, prefix=f".{loaded.name}.old-"))
            os.replace(dest, trash / loaded.name)
            os.replace(tmp, dest)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def reverified_provenance(
    old_manifest: dict[str, Any], data: bytes, provenance: dict[str, Any], accepted_at: str
) -> dict[str, Any]:
    """The provenance of a re-acceptance. Re-verifying the *same bytes* (a spec changed,
    the verifier learned a check: ``verify K generated_kernels/K/kernel.py --accept
    --force``) does not change who wrote the kernel, so the old provenance (the model, its
    run and attempts) is kept, with a ``reverified`` list recording each re-acceptance
    (when, by which backend/source, the spec hash it replaced). New bytes get
    ``provenance`` as given."""
    if not old_manifest or old_manifest.get("kernel_sha256") != sha256_bytes(data):
        return provenance
    kept = dict(old_manifest.get("provenance") or {})
    if not kept:
        return provenance
    entry = {
        "at": accepted_at,
        "previous_accepted_at": old_manifest.get("accepted_at"),
        "previous_spec_hash": old_manifest.get("spec_hash"),
        **provenance,
    }
    kept["reverified"] = [*kept.get("reverified", []), entry]
    return kept


def _carry_history(dest: Path, tmp: Path, old_manifest: dict[str, Any]) -> None:
    """Copy the old folder's history and the old version itself into ``tmp/history/``."""
    hist = tmp / HISTORY_DIR
    if (dest / HISTORY_DIR).is_dir():
        shutil.copytree(dest / HISTORY_DIR, hist)
    hist.mkdir(exist_ok=True)
    when = old_manifest.get("accepted_at")
    if not when:
        mt = max((p.stat().st_mtime for p in dest.iterdir()), default=0.0)
        when = (
            _dt.datetime.fromtimestamp(mt, _dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        )
    stamp = _stamp(str(when))
    target, i = hist / stamp, 1
    while target.exists():
        i += 1
        target = hist / f"{stamp}-{i}"
    target.mkdir()
    for p in dest.iterdir():
        if p.name == HISTORY_DIR:
            continue
        if p.is_dir():
            shutil.copytree(p, target / p.name)
        else:
            shutil.copy2(p, target / p.name)
    _keep_accepted_bytes(dest, target, old_manifest)


HISTORY_NOTE = "HISTORY_NOTE.md"


def _keep_accepted_bytes(dest: Path, target: Path, old_manifest: dict[str, Any]) -> None:
    """Make ``target`` (a history entry) hold the kernel its manifest names.

    A kernel.py edited in place (or removed) after acceptance (``regress`` then says "re-verify it ...
    --accept --force") is not the version the old manifest describes, so the history entry
    never pairs the old manifest with the edited bytes. The edited
    file is kept as ``kernel.edited.py``; ``kernel.py`` is the accepted version when git's
    HEAD still has it (sha256 checked), and :data:`HISTORY_NOTE` says which happened."""
    want = old_manifest.get("kernel_sha256")
    kernel = target / "kernel.py"
    if not isinstance(want, str) or (kernel.is_file() and sha256_bytes(kernel.read_bytes()) == want):
        return
    if kernel.is_file():
        found = f"held `{sha256_bytes(kernel.read_bytes())}` when it was replaced, kept as kernel.edited.py"
        os.replace(kernel, target / "kernel.edited.py")
    else:
        found = "held no kernel.py when it was replaced"
    recovered = _git_head_bytes(dest / "kernel.py")
    if recovered is not None and sha256_bytes(recovered) == want:
        _write(kernel, recovered)
        how = "kernel.py here is the accepted version, restored from git HEAD (sha256 checked)."
    else:
        how = (
            "The accepted version was not found (not in git HEAD either): recover it from version control "
            f"by its sha256, e.g. `git log -p -- generated_kernels/{dest.name}/kernel.py`."
        )
    _write(
        target / HISTORY_NOTE,
        (
            f"# {dest.name}: kernel.py was edited or removed after acceptance\n\n"
            f"The manifest here names kernel sha256 `{want}`; the folder {found}. {how}\n"
        ).encode(),
    )


def _git_head_bytes(path: Path) -> bytes | None:
    """``path``'s bytes at git HEAD, or None (no git, not tracked, any failure)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"], capture_output=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None

"""Measuring and re-checking accepted kernels: ``coda-agent bench`` and ``coda-agent regress``.

* ``bench SPEC...|--all`` measures on the GPU and writes ``benchmarks/results/<date>-<gpu>.md``
  (+ PNG) from the verdicts it keeps; ``--from-verdicts DIR`` (``--merge-from SRC``)
  re-renders a kept folder and ``--from-manifests`` the numbers recorded at acceptance,
  neither measuring anything.
* ``regress [KERNEL...]`` re-checks every accepted kernel: integrity, static and compile
  (``--cpu-only``, what CI runs), numerics and perf ratios on the GPU, or the verdicts a
  bench kept (``--verdicts DIR``).

Rules:

* A flag the chosen mode would ignore is refused, not dropped; a misspelt kernel name is
  named before the missing GPU is.
* Exit code 1 when a kernel failed or regressed, 2 for usage errors.
"""

from __future__ import annotations

from rich.markup import escape

from ..verifier import tables, workspace
from . import common
from .common import FAILED, OK, UsageError, console, output_flag, workspace_root


def _measuring_flags(args) -> tuple[tuple[str, object], ...]:
    """(flag, given) for the bench flags that only shape a measurement."""
    return ("--shape", args.shape), ("--repeat", args.repeat != 1), ("--jobs", args.jobs)


def _refuse_ignored(what: str, *flags: tuple[str, object]) -> None:
    """UsageError naming the ``(flag, given)`` pairs that were given although ``what`` (a
    sentence on the mode) would ignore them."""
    ignored = [f for f, given in flags if given]
    if ignored:
        raise UsageError(f"{what}, so {', '.join(ignored)} would be ignored")


def _wrote(report, *, note_stale_plot: bool) -> str:
    """The line naming the results page and its plot, or why there is no plot (with
    ``note_stale_plot``: that a .png beside the page is from an earlier rendering)."""
    if report.plot_path:
        return f"wrote {report.markdown_path} and {report.plot_path}"
    stale = report.markdown_path.with_suffix(".png")
    why = " (no plot: matplotlib is not installed; pip install -e '.[bench]'"
    if note_stale_plot and stale.exists():
        why += f"; {stale.name} beside the page is from an earlier rendering"
    return f"wrote {report.markdown_path}{why})"


def cmd_bench(args) -> int:
    """Benchmark accepted kernels (GPU) and write benchmarks/results/<date>-<gpu>.md (+ PNG)."""
    from ..verifier.library.bench import bench_kernels

    root = workspace_root(args)
    out_dir = output_flag(workspace.out_dir, root, args.out)
    if args.repeat < 1:
        raise UsageError(f"bench --repeat {args.repeat}: expected an integer >= 1")
    if args.merge_from is not None and args.from_verdicts is None:
        raise UsageError(
            "bench --merge-from SRC needs --from-verdicts DIR: the kept folder to merge SRC's verdicts into"
        )
    if args.force and args.from_verdicts is None and not args.from_manifests:
        raise UsageError(
            "bench --force only applies with --from-verdicts DIR or --from-manifests (it replaces a page "
            "bench did not write)"
        )
    if args.from_verdicts is not None:
        vdir = args.from_verdicts
        # a new user's `--from-verdicts DIR swiglu_bwd` rewrote the page of every kernel
        _refuse_ignored(
            f"bench --from-verdicts measures nothing and renders every kernel kept in {vdir}",
            ("SPEC names", args.spec),
            ("--all", args.all),
            ("--from-manifests", args.from_manifests),
            *_measuring_flags(args),
        )
        if args.merge_from is not None:  # SRC's verdicts are copied into DIR
            output_flag(workspace.check_out_target, root, vdir, "--from-verdicts", str(vdir))
        if out_dir is None:  # the page goes beside DIR
            output_flag(workspace.check_out_target, root, vdir.parent / f"{vdir.name}.md", "--from-verdicts", str(vdir))
        from ..verifier.library.bench import page_from_kept
        from ..verifier.library.kept import check_page, merge_kept

        try:
            if args.merge_from is not None:
                if vdir.is_dir():  # page_from_kept checks too, but only after the merge
                    check_page(vdir, out_dir, args.force)
                for line in merge_kept(root, args.merge_from, vdir):
                    console.print(escape(line))
            report = page_from_kept(root, vdir, out_dir=out_dir, force=args.force)
        except ValueError as e:
            raise UsageError(str(e)) from None
        for line in report.notes:
            console.print(escape(f"left off the page: {line}"), style="yellow")
        if report.markdown_path is None:
            raise UsageError(
                f"{args.from_verdicts}: no kept verdict of a current accepted kernel with a passing bench"
                + (
                    f" ({len(report.notes)} file(s) left off, listed above)"
                    if report.notes
                    else " (no *.json verdict files in it)"
                )
            )
        console.print(escape(_wrote(report, note_stale_plot=True)))
        return OK
    if not args.all and not args.spec:
        raise UsageError("bench needs SPEC ... or --all")
    if args.all and args.spec:
        raise UsageError(f"bench: give SPEC names or --all, not both (got --all and {' '.join(args.spec)})")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"bench --jobs {args.jobs}: expected an integer >= 1")
    if args.from_manifests:
        if not args.all:
            # the manifests page has one name per day and GPU: a subset would replace it with fewer sections
            raise UsageError("bench --from-manifests renders the page of every accepted kernel: use --all")
        _refuse_ignored("bench --from-manifests measures nothing", *_measuring_flags(args))
    if args.spec:  # a typo is named before "no GPU" (a new user read that as the problem)
        from ..verifier.library.accept import accepted_names

        try:
            accepted_names(root, list(args.spec))
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not args.from_manifests and not common.has_gpu():
        raise UsageError(
            "bench measures on a Hopper GPU and there is no CUDA GPU here; without one, "
            "--from-verdicts DIR re-renders a measured page and --from-manifests writes one from "
            "the numbers recorded at acceptance"
        )
    try:
        report = bench_kernels(
            root,
            None if args.all else list(args.spec),
            out_dir=out_dir,
            bench_shapes=args.shape or None,
            from_manifests=args.from_manifests,
            jobs=args.jobs,
            repeat=args.repeat,
            force=args.force,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    for verdict in report.verdicts.values():
        tables.print_verdict(console, verdict, recorded=args.from_manifests)
    if report.schedule:
        console.print(escape(f"GPU stages: {len(report.verdicts)} kernel(s) over {report.schedule}"))
    for line in report.notes:
        console.print(escape(f"kept verdicts: {line}"))
    if report.markdown_path:
        console.print(escape(_wrote(report, note_stale_plot=False)))
    else:
        console.print("[yellow]nothing measured (benchmarks need a Hopper GPU); no results written[/]")
    return OK if report.ok else FAILED


def cmd_regress(args) -> int:
    """Re-check accepted kernels: integrity, static, compile; on the GPU numerics and perf ratios."""
    from ..verifier.library.regress import regress

    root = workspace_root(args)
    json_out = output_flag(workspace.out_file, args.json, "--json", root, kind="regress")
    if args.cpu_only and args.verdicts:
        raise UsageError(
            "regress --cpu-only checks integrity, static and compile only; --verdicts judges what a GPU "
            "measured: give one of them"
        )
    if args.shape and (args.cpu_only or args.verdicts):
        raise UsageError(
            "regress --shape picks the benchmark shapes to measure; "
            + ("--cpu-only measures none" if args.cpu_only else "--verdicts judges what was measured")
        )
    if args.kernels:  # a misspelt name first, as bench does (before the no-GPU refusal)
        from ..verifier.library.accept import accepted_names

        try:
            accepted_names(root, args.kernels)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not (args.cpu_only or args.verdicts) and not common.has_gpu():
        raise UsageError(
            "regress checks correctness and speed on a Hopper GPU and there is no CUDA GPU here; "
            "use --cpu-only (integrity, static, sm_90a compile) or --verdicts DIR (what bench measured)"
        )
    try:
        rep = regress(
            root,
            kernels=args.kernels or None,
            cpu_only=args.cpu_only,
            tolerance=args.tolerance,
            bench_shapes=args.shape or None,
            verdicts=args.verdicts,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    console.print(tables.regress_table(rep, cpu_only=args.cpu_only, verdicts=args.verdicts, tolerance=args.tolerance))
    if rep.schedule:
        console.print(escape(f"GPU stages: {len(rep.rows)} kernel(s) over {rep.schedule}"))
    if json_out is not None:
        output_flag(workspace.write_out, json_out, rep.to_json())
    return OK if rep.ok else FAILED

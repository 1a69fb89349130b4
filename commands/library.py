"""Reading and annotating the library: ``coda-agent list``, ``review SPEC`` and ``tricks add``.

* ``list``: every spec and accepted kernel with its status
  (:func:`~coda_agent.verifier.library.catalogue.catalogue`); exit code 2 when one has a
  problem (an invalid spec, an unreadable manifest, a kernel edited since acceptance).
* ``review SPEC``: what a human reviewer needs
  (:func:`~coda_agent.verifier.library.review.review_text`).
* ``tricks add "TEXT" [--kernel K] | --from-run RUN [--unverified]``: one dated line
  appended to ``tricks_log.md`` (:mod:`~coda_agent.agent.tricks`).
"""

from __future__ import annotations

from ..verifier import tables
from .common import OK, USAGE, UsageError, console, err, spec_arg, workspace_root


def cmd_list(args) -> int:
    """Specs and accepted kernels with their status."""
    from ..verifier.library.catalogue import catalogue

    root = workspace_root(args)
    rows = catalogue(root)
    for r in rows:
        if r.status == "invalid":  # whole; the table shows its start
            err.print(f"error: {r.detail}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    console.print(tables.catalogue_table(root, rows))
    return USAGE if any(r.problem for r in rows) else OK


def cmd_review(args) -> int:
    """What a human reviewer needs: diff vs the previous version, numbers, provenance."""
    from ..verifier.library.accept import ManifestError
    from ..verifier.library.review import review_text

    root = workspace_root(args)
    loaded = spec_arg(root, args.spec)
    try:
        text = review_text(root, loaded)
    except (FileNotFoundError, ManifestError) as e:  # no accepted kernel to review, or a broken manifest
        raise UsageError(str(e)) from None
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    return OK


def cmd_tricks(args) -> int:
    """``tricks add``: append one dated lesson to tricks_log.md."""
    from ..agent.tricks import TrickError, add_from_run, add_trick

    root = workspace_root(args)
    try:
        return _tricks_add(root, args, add_from_run, add_trick)
    except TrickError as e:
        raise UsageError(str(e)) from None


def _tricks_add(root, args, add_from_run, add_trick) -> int:
    if args.from_run and args.text:
        raise UsageError("tricks add: give TEXT or --from-run RUN, not both")
    if args.unverified and not args.from_run:
        raise UsageError("--unverified only applies with --from-run RUN")
    if args.from_run:
        from ..agent.run_folder import find_run, holds_run

        run = find_run(root, args.from_run)
        if not holds_run(run):
            raise UsageError(
                f"--from-run {args.from_run}: no such run folder (a path, or a name under {root / 'runs'})"
            )
        entry = add_from_run(root, run, unverified=args.unverified)
    elif args.text:
        if "\n" in args.text.strip():
            raise UsageError("a trick is one line (symptom -> fix); edit tricks_log.md by hand for longer notes")
        if args.kernel and args.kernel != "general" and not (root / "kernel_specs" / args.kernel).is_dir():
            raise UsageError(f"--kernel {args.kernel!r}: no such spec under kernel_specs/ (or use 'general')")
        entry = add_trick(root, args.text.strip(), kernel=args.kernel)
    else:
        raise UsageError('tricks add needs "TEXT" or --from-run RUN')
    console.print("appended to tricks_log.md:", getattr(entry, "raw", entry), markup=False, highlight=False)
    return OK

"""The ``coda-agent`` commands: one function per command, each a thin shell over a pure
function in ``agent/`` or ``verifier/`` that checks the user's input, calls it and prints.

=================  =================================================================
module             commands
=================  =================================================================
``common``         what every command shares: the consoles, exit codes, ``UsageError``,
                   the workspace root, SPEC and output-flag checks, ``has_gpu``
``verify``         ``verify`` (one candidate, or several side by side)
``generate``       ``generate`` and ``prompt``: the LLM's side
``bench``          ``bench`` and ``regress``: measuring and re-checking accepted kernels
``library``        ``list``, ``review`` and ``tricks add``: reading and annotating the library
``tune``           ``tune`` and ``build``: GEMM configs and the kernel cache
=================  =================================================================

Rules:

* ``cli.py`` owns the parser, ``main`` and signals; these modules never import it (the
  arrow points one way: ``cli`` -> ``commands``).
* A command returns its exit code (``OK``, ``FAILED``, ``USAGE``; ``cli.py``'s docstring
  gives their meaning) and raises :class:`~.common.UsageError` for bad input, before any
  work where it can.
* Heavy imports (torch, the verifier's stages) stay inside the functions, so that
  ``coda-agent --help`` and a usage error stay fast.
"""

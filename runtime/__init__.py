"""How accepted kernels run in training: tuned configs, direct launches, compiled-kernel cache.

Three small modules, none of which imports the verifier or the ops glue (both import them):

=============  ====================================================================
module         job
=============  ====================================================================
``launch``     :func:`~.launch.bind_entry`: a kernel's entry with every epilogue mod
               behind a :class:`~.launch.Launcher` (config per shape, one cached
               ``EpiPlan`` per shape class, ``EpiPlan.run`` per call)
``tuning``     the committed tuning table (``generated_kernels/tuning.json``): per GPU,
               kernel hash, epilogue and shape bucket, the config and the route
               (fused or standard) with the numbers that chose them
``cache``      quack's compiled-object cache folder, keyed by GPU architecture and
               versions; ``coda-agent build`` fills it ahead of time
=============  ====================================================================

The contract this relies on (``primitives_docs/00-contract.md``, enforced by the static
stage): a kernel defines its epilogue mods at module level and calls them by name from its
host code; a ``config=`` it passes is the default for shapes the table does not cover.
The verifier runs candidates through the same launchers (``verifier/gpu/worker_candidate``),
so the binary it judges is the binary training runs, and ``coda-agent tune`` re-verifies a
tuned config before writing it (a new config is a new binary).
"""

"""``coda-agent tune`` and ``coda-agent build``: per-shape GEMM configs for accepted kernels,
re-verified before use, and their compiled objects ahead of time.

=============  =====================================================================
module         job
=============  =====================================================================
``space``      the config search space (quack's SM90 list + 1x1 clusters, then the
               dynamic persistent scheduler on the leaders) and quack's legality rules
``build``      compile jobs on CPU worker processes into the runtime's kernel cache
``sweep``      the GPU worker: times a kernel's entry per config and shape, the way
               the bench stage times (rotated input sets, ``do_bench`` medians, L2
               flushed), one subprocess per kernel so a crashing config ends only it
``tune``       orchestration: compile, sweep, re-verify the winners through
               ``verify`` (numerics and same-run baselines), write ``tuning.json``
=============  =====================================================================

The tuned config reaches training through :mod:`coda_agent.runtime` (launchers read the
table); the design of the table is :mod:`coda_agent.runtime.tuning`'s docstring.
"""

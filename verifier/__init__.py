"""The verifier: proves an LLM-written candidate kernel correct and fast before it enters
the library, and keeps the accepted kernels honest afterwards.

The pipeline, step by step, and the module that owns each step
----------------------------------------------------------------

=====================  =================================================================
step                   module
=====================  =================================================================
the contract           ``spec/`` -- ``spec.toml`` + ``reference.py`` as validated data
                       (``models``, ``expressions``, ``loading``)
orchestration          ``pipeline.verify``: snapshot the file once, run the stages in
                       order, stop at the first that does not pass
1. static (CPU)        ``static/``: facts about names and bindings first (``facts``),
                       then rules over them (``rules_*``); the library surface in
                       ``surface``
2. compile (CPU)       ``compile/``: sm_90a compile of every kernel variant the
                       spec's cases need, in its own process (``stage`` -> ``worker``)
3. GPU workers         ``gpu/``: the untrusted candidate worker (``worker_candidate``:
                       correctness and coverage trials, timing, instruments) and the
                       trusted reference worker (``worker_reference``: fp32 and
                       low-precision references, baselines); ``protocol``, ``runs``,
                       ``coverage`` and ``inputs`` define what they run
4. judging (parent)    ``stages/``: ``correctness``, ``gradients`` (per-element rules
                       in ``numerics``, fp8 outputs in ``numerics_fp8``), ``bench``;
                       all from the workers' records
the verdict            ``verdict`` (the model), ``feedback`` (the repair prompt's text)
5. accept              ``library/accept``: writes ``generated_kernels/<spec>/`` with
                       its manifest; ``regress``, ``review``, ``bench`` keep the
                       library honest
=====================  =================================================================

Many at once: ``schedule/`` runs the GPU stages of many verifications over every visible
GPU (memory budgets per worker, timings alone, re-runs of the verifier's trouble, Ray).

Cross-cutting: ``confine/`` runs untrusted code (process groups and timeouts in
``sandbox``, Landlock, seccomp, the audit hook, the private snapshot, the records the
workers write); ``workspace`` owns atomic writes and the paths commands may write;
``progress`` reports long steps to a terminal.

Trust boundaries
----------------
* Candidate code runs only in the candidate worker and the compile worker: subprocess,
  timeout, Landlock (writes only beneath its scratch folder), seccomp, its own session.
  Everything it writes is data to be checked, never code or a verdict.
* The reference worker and the parent never import candidate code; the parent judges
  only records, and the secret (seeds, coverage shapes, sampled positions) never reaches
  a file the candidate can read (``pipeline.run_gpu_workers``).
* A verifier failure is reported as ``error`` (the verifier's problem), never charged to
  the candidate; a candidate's crash or hang ends its worker, never the verifier.

Rules that hold everywhere (each has a test that shows why):

* Imports point down: ``cli -> commands -> agent -> verifier``; inside the verifier,
  ``stages`` and ``library`` read ``gpu``'s records, ``gpu`` never imports ``stages``.
* Workers are started by module path (``python -m coda_agent.verifier.gpu.worker_*``):
  moving a worker means updating ``pipeline.CAND_WORKER``/``REF_WORKER``.
* Where to start reading: the README's "Dive into the code" list (``pipeline.verify``,
  ``stages/numerics``, ``gpu/coverage``, ...). The threat model (docs/threat-model.md) maps each attack
  to the module that stops it and the corpus file that tries it.
"""

"""The verifier: proves an LLM-written candidate kernel correct, fast and honest.

Stages (each ``inputs -> StageResult``; see verdict.py):
static (ast, CPU) -> compile (sm_90a; CPU compile-only path or first call on Hopper)
-> correctness -> gradients -> bench (GPU, in sandboxed subprocesses) -> accept.
"""

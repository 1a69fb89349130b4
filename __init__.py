"""coda-agent: an LLM writes fused GEMM-epilogue kernels; a verifier proves them; accepted kernels form a library."""

"""The judging stages in the parent: correctness, gradients, bench (no GPU here)."""

"""The agent: renders a spec into prompts, asks an LLM for a candidate, repairs on feedback."""

"""LLM backends (anthropic, command, manual, scripted)."""

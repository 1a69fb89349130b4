"""The static stage (see ``checker.py``)."""

from .checker import KINDS, check_static

__all__ = ["KINDS", "check_static"]

"""Tiny worker modules for tests/verifier/test_sandbox.py (run as ``python -m sandbox_fixtures.X``)."""

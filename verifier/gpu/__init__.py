"""What runs on the GPU, and how it talks to the parent (see ``verifier/__init__.py``)."""

"""The sm_90a compile stage: the parent side and its worker."""

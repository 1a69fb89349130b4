"""Maintaining the library of accepted kernels: accept, regress, review, bench."""

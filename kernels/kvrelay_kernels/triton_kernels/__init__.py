"""Triton implementations of the public kernels (imported lazily, only where used)."""

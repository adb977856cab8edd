"""C++ CPU kernels, compiled from source on first use (see ``build.py``).

Each has a pure-PyTorch reference that runs instead wherever no compiler builds it.
"""

"""Shared test helpers (importable as ``helpers`` because ``tests/conftest.py`` puts ``tests/`` on the path)."""

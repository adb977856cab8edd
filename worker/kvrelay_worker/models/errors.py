"""The two ways a model request can fail before any weight is touched.

Both subclass ``ValueError`` so callers that validate user input (the CLI, the worker's
startup) can catch one familiar type and show the message as is: every message says what
was asked for and what would work instead.
"""

from __future__ import annotations


class UnknownModelError(ValueError):
    """The name is neither a known model nor an existing path (the message lists known names)."""


class UnsupportedModelError(ValueError):
    """The model exists but we cannot run it: another architecture, sliding-window attention,
    a quantisation or tensor type we cannot read, and so on."""

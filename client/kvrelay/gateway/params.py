"""The ``param`` of a 400: the field path an SDK error message starts with."""

from __future__ import annotations

import re

_PATH = re.compile(r"[A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*")


def param_of(message: str, default: str) -> str:
    """``"tools[0].function.name: ..."`` -> ``"tools[0].function.name"``; a message that
    does not start with a path under ``default`` gets ``default``."""
    found = _PATH.match(message)
    if found is None:
        return default
    path = found.group(0)
    return path if path == default or path.startswith((f"{default}[", f"{default}.")) \
        else default

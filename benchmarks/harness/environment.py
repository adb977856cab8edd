"""Variables set in this process for one measured row, then restored: a benchmark that
compares the engine with a switch on and off (``KVRELAY_CPU_DECODE_STEP``,
``KVRELAY_CPU_INT16_GEMM``) sets it around the whole row, build and run alike."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set while the block runs; each variable back to its value (or unset) after."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

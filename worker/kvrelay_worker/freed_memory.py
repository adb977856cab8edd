"""Hand freed heap memory back to the system while a model loads.

Why: glibc raises its memory-map threshold after the first large block is freed, so the
temporaries of later tensors (read buffers, repacking, quantizing) come from the heap, and
freed heap pages below its top stay resident. Loading is a long run of such temporaries,
so the process's peak crept one fragmented heap above the weights (SmolLM2's kept GGUF:
27 MiB of 92). ``malloc_trim`` returns those pages; it costs about a millisecond, paid once
per loaded part. Elsewhere (musl, macOS) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (glibc only; a no-op elsewhere)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)

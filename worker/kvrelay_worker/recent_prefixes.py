"""The prompt prefixes this worker most likely still holds in its prefix cache.

Every job's prompt adds its chain of leading-chunk fingerprints (the SDK's own
``prefix_fingerprints``, so both sides agree). The engine evicts the least recently used
KV blocks first, so the worker keeps the most recently used fingerprints, at most as many
as its KV cache could hold chunks of (``capacity``) and never more than
``MAX_ADVERTISED``; the heartbeat advertises them as a ``PrefixFilter``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from kvrelay.prefix_filter import MAX_ADVERTISED, PrefixFilter
from kvrelay.prefix_fingerprints import CHUNK_TOKENS, request_fingerprints
from kvrelay.protocol import GenerateRequest

__all__ = ["RecentPrefixes", "prefix_capacity"]


def prefix_capacity(cache_tokens: int) -> int:
    """How many chunk fingerprints a KV cache of ``cache_tokens`` tokens could back."""
    return max(1, min(MAX_ADVERTISED, cache_tokens // CHUNK_TOKENS))


class RecentPrefixes:
    """A thread-safe LRU set of fingerprints (task threads add, the heartbeat reads)."""

    def __init__(self, capacity: int = MAX_ADVERTISED) -> None:
        self.capacity = max(1, min(capacity, MAX_ADVERTISED))
        self._recent: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()
        self._encoded: str | None = ""

    def note(self, request: GenerateRequest) -> None:
        """Record that this worker is serving ``request``'s prompt."""
        chain = request_fingerprints(request)
        if not chain:
            return
        with self._lock:
            for fingerprint in chain:
                self._recent[fingerprint] = None
                self._recent.move_to_end(fingerprint)
            while len(self._recent) > self.capacity:
                self._recent.popitem(last=False)
            self._encoded = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._recent)

    def advertised(self) -> str:
        """The encoded filter for the heartbeat (rebuilt only after a change)."""
        with self._lock:
            if self._encoded is None:
                self._encoded = PrefixFilter(self._recent).encode()
            return self._encoded

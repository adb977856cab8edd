"""``/health``: ok or not, nothing more, and cheap however often it is asked.

The endpoint needs no key, so it says nothing a stranger could use (no host, no error
text) and it shares one Redis round trip per ``max_age`` among every caller: polling it
in a loop costs Redis nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

# How long one answer is reused, and how long one probe may take (then: not ok).
HEALTH_MAX_AGE_S = 1.0
HEALTH_PROBE_TIMEOUT_S = 1.0


class HealthCheck:
    """``ok()`` runs ``probe`` (raises when unhealthy) at most once per ``max_age`` s."""

    def __init__(self, probe: Callable[[], Awaitable[None]],
                 max_age: float = HEALTH_MAX_AGE_S) -> None:
        self._probe = probe
        self._max_age = max_age
        self._checked_at = -float("inf")
        self._ok = False
        self._lock = asyncio.Lock()

    async def ok(self) -> bool:
        if time.monotonic() - self._checked_at < self._max_age:
            return self._ok
        async with self._lock:  # callers arriving meanwhile share this probe's answer
            if time.monotonic() - self._checked_at >= self._max_age:
                try:
                    async with asyncio.timeout(HEALTH_PROBE_TIMEOUT_S):
                        await self._probe()
                    self._ok = True
                except Exception:  # any failure is "not ok"; the reason stays inside
                    self._ok = False
                self._checked_at = time.monotonic()
            return self._ok

"""``RedisHealth``: since when this worker's writes have been getting through.

A lease is judged on time Redis was reachable: a job whose lease ran out while Redis
refused writes or failed over was not abandoned, its owner simply could not refresh it
either. Every thread that writes reports here; the failover watch takes over a job only
once this worker's own writes have succeeded for a whole lease period since the last
failure, by which time a live owner has refreshed (or taken back) its leases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RedisHealth:
    """Shared by the threads of one worker process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last_failure: float | None = None

    def failed(self) -> None:
        with self._lock:
            self._last_failure = self._clock()

    def writable_for(self) -> float:
        """Seconds since the last failed write (infinite when none failed yet)."""
        with self._lock:
            if self._last_failure is None:
                return float("inf")
            return self._clock() - self._last_failure

    def last_failure(self) -> float | None:
        """When the last write failed (the clock's time); None when none has."""
        with self._lock:
            return self._last_failure

"""A daemon thread that calls one function every ``period`` seconds until stopped.

A tick that keeps failing (Redis refusing writes for a while) is logged when the streak
starts, every ``WARN_EVERY_S`` while it lasts, and when it ends: not once per tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvrelay_worker.redis_health import RedisHealth

log = logging.getLogger(__name__)

WARN_EVERY_S = 5.0


class Periodic:
    """Runs ``tick`` every ``period`` s; a failing tick is logged and tried next period."""

    def __init__(self, name: str, period: float, tick: Callable[[], None],
                 health: RedisHealth | None = None) -> None:
        self.name = name
        self.period = period
        self.tick = tick
        # Told of every failed tick: the ticks here write to Redis.
        self.health = health
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        failing_since: float | None = None
        warned_at = 0.0
        while not self._stop.wait(self.period):
            try:
                self.tick()
            except Exception as exc:
                if self.health is not None:
                    self.health.failed()
                now = time.monotonic()
                if failing_since is None or now - warned_at >= WARN_EVERY_S:
                    failing_since = failing_since or now
                    warned_at = now
                    log.warning("%s failed (%s); retrying (failing for %.1fs)", self.name, exc,
                                now - failing_since)
                continue
            if failing_since is not None:
                log.warning("%s works again after %.1fs", self.name,
                            time.monotonic() - failing_since)
                failing_since = None

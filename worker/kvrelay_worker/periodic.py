"""A daemon thread that calls one function every ``period`` seconds until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvrelay_worker.redis_health import RedisHealth

log = logging.getLogger(__name__)


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

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.tick()
            except Exception as exc:
                if self.health is not None:
                    self.health.failed()
                log.warning("%s failed (%s); retrying", self.name, exc)

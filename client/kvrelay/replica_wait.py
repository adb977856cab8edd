"""``ReplicaWait``: how many replicas a write waits for (``WAIT``), now.

Behind sentinels a write counts once a replica holds it (see ``kvrelay.sentinel_url``).
But right after a failover the new primary often has no replica at all (the old primary,
its only one, is dead), and a ``WAIT`` that cannot be satisfied costs its whole timeout on
every write: a stream would crawl at one event per timeout. So once a ``WAIT`` comes back
short, writes stop waiting for ``retry_after_s`` and then try again; the writes made in
between are as safe as a primary without replicas can make them.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

__all__ = ["ReplicaWait"]


class ReplicaWait:
    """The ``WAIT`` arguments for the next write, and what to do with its answer."""

    def __init__(self, replicas: int, timeout_ms: int, *, retry_after_s: float = 5.0) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.retry_after_s = retry_after_s
        self._off_until = 0.0
        self._degraded = False

    def wanted(self) -> int:
        """Replicas the next write waits for (0: send no ``WAIT``)."""
        if self.replicas <= 0 or time.monotonic() < self._off_until:
            return 0
        return self.replicas

    def observe(self, acknowledged: object) -> None:
        """``WAIT``'s reply: fewer replicas than wanted turns waiting off for a while."""
        if not isinstance(acknowledged, int):
            return
        if acknowledged >= self.replicas:
            if self._degraded:
                log.warning("%d replicas acknowledge writes again", acknowledged)
            self._degraded = False
            return
        if not self._degraded:
            log.warning("only %d of %d replicas acknowledged a write within %d ms; until they "
                        "do, writes are not waited for (tried again every %.1fs)",
                        acknowledged, self.replicas, self.timeout_ms, self.retry_after_s)
        self._degraded = True
        self._off_until = time.monotonic() + self.retry_after_s

"""``ReplicaWait``: how many replicas a write waits for (``WAIT``), now.

Behind sentinels a write counts once a replica holds it (see ``kvrelay.sentinel_url``).
But right after a failover the new primary often has no replica at all (the old primary,
its only one, is dead), and a ``WAIT`` that cannot be satisfied costs its whole timeout on
every write: a stream would crawl at one event per timeout. So once a ``WAIT`` comes back
short, writes stop waiting for ``retry_after_s`` and then try again; the writes made in
between are as safe as a primary without replicas can make them.

A short ``WAIT`` may also mean the replica was just promoted while this primary still
takes writes (``kvrelay.primary_doubt``): ``settle`` asks the sentinels before taking a
write as done, and while writes go unwaited it asks them again every ``probe_every_s``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kvrelay.primary_doubt import PrimaryInDoubt, async_primary_doubt, sync_primary_doubt

log = logging.getLogger(__name__)

__all__ = ["ReplicaWait"]


class ReplicaWait:
    """The ``WAIT`` arguments for the next write, and what to do with its answer."""

    def __init__(self, replicas: int, timeout_ms: int, *, retry_after_s: float = 5.0,
                 probe_every_s: float = 0.5) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.retry_after_s = retry_after_s
        self.probe_every_s = probe_every_s
        self._off_until = 0.0
        self._degraded = False
        self._next_probe = 0.0

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

    def _needs_probe(self, acknowledged: object) -> bool:
        """Ask the sentinels after this write? After a short ``WAIT``; after an unwaited
        write while degraded, at most every ``probe_every_s``."""
        if self.replicas <= 0:
            return False
        if isinstance(acknowledged, int):
            return acknowledged < self.replicas
        now = time.monotonic()
        if acknowledged is not None or not self._degraded or now < self._next_probe:
            return False
        self._next_probe = now + self.probe_every_s
        return True

    def settle(self, acknowledged: object, pool: Any) -> None:
        """After a write on ``pool`` (``acknowledged``: its ``WAIT``'s reply, None when it
        sent none): raise ``PrimaryInDoubt``, with the pool's connections dropped, when
        the write may sit on a primary being replaced; else take the reply into account."""
        if self._needs_probe(acknowledged):
            doubt = sync_primary_doubt(pool)
            if doubt is not None:
                pool.disconnect()
                raise PrimaryInDoubt(f"{doubt}; the write is sent again")
        self.observe(acknowledged)

    async def asettle(self, acknowledged: object, pool: Any) -> None:
        """``settle`` for a ``redis.asyncio`` pool."""
        if self._needs_probe(acknowledged):
            doubt = await async_primary_doubt(pool)
            if doubt is not None:
                await pool.disconnect()
                raise PrimaryInDoubt(f"{doubt}; the write is sent again")
        self.observe(acknowledged)

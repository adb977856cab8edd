"""``ReplicaWait``: how many replicas a write waits for (``WAIT``), now.

Behind sentinels a write counts once a replica holds it (see ``kvrelay.sentinel_url``).
When a ``WAIT`` comes back short, ``settle`` asks the sentinels why
(``kvrelay.primary_doubt``): a primary being replaced, or a replica that is up but
behind, makes the caller send the write again. With no replica up (right after a
failover the new primary often has none: the old primary, its only one, is dead), a
``WAIT`` that cannot be satisfied would cost its whole timeout on every write and a
stream would crawl at one event per timeout, so writes stop waiting for
``retry_after_s`` and then try again; the writes made in between are as safe as a
primary without replicas can make them, and one of them every ``probe_every_s`` asks the
sentinels again (a failover starting then is still noticed).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import redis

from kvrelay.primary_doubt import (
    PrimaryInDoubt,
    ReplicaLagging,
    Verdict,
    async_verdict,
    sync_verdict,
)

log = logging.getLogger(__name__)

__all__ = ["ReplicaWait"]


class ReplicaWait:
    """The ``WAIT`` arguments for the next write, and what to do with its answer."""

    def __init__(self, replicas: int, timeout_ms: int, *, retry_after_s: float = 5.0,
                 probe_every_s: float = 0.5, lag_retries: int = 3) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.retry_after_s = retry_after_s
        self.probe_every_s = probe_every_s
        self.lag_retries = lag_retries
        self._lagging = 0
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
            self._lagging = 0
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

    def _judge(self, found: Verdict, acknowledged: object) -> type[redis.ConnectionError] | None:
        """What the sentinels' verdict on this write means: the error that makes the
        caller send it again, or None (it counts, as far as it can)."""
        if found is Verdict.IN_DOUBT:
            return PrimaryInDoubt
        if found is Verdict.LAGGING:
            if acknowledged is None:  # a replica is back up: wait again from now on
                self._off_until = 0.0
            elif self._lagging < self.lag_retries:
                self._lagging += 1
                return ReplicaLagging
        self._lagging = 0
        return None

    def settle(self, acknowledged: object, pool: Any) -> None:
        """After a write on ``pool`` (``acknowledged``: its ``WAIT``'s reply, None when it
        sent none): raise ``PrimaryInDoubt`` or ``ReplicaLagging`` when the write must be
        sent again; else take the reply into account. On a primary in doubt the pool
        asks the sentinels for the primary: once they name another, it drops its idle
        connections to the old one at once and the busy ones when they come back (never
        a connection another thread is reading from)."""
        if self._needs_probe(acknowledged):
            found, why = sync_verdict(pool)
            error = self._judge(found, acknowledged)
            if error is PrimaryInDoubt:
                _follow_primary(pool)
            if error is not None:
                raise error(f"{why}; the write is sent again")
        self.observe(acknowledged)

    async def asettle(self, acknowledged: object, pool: Any) -> None:
        """``settle`` for a ``redis.asyncio`` pool."""
        if self._needs_probe(acknowledged):
            found, why = await async_verdict(pool)
            error = self._judge(found, acknowledged)
            if error is PrimaryInDoubt:
                with contextlib.suppress(redis.RedisError):
                    await pool.get_master_address()
            if error is not None:
                raise error(f"{why}; the write is sent again")
        self.observe(acknowledged)


def _follow_primary(pool: Any) -> None:
    """Make a Sentinel-managed pool look the primary up now (see ``settle``)."""
    with contextlib.suppress(redis.RedisError):
        pool.get_master_address()

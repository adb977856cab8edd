"""``ReplicaWait``: how many replicas a write waits for (``WAIT``), now, per primary.

Behind sentinels a write counts once a replica holds it (see ``kvrelay.sentinel_url``).
When a ``WAIT`` comes back short, ``settle`` asks the sentinels why
(``kvrelay.primary_doubt``), about the server that carried the write
(``kvrelay.write_carrier``): a primary being replaced, or a replica that is up but
behind, makes the caller send the write again. With no replica up (right after a
failover the new primary often has none: the old primary, its only one, is dead), a
``WAIT`` that cannot be satisfied would cost its whole timeout on every write and a
stream would crawl at one event per timeout, so writes to that primary stop waiting for
``retry_after_s`` and then try again; the writes made in between are as safe as a
primary without replicas can make them, and one of them every ``probe_every_s`` asks the
sentinels again (a failover starting then is still noticed).

That degraded mode belongs to one primary and is entered only on the sentinels' word
about it. Shared by the whole process, the new primary's missing replica turned waiting
off for writes still reaching the old one, which vanished when it was demoted. A write
sent without a ``WAIT`` (its pool named a degraded primary) that another server carried
is judged at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from kvrelay.primary_doubt import (
    PrimaryInDoubt,
    ReplicaLagging,
    Verdict,
    async_verdict,
    sync_verdict,
)
from kvrelay.write_carrier import (
    Address,
    aexecute_noting_carrier,
    execute_noting_carrier,
    pool_primary,
)

log = logging.getLogger(__name__)

__all__ = ["ReplicaWait"]


@dataclass(slots=True)
class _Primary:
    """What the writes know of one primary's replicas."""

    # Its writes send no ``WAIT`` until then (monotonic s).
    off_until: float = 0.0
    # Its last short ``WAIT`` was judged "no replica up".
    degraded: bool = False
    # Short ``WAIT``s judged "lagging" in a row.
    lagging: int = 0
    # While degraded: when an unwaited write asks the sentinels next.
    next_probe: float = 0.0


class ReplicaWait:
    """The ``WAIT`` arguments for the next write, and what to do with its answer."""

    def __init__(self, replicas: int, timeout_ms: int, *, retry_after_s: float = 5.0,
                 probe_every_s: float = 0.5, lag_retries: int = 3) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.retry_after_s = retry_after_s
        self.probe_every_s = probe_every_s
        self.lag_retries = lag_retries
        self._primaries: dict[Address | None, _Primary] = {}

    def _of(self, address: Address | None) -> _Primary:
        return self._primaries.setdefault(address, _Primary())

    def _off(self, address: Address | None) -> bool:
        state = self._primaries.get(address)
        return state is not None and time.monotonic() < state.off_until

    def wanted(self, pool: Any = None) -> int:
        """Replicas the next write on ``pool`` waits for (0: send no ``WAIT``): none while
        the primary the pool names is degraded."""
        if self.replicas <= 0 or self._off(pool_primary(pool)):
            return 0
        return self.replicas

    def observe(self, acknowledged: object, address: Address | None = None) -> None:
        """``WAIT``'s reply on ``address``: fewer replicas than wanted turns waiting off
        there for a while."""
        if not isinstance(acknowledged, int):
            return
        state = self._of(address)
        if acknowledged >= self.replicas:
            state.lagging = 0
            if state.degraded:
                log.warning("%d replicas acknowledge writes again (on %s)", acknowledged,
                            _named(address))
            state.degraded = False
            return
        self._degrade(state, address, acknowledged)

    def _degrade(self, state: _Primary, address: Address | None, acknowledged: int) -> None:
        if not state.degraded:
            log.warning("only %d of %d replicas acknowledged a write on %s within %d ms; "
                        "until they do, its writes are not waited for (tried again every "
                        "%.1fs)", acknowledged, self.replicas, _named(address),
                        self.timeout_ms, self.retry_after_s)
        state.degraded = True
        state.off_until = time.monotonic() + self.retry_after_s

    def _needs_probe(self, acknowledged: object, state: _Primary, unplanned: bool) -> bool:
        """Ask the sentinels after this write? After a short ``WAIT``; after an unwaited
        write while degraded, at most every ``probe_every_s``; after an unplanned one."""
        if self.replicas <= 0:
            return False
        if isinstance(acknowledged, int):
            return acknowledged < self.replicas
        if acknowledged is not None:
            return False
        if unplanned:
            return True
        now = time.monotonic()
        if not state.degraded or now < state.next_probe:
            return False
        state.next_probe = now + self.probe_every_s
        return True

    def _judge(self, found: Verdict, acknowledged: object, state: _Primary,
               address: Address | None, unplanned: bool) -> type[redis.ConnectionError] | None:
        """What the sentinels' verdict on this write means: the error that makes the
        caller send it again, or None (it counts, as far as it can)."""
        if found is Verdict.IN_DOUBT:
            return PrimaryInDoubt
        if found is Verdict.LAGGING:
            if unplanned:  # unwaited on a primary with a replica up: again, waiting
                return ReplicaLagging
            if acknowledged is None:  # a replica is back up: wait again from now on
                state.off_until = 0.0
            elif state.lagging < self.lag_retries:
                state.lagging += 1
                return ReplicaLagging
        elif unplanned:  # the sentinels say this primary has no replica up
            self._degrade(state, address, 0)
        state.lagging = 0
        return None

    def _carrier(self, pool: Any, carrier: Address | None) -> Address | None:
        return carrier if carrier is not None else pool_primary(pool)

    def settle(self, acknowledged: object, pool: Any, carrier: Address | None = None, *,
               unplanned: bool = False) -> None:
        """After a write on ``pool`` that ``carrier`` took (None: the primary the pool
        names; ``acknowledged``: its ``WAIT``'s reply, None when it sent none; ``unplanned``:
        sent unwaited to a primary nothing says is degraded): raise ``PrimaryInDoubt`` or
        ``ReplicaLagging`` when the write must be sent again; else take the reply into
        account. On a primary in doubt the pool asks the sentinels for the primary: once
        they name another, it drops its idle connections to the old one at once and the
        busy ones when they come back (never a connection another thread reads from)."""
        address = self._carrier(pool, carrier)
        state = self._of(address)
        if self._needs_probe(acknowledged, state, unplanned):
            found, why = sync_verdict(pool, address)
            error = self._judge(found, acknowledged, state, address, unplanned)
            if error is PrimaryInDoubt:
                _follow_primary(pool)
            if error is not None:
                raise error(f"{why}; the write is sent again")
        self.observe(acknowledged, address)

    async def asettle(self, acknowledged: object, pool: Any, carrier: Address | None = None,
                      *, unplanned: bool = False) -> None:
        """``settle`` for a ``redis.asyncio`` pool."""
        address = self._carrier(pool, carrier)
        state = self._of(address)
        if self._needs_probe(acknowledged, state, unplanned):
            found, why = await async_verdict(pool, address)
            error = self._judge(found, acknowledged, state, address, unplanned)
            if error is PrimaryInDoubt:
                with contextlib.suppress(redis.RedisError):
                    await pool.get_master_address()
            if error is not None:
                raise error(f"{why}; the write is sent again")
        self.observe(acknowledged, address)

    def _unplanned(self, wanted: int, planned: Address | None, carrier: Address | None) -> bool:
        """Sent without a ``WAIT`` for ``planned``'s sake, but taken by another server
        that is not degraded (the pool moved between the plan and the write)."""
        return (wanted == 0 and self.replicas > 0 and carrier is not None
                and carrier != planned and not self._off(carrier))

    def execute(self, pipe: Any, *, raise_on_error: bool = False) -> list[Any]:
        """Execute a pipeline of writes closed by the ``WAIT`` its primary wants, and
        ``settle`` it by the server that carried it; the replies, less the ``WAIT``'s."""
        pool = pipe.connection_pool
        planned = pool_primary(pool)
        wanted = self.wanted(pool)
        if wanted > 0:
            pipe.execute_command("WAIT", wanted, self.timeout_ms)
        replies, carrier = execute_noting_carrier(pipe, raise_on_error=raise_on_error)
        acknowledged = replies.pop() if wanted > 0 else None
        self.settle(acknowledged, pool, carrier,
                    unplanned=self._unplanned(wanted, planned, carrier))
        return replies

    async def aexecute(self, pipe: Any, *, raise_on_error: bool = True) -> list[Any]:
        """``execute`` for a ``redis.asyncio`` pipeline."""
        pool = pipe.connection_pool
        planned = pool_primary(pool)
        wanted = self.wanted(pool)
        if wanted > 0:
            pipe.execute_command("WAIT", wanted, self.timeout_ms)
        replies, carrier = await aexecute_noting_carrier(pipe, raise_on_error=raise_on_error)
        acknowledged = replies.pop() if wanted > 0 else None
        await self.asettle(acknowledged, pool, carrier,
                           unplanned=self._unplanned(wanted, planned, carrier))
        return replies


def _named(address: Address | None) -> str:
    return "the primary" if address is None else f"{address[0]}:{address[1]}"


def _follow_primary(pool: Any) -> None:
    """Make a Sentinel-managed pool look the primary up now (see ``settle``)."""
    with contextlib.suppress(redis.RedisError):
        pool.get_master_address()

"""Whether the primary a write went to is being replaced: asked when its ``WAIT`` is short.

Behind sentinels a ``WAIT`` that comes back short means one of two things. A replica is
down: writes go on without waiting (``kvrelay.replica_wait``). Or the replica was just
promoted while this primary still takes writes: a failover the sentinels started because
the primary stopped answering them for a while (``CLIENT PAUSE WRITE`` also holds the
``PUBLISH`` of their hello messages, so their pings go unanswered), or a partition. The
old primary keeps every connection it had and answers until the sentinels demote it,
which can take many seconds, and everything written to it meanwhile vanishes then. So
when any sentinel flags the primary as down or failing over, or names another primary,
the write must not count: the caller drops its connections (the next ones ask the
sentinels) and sends it again, as after a connection lost before its reply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis

__all__ = ["FAILOVER_FLAGS", "PrimaryInDoubt", "async_primary_doubt", "doubt_in",
           "sync_primary_doubt"]

# Sentinel flags on a primary that mean it may be replaced.
FAILOVER_FLAGS = frozenset({"s_down", "o_down", "failover_in_progress"})

_SENTINEL_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)


class PrimaryInDoubt(redis.ConnectionError):
    """The write may sit on a primary the sentinels are replacing: send it again."""


def _flags(state: Mapping[str, Any]) -> set[str]:
    flags = state.get("flags", "")
    return set(flags.split(",")) if isinstance(flags, str) else set(flags)


def doubt_in(states: Iterable[Mapping[str, Any]], ours: tuple[str, int] | None) -> str | None:
    """Why ``ours`` may not stay the primary, from the sentinels' views of it (``SENTINEL
    MASTER``, parsed by redis-py); None when every view names it, healthy."""
    for state in states:
        flagged = _flags(state) & FAILOVER_FLAGS
        if flagged:
            return f"a sentinel flags the primary {','.join(sorted(flagged))}"
        named = (str(state.get("ip")), int(state.get("port", 0)))
        if ours is not None and named != (str(ours[0]), int(ours[1])):
            return f"a sentinel names {named[0]}:{named[1]} as the primary"
    return None


def _sentinel_parts(pool: Any) -> tuple[Any, str, tuple[str, int] | None] | None:
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:  # not a Sentinel-managed pool: nothing to ask
        return None
    return manager, pool.service_name, pool.master_address


def sync_primary_doubt(pool: Any) -> str | None:
    """``doubt_in`` for a redis-py ``SentinelConnectionPool`` (None for any other pool);
    a sentinel that does not answer is left out."""
    parts = _sentinel_parts(pool)
    if parts is None:
        return None
    manager, name, ours = parts
    states = []
    for sentinel in manager.sentinels:
        try:
            states.append(sentinel.sentinel_master(name))
        except _SENTINEL_ERRORS:
            continue
    return doubt_in(states, ours)


async def async_primary_doubt(pool: Any) -> str | None:
    """``sync_primary_doubt`` for a ``redis.asyncio`` pool."""
    parts = _sentinel_parts(pool)
    if parts is None:
        return None
    manager, name, ours = parts
    states = []
    for sentinel in manager.sentinels:
        try:
            states.append(await sentinel.sentinel_master(name))
        except _SENTINEL_ERRORS:
            continue
    return doubt_in(states, ours)

"""What a short ``WAIT`` behind sentinels means: the sentinels' view, asked right then.

A ``WAIT`` that comes back short has three causes, and each wants its own answer:

- **the primary is being replaced** (``IN_DOUBT``): the replica was just promoted while
  this primary still takes writes, after the sentinels lost it for a while
  (``CLIENT PAUSE WRITE`` also holds the ``PUBLISH`` of their hello messages, so their
  pings go unanswered) or in a partition. The old primary keeps every connection it had
  and answers until the sentinels demote it, many seconds later, and everything written
  to it meanwhile vanishes then. The write must not count: the caller sends it again,
  on a connection to the primary the sentinels name by then.
- **no replica is up** (``REPLICA_DOWN``: every sentinel that answers sees each replica
  down or not linked to its primary, or none answers): nothing can acknowledge, and waiting would only slow every
  write by the timeout, so writes stop waiting for a while (``kvrelay.replica_wait``).
- **a replica is up but behind** (``LAGGING``): the write is sent again (every kvrelay
  write may be) and waits again; after a few such answers in a row writes stop waiting,
  as for a replica that is down.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

__all__ = ["DOWN_FLAGS", "FAILOVER_FLAGS", "PrimaryInDoubt", "ReplicaLagging",
           "SentinelView", "Verdict", "async_verdict", "sync_verdict", "verdict"]

# Sentinel flags on a primary that mean it may be replaced.
FAILOVER_FLAGS = frozenset({"s_down", "o_down", "failover_in_progress"})
# Sentinel flags on a replica that mean it cannot acknowledge anything.
DOWN_FLAGS = frozenset({"s_down", "o_down", "disconnected"})

_SENTINEL_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)

# One sentinel's answer: its ``SENTINEL MASTER`` and ``SENTINEL REPLICAS`` replies, as
# redis-py parses them.
SentinelView = tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]


class Verdict(enum.Enum):
    IN_DOUBT = "in doubt"
    REPLICA_DOWN = "replica down"
    LAGGING = "lagging"


class PrimaryInDoubt(redis.ConnectionError):
    """The write may sit on a primary the sentinels are replacing: send it again."""


class ReplicaLagging(redis.ConnectionError):
    """A replica is up but did not acknowledge the write in time: send it again."""


def _flags(state: Mapping[str, Any]) -> set[str]:
    flags = state.get("flags", "")
    return set(flags.split(",")) if isinstance(flags, str) else set(flags)


def _replicating(replica: Mapping[str, Any]) -> bool:
    """Up and linked to its primary as the sentinel last saw it (a demoted primary that
    still says it is one is listed as a replica, with its link down)."""
    return (not _flags(replica) & DOWN_FLAGS
            and replica.get("master-link-status", "ok") == "ok")


def verdict(views: Iterable[SentinelView],
            ours: tuple[str, int] | None) -> tuple[Verdict, str]:
    """The cause of a short ``WAIT`` on primary ``ours`` and why, from the sentinels'
    views (see the module's docstring); no view at all counts as ``REPLICA_DOWN``."""
    replica_up = False
    for master, replicas in views:
        flagged = _flags(master) & FAILOVER_FLAGS
        if flagged:
            return Verdict.IN_DOUBT, f"a sentinel flags the primary {','.join(sorted(flagged))}"
        named = (str(master.get("ip")), int(master.get("port", 0)))
        if ours is not None and named != (str(ours[0]), int(ours[1])):
            return Verdict.IN_DOUBT, f"a sentinel names {named[0]}:{named[1]} as the primary"
        replica_up = replica_up or any(_replicating(r) for r in replicas)
    if replica_up:
        return Verdict.LAGGING, "a replica is up but did not acknowledge in time"
    return Verdict.REPLICA_DOWN, "no replica is up"


def _sentinel_parts(pool: Any) -> tuple[Any, str, tuple[str, int] | None] | None:
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:  # not a Sentinel-managed pool: nothing to ask
        return None
    return manager, pool.service_name, pool.master_address


def sync_verdict(pool: Any) -> tuple[Verdict, str]:
    """``verdict`` for a redis-py ``SentinelConnectionPool`` (any other pool:
    ``REPLICA_DOWN``); a sentinel that does not answer is left out."""
    parts = _sentinel_parts(pool)
    if parts is None:
        return Verdict.REPLICA_DOWN, "no sentinels to ask"
    manager, name, ours = parts
    views: list[SentinelView] = []
    for sentinel in manager.sentinels:
        try:
            views.append((sentinel.sentinel_master(name), sentinel.sentinel_slaves(name)))
        except _SENTINEL_ERRORS:
            continue
    return verdict(views, ours)


async def async_verdict(pool: Any) -> tuple[Verdict, str]:
    """``sync_verdict`` for a ``redis.asyncio`` pool."""
    parts = _sentinel_parts(pool)
    if parts is None:
        return Verdict.REPLICA_DOWN, "no sentinels to ask"
    manager, name, ours = parts
    views: list[SentinelView] = []
    for sentinel in manager.sentinels:
        try:
            views.append((await sentinel.sentinel_master(name),
                          await sentinel.sentinel_slaves(name)))
        except _SENTINEL_ERRORS:
            continue
    return verdict(views, ours)

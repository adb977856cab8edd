"""What a short ``WAIT`` behind sentinels means: the sentinels' view, asked right then.

The view is compared with the server that carried the write (``kvrelay.write_carrier``),
never with the primary the pool names by then: a write held on the old primary while
the pool moved on is judged by where it landed. A ``WAIT`` that comes back short has
three causes, and each wants its own answer:

- **the primary is being replaced** (``IN_DOUBT``): the replica was just promoted while
  this primary still takes writes, after the sentinels lost it for a while
  (``CLIENT PAUSE WRITE`` also holds the ``PUBLISH`` of their hello messages, so their
  pings go unanswered) or in a partition. The old primary keeps every connection it had
  and answers until the sentinels demote it, many seconds later, and everything written
  to it meanwhile vanishes then. So whenever the server that carried the write is not
  the primary every answering sentinel names (or no sentinel answers: nothing then says
  it still is), the write must not count: the caller sends it again, on a connection to
  the primary the sentinels name by then.
- **no replica is up** (``REPLICA_DOWN``: every sentinel that answers names this server
  the primary and sees each of its replicas down or not linked to it): nothing can
  acknowledge, and waiting would only slow every write to this primary by the timeout,
  so its writes stop waiting for a while (``kvrelay.replica_wait``).
- **a replica is up but behind** (``LAGGING``): the write is sent again (every kvrelay
  write may be) and waits again; after a few such answers in a row writes stop waiting,
  as for a replica that is down.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from kvrelay.write_carrier import Address, pool_primary

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
            ours: Address | None) -> tuple[Verdict, str]:
    """The cause of a short ``WAIT`` on server ``ours`` (the one that carried the write;
    None: unknown) and why, from the sentinels' views (see the module's docstring)."""
    views = list(views)
    if not views:
        return Verdict.IN_DOUBT, "no sentinel answered"
    replica_up = False
    for master, replicas in views:
        flagged = _flags(master) & FAILOVER_FLAGS
        if flagged:
            return Verdict.IN_DOUBT, f"a sentinel flags the primary {','.join(sorted(flagged))}"
        named = (str(master.get("ip")), int(master.get("port", 0)))
        if ours is not None and named != (str(ours[0]), int(ours[1])):
            return Verdict.IN_DOUBT, (f"the write went to {ours[0]}:{ours[1]} but a sentinel "
                                      f"names {named[0]}:{named[1]} as the primary")
        replica_up = replica_up or any(_replicating(r) for r in replicas)
    if replica_up:
        return Verdict.LAGGING, "a replica is up but did not acknowledge in time"
    return Verdict.REPLICA_DOWN, "no replica is up"


def _sentinel_parts(pool: Any, carrier: Address | None
                    ) -> tuple[Any, str, Address | None] | None:
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:  # not a Sentinel-managed pool: nothing to ask
        return None
    return manager, pool.service_name, carrier or pool_primary(pool)


def sync_verdict(pool: Any, carrier: Address | None = None) -> tuple[Verdict, str]:
    """``verdict`` on a write that ``carrier`` took (None: the primary ``pool`` names now)
    for a redis-py ``SentinelConnectionPool`` (any other pool: ``REPLICA_DOWN``); a
    sentinel that does not answer is left out."""
    parts = _sentinel_parts(pool, carrier)
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


async def async_verdict(pool: Any, carrier: Address | None = None) -> tuple[Verdict, str]:
    """``sync_verdict`` for a ``redis.asyncio`` pool."""
    parts = _sentinel_parts(pool, carrier)
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

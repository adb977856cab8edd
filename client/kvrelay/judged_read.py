"""Reads that decide what a caller is shown, judged by the server that answered them.

A primary the sentinels replaced while it could not answer them (``CLIENT PAUSE WRITE``,
a partition) stays a primary for many seconds after the failover and keeps every
connection it had. Workers' writes that land there are judged "in doubt" and sent again
to the new primary (``kvrelay.primary_doubt``), but they stay on the old one until it is
demoted: a stream that reads the job's log from it sees events the job's real log never
gets, then the events its new run writes under the same seqs (a token twice, or a gap).

So a read of the log or record ends with the ``WAIT`` its primary wants
(``kvrelay.replica_wait``): a read-only connection's ``WAIT`` answers at once while a
replica is linked, and that old primary has none (its replica was the one promoted), so
its short ``WAIT`` asks the sentinels, who name another server: ``PrimaryInDoubt``, the
pool follows the sentinels, and the read is made again there. Once the sentinels have
demoted it, the ``WAIT`` is refused ("cannot be used with replica instances"): that read
too was answered by a server that is not the primary, and is made again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis

from kvrelay.patience import retried
from kvrelay.primary_doubt import PrimaryInDoubt, ReplicaLagging
from kvrelay.replica_wait import ReplicaWait

__all__ = ["PipelineRun", "judged_run", "plain_run", "reread_in_doubt"]

T = TypeVar("T")

# Runs a pipeline of reads (a redis-py asyncio pipeline) and returns its replies.
PipelineRun = Callable[[Any], Awaitable[list[Any]]]

# How Redis refuses a ``WAIT`` on a replica.
_ON_A_REPLICA = "cannot be used with replica"


async def plain_run(pipe: Any) -> list[Any]:
    """A pipeline's replies, judged by nothing (no sentinels, or a test's own reads)."""
    return list(await pipe.execute())


async def judged_run(replica_wait: ReplicaWait, pipe: Any) -> list[Any]:
    """A pipeline of reads closed by the ``WAIT`` its primary wants, judged by the server
    that answered (``ReplicaWait.aexecute``): its replies, or ``PrimaryInDoubt``."""
    try:
        return await replica_wait.aexecute(pipe)
    except redis.ResponseError as exc:
        if _ON_A_REPLICA not in str(exc):
            raise
        # The connection went back to the pool: drop the idle ones (each connects anew
        # to the primary the sentinels name) and have the pool ask them now.
        pool = pipe.connection_pool
        await pool.disconnect(inuse_connections=False)
        if hasattr(pool, "get_master_address"):
            await pool.get_master_address()
        raise PrimaryInDoubt("a replica answered the read; it is made again") from exc


async def reread_in_doubt(read: Callable[[], Awaitable[T]], within: float) -> T:
    """``await read()``, made again while its server is judged not the primary (or a
    replica lags), for up to ``within`` seconds; other failures are raised at once."""
    return await retried(read, within, _in_doubt)


def _in_doubt(exc: Exception) -> bool:
    return isinstance(exc, (PrimaryInDoubt, ReplicaLagging))

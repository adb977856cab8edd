"""Connections in sentinel mode: each one asks the sentinels for the primary.

The command client is redis-py's Sentinel-managed client over a bounded, blocking pool
(as ``connection.make_redis`` builds for ``redis://``): every new connection looks the
primary up, and connections to a demoted primary are dropped. The pub/sub connection is
our own RESP reader (``kvrelay.resp``); its factory looks the primary up before each
connect, so the dispatcher's reconnect after a failover lands on the new primary.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff

from kvrelay.resp import Endpoint
from kvrelay.sentinel_url import SentinelUrl

__all__ = ["SentinelEndpoints", "close_sentinels", "sentinel_redis", "sync_sentinel_redis"]


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection instead of failing."""


def _sentinel(target: SentinelUrl, connect_timeout: float) -> Sentinel:
    return Sentinel(
        list(target.sentinels),
        sentinel_kwargs={"socket_connect_timeout": connect_timeout,
                         "socket_timeout": connect_timeout},
        socket_connect_timeout=connect_timeout,
        socket_timeout=max(connect_timeout, 10.0),
    )


def sentinel_redis(target: SentinelUrl, *, max_connections: int,
                   connect_timeout: float) -> Redis:
    """The command client for the primary ``target``'s sentinels name (bytes replies)."""
    client: Redis = _sentinel(target, connect_timeout).master_for(
        target.master_name,
        redis_class=Redis,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=max_connections,
        timeout=max(connect_timeout, 1.0) * 4,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
        decode_responses=False,
        **target.primary_kwargs(),
    )
    return client


class SentinelEndpoints:
    """Call it for the current primary's address, asked anew each time; ``aclose`` ends
    its connections to the sentinels."""

    def __init__(self, target: SentinelUrl, connect_timeout: float) -> None:
        self._target = target
        self._sentinel = _sentinel(target, connect_timeout)

    async def __call__(self) -> Endpoint:
        host, port = await self._sentinel.discover_master(self._target.master_name)
        return Endpoint(host=str(host), port=int(port), username=self._target.username,
                        password=self._target.password)

    async def aclose(self) -> None:
        await close_sentinels(self._sentinel)


async def close_sentinels(sentinel: Sentinel) -> None:
    """Close a ``Sentinel``'s own connections (redis-py leaves them to the caller)."""
    for client in sentinel.sentinels:
        await client.aclose()


def sync_sentinel_redis(target: SentinelUrl, *, timeout: float,
                        **kwargs: Any) -> redis.Redis:
    """A blocking client for the primary the sentinels name (the worker's, the CLI's);
    each new connection asks them anew. ``kwargs`` go to the primary's connections."""
    sentinel = redis.sentinel.Sentinel(
        list(target.sentinels),
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout})
    client: redis.Redis = sentinel.master_for(
        target.master_name, socket_timeout=timeout, socket_connect_timeout=timeout,
        **kwargs, **target.primary_kwargs())
    return client

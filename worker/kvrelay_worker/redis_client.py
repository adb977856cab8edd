"""The worker's Redis clients: every call ends, whatever Redis does."""

from __future__ import annotations

import redis

from kvrelay_worker.settings import WorkerSettings


def worker_redis(settings: WorkerSettings) -> redis.Redis:
    """The process's one client, over one connection pool that every worker thread borrows
    from. Connect and read/write timeouts: a Redis that stops answering makes calls raise
    ``TimeoutError`` (which callers retry or report) instead of holding the calling thread
    forever."""
    pool = redis.ConnectionPool.from_url(
        settings.redis_url, health_check_interval=30, socket_keepalive=True,
        socket_timeout=settings.redis_socket_timeout,
        socket_connect_timeout=settings.redis_socket_timeout,
        client_name=f"kvrelay-worker:{settings.worker_id}")
    return redis.Redis(connection_pool=pool)

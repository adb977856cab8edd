"""The worker's Redis clients: every call ends, whatever Redis does."""

from __future__ import annotations

from typing import Any

import redis

from kvrelay.sentinel_connect import sync_sentinel_redis
from kvrelay.sentinel_url import is_sentinel_url, parse_sentinel_url
from kvrelay_worker.settings import WorkerSettings


def worker_redis(settings: WorkerSettings) -> redis.Redis:
    """The process's one client, over one connection pool that every worker thread borrows
    from. Connect and read/write timeouts: a Redis that stops answering makes calls raise
    ``TimeoutError`` (which callers retry or report) instead of holding the calling thread
    forever. Behind sentinels each new connection asks them for the primary, so the
    callers' retries after a failover reach the new one."""
    common: dict[str, Any] = {
        "health_check_interval": 30, "socket_keepalive": True,
        "client_name": f"kvrelay-worker:{settings.worker_id}",
    }
    timeout = settings.redis_socket_timeout
    if is_sentinel_url(settings.redis_url):
        return sync_sentinel_redis(parse_sentinel_url(settings.redis_url), timeout=timeout,
                                   **common)
    common.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    pool = redis.ConnectionPool.from_url(settings.redis_url, **common)
    return redis.Redis(connection_pool=pool)


def replica_wait(settings: WorkerSettings) -> tuple[int, int]:
    """(replicas, timeout ms) that each job-state write waits for; (0, 0): none."""
    if not is_sentinel_url(settings.redis_url):
        return 0, 0
    target = parse_sentinel_url(settings.redis_url)
    return target.wait_replicas, target.wait_timeout_ms

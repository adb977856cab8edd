"""Waiting for a worker to advertise a prompt's prefix (placement tests)."""

from __future__ import annotations

import asyncio
import time

import redis

from kvrelay.keys import Keyspace
from kvrelay.prefix_filter import PrefixFilter
from kvrelay.protocol import decode_worker_info

# How long an SDK reuses its view of the workers (``PrefixPlacement.refresh_s``), plus margin.
CLIENT_VIEW_S = 1.2


def advertised_matches(url: str, worker_id: str, chain: list[int],
                       keys: Keyspace | None = None) -> int:
    """How many of ``chain``'s leading fingerprints ``worker_id``'s heartbeat holds."""
    client = redis.Redis.from_url(url)
    try:
        raw = client.get((keys or Keyspace()).worker_heartbeat(worker_id))
    finally:
        client.close()
    if raw is None:
        return 0
    return PrefixFilter.decode(decode_worker_info(raw).prefix_filter).leading_matches(chain)


async def wait_advertised(url: str, worker_id: str, chain: list[int],
                          within_s: float = 15.0) -> None:
    """Until ``worker_id`` advertises all of ``chain``, then until clients' views are
    refreshed past that heartbeat."""
    deadline = time.monotonic() + within_s
    while advertised_matches(url, worker_id, chain) < len(chain):
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {worker_id} never advertised the prefix")
        await asyncio.sleep(0.1)
    await asyncio.sleep(CLIENT_VIEW_S)

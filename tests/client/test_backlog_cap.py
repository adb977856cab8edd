"""A model's queue cap bounds its whole backlog: the shared queue and every worker queue
of it (prefix-aware placement puts jobs there), not each list on its own, so with two
workers and a cap of 20, at most 20 jobs wait, not 60.

Real Redis and Celery's producer; the two workers' own queues are filled as placement
fills them (a worker of the model registered in ``Keyspace.worker_queues``).
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from helpers.fake_worker import KEYS, announce

from kvrelay import AsyncClient, QueueFull

pytestmark = pytest.mark.timeout(60)

MODEL = "m-backlog"


async def backlog(raw: aioredis.Redis) -> int:
    total = int(await raw.llen(KEYS.queue(MODEL)))
    for worker in ("w-1", "w-2"):
        total += int(await raw.llen(KEYS.worker_queue(MODEL, worker)))
    return total


async def test_the_cap_counts_the_shared_queue_and_every_worker_queue(
        clean_redis_url: str, raw: aioredis.Redis) -> None:
    now_ms = int(time.time() * 1000)
    for worker in ("w-1", "w-2"):
        await announce(raw, worker, MODEL, ttl_ms=60_000)
        await raw.zadd(KEYS.worker_queues(MODEL), {worker: now_ms})
        await raw.lpush(KEYS.worker_queue(MODEL, worker), *[b"placed"] * 8)
    await raw.lpush(KEYS.queue(MODEL), *[b"shared"] * 3)
    assert await backlog(raw) == 19
    # A cap of 20 jobs waiting (max_queue 19: "refuse while more than 19 wait").
    async with AsyncClient(clean_redis_url, model=MODEL, max_queue=19) as client:
        first = client.stream("a", max_tokens=2)
        await first.start()
        assert await backlog(raw) == 20
        second = client.stream("b", max_tokens=2)
        with pytest.raises(QueueFull, match="holds 20 jobs, its limit is 20"):
            await second.start()
        # A worker takes one of its own: there is room for one more again.
        await raw.rpop(KEYS.worker_queue(MODEL, "w-2"))
        third = client.stream("c", max_tokens=2)
        await third.start()
        assert await backlog(raw) == 20
        for stream in (first, third):
            await stream.aclose()


async def test_jobs_a_dead_worker_held_keep_their_places(
        clean_redis_url: str, raw: aioredis.Redis) -> None:
    """Jobs whose lease expired (their worker died) will be pushed back onto the queue
    by live workers without asking: the cap holds their places."""
    await announce(raw, "w-1", MODEL, ttl_ms=60_000)
    now_ms = int(time.time() * 1000)
    await raw.zadd(KEYS.running_jobs(MODEL), {"orphan-1": now_ms - 5_000,
                                              "orphan-2": now_ms - 1_000,
                                              "alive-1": now_ms + 30_000})
    await raw.lpush(KEYS.queue(MODEL), *[b"shared"] * 2)
    async with AsyncClient(clean_redis_url, model=MODEL, max_queue=4) as client:  # cap 5
        first = client.stream("a", max_tokens=2)
        await first.start()  # 2 queued + 2 reserved: the 5th place
        second = client.stream("b", max_tokens=2)
        with pytest.raises(QueueFull, match="holds 5 jobs, its limit is 5"):
            await second.start()
        # One orphan was requeued and claimed (out of the running set): room again.
        await raw.zrem(KEYS.running_jobs(MODEL), "orphan-1")
        third = client.stream("c", max_tokens=2)
        await third.start()
        for stream in (first, third):
            await stream.aclose()

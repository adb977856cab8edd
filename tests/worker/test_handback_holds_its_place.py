"""A job a worker hands back (on shutdown) is pushed back onto the queue whatever the cap
says: it was admitted once and is never dropped. Its place is held from the moment the
worker marks the hand-back, so an admission racing the hand-back cannot take it, and the
copy counts once it is queued.

Real Redis: the worker's own scripts (``JobStore``) and the SDK's admission script.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis
from helpers.fake_worker import KEYS, announce

from kvrelay import AsyncClient, QueueFull
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(60)

MODEL = "m-handback"


@pytest.fixture
async def raw(clean_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(clean_redis_url)
    await announce(client, "w-1", MODEL, ttl_ms=60_000)
    yield client
    await client.aclose()


async def test_a_job_being_handed_back_holds_its_place_in_the_backlog(
        clean_redis_url: str, raw: aioredis.Redis) -> None:
    store = JobStore(redis.Redis.from_url(clean_redis_url),
                     WorkerSettings(redis_url=clean_redis_url, model_name=MODEL,
                                    worker_id="w-1"))
    assert store.claim("handed", '{"prompt": "p"}', "digest").status == "claimed"
    await raw.lpush(KEYS.queue(MODEL), b"waiting")
    # A cap of 2 jobs waiting: one waits, the running job takes no place.
    async with AsyncClient(clean_redis_url, model=MODEL, max_queue=1) as client:
        assert store.mark_handback("handed")
        racing = client.stream("racing", max_tokens=2)
        with pytest.raises(QueueFull, match="holds 2 jobs, its limit is 2"):
            await racing.start()
        # The copy is pushed (at the front, without the check) and the lease released:
        # it counts once, as a queued job.
        await raw.rpush(KEYS.queue(MODEL), b"handed")
        assert store.release_handback("handed")
        with pytest.raises(QueueFull, match="holds 2 jobs, its limit is 2"):
            await client.stream("later", max_tokens=2).start()
        await raw.rpop(KEYS.queue(MODEL))  # a worker takes the handed-back job
        admitted = client.stream("admitted", max_tokens=2)
        await admitted.start()
        assert await raw.llen(KEYS.queue(MODEL)) == 2
        await admitted.aclose()
    store.redis.close()

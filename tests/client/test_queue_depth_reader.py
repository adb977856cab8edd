"""``QueueDepthReader`` on a real Redis: a model's depth counts its shared queue and the
own queues of its workers, a queue nobody serves is found by the scan, and a read costs
the same few commands however many other keys Redis holds."""

from __future__ import annotations

import pytest
import redis
from helpers.redis_db import fresh_db_url
from redis.asyncio import Redis

from kvrelay.keys import Keyspace
from kvrelay.queue_depth import QueueDepthReader

pytestmark = pytest.mark.integration

DB = 9
KEYS = Keyspace()
FILLER = 5000  # other keys: job logs, records, leases of a busy deployment


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


async def test_depth_counts_shared_and_workers_own_queues(redis_url: str) -> None:
    url = fresh_db_url(redis_url, DB)
    raw = redis.Redis.from_url(url)
    # What a placement worker's Celery queue and heartbeat leave: its own list, and its
    # entry in the model's worker-queues set (a dead worker's stays until moved).
    raw.rpush(KEYS.queue("m"), "a", "b")
    raw.rpush(KEYS.worker_queue("m", "w1"), "c")
    raw.zadd(KEYS.worker_queues("m"), {"w1": 1, "w2": 2})
    raw.rpush(Keyspace("acme").queue("m"), "other tenant's")
    client = Redis.from_url(url)
    try:
        reader = QueueDepthReader(client, KEYS)
        (m,) = await reader.read()
        assert (m.model, m.queued, m.engine_waiting, m.workers, m.depth) == ("m", 3, 0, 0, 3)
        named = {q.model: q.depth for q in await reader.read(["idle"])}
        assert named == {"m": 3, "idle": 0}
        raw.delete(KEYS.queue("m"), KEYS.worker_queue("m", "w1"))
        assert [(q.model, q.depth) for q in await reader.read()] == [("m", 0)]  # seen at 0
        assert await reader.read() == []  # then forgotten: its lists are gone
    finally:
        await client.aclose()
        raw.close()


async def test_a_read_costs_the_same_whatever_the_keyspace(redis_url: str) -> None:
    url = fresh_db_url(redis_url, DB)
    raw = redis.Redis.from_url(url)
    pipe = raw.pipeline(transaction=False)
    for i in range(FILLER):
        pipe.set(KEYS.job_record(f"job{i}"), "x")
    pipe.execute()
    client = Redis.from_url(url)
    try:
        reader = QueueDepthReader(client, KEYS, scan_calls=2, scan_count=100)
        # The first read finds nothing (no queue yet) and leaves its cursor mid-keyspace.
        assert await reader.read() == []
        raw.rpush(KEYS.queue("hidden"), "job")
        reads = 0
        found: list[str] = []
        while not found:
            scans = _calls(raw, "scan")
            found = [q.model for q in await reader.read()]
            assert _calls(raw, "scan") - scans <= 2  # never more than its budget
            reads += 1
            # A cursor carried from read to read covers the keyspace in ~FILLER/200 reads
            # (a key added mid-pass may wait for the next pass). A reader that restarted
            # its scan at every read would see the same ~200 keys of the hash order each
            # time and miss the queue (odds 1 - 200/5000).
            assert reads <= 2 * (FILLER // 200) + 4, "the scan never reached the queue"
        assert found == ["hidden"]
    finally:
        await client.aclose()
        raw.close()

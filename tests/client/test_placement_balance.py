"""PrefixPlacement keeps the workers' loads within one job of each other: a job goes to the worker
holding its prefix only while that worker carries at most one job more than the least
loaded live worker; otherwise to the shared queue, where the first free worker takes it.

Why: a placed job waits behind its worker's own load, which the shared queue would have
balanced (measured: ``benchmarks/README.md``, placement). The heartbeats are written as
workers write them, to a fakeredis server.
"""

from __future__ import annotations

from typing import Any

from kvrelay.keys import Keyspace
from kvrelay.prefix_filter import PrefixFilter
from kvrelay.prefix_fingerprints import CHUNK_TOKENS, request_fingerprints
from kvrelay.prefix_placement import PrefixPlacement
from kvrelay.protocol import GenerateRequest, WorkerInfo, encode_worker_info

KEYS = Keyspace()
MODEL = "m"
REQUEST = GenerateRequest(job_id="job", model=MODEL,
                          prompt_token_ids=list(range(100, 100 + 2 * CHUNK_TOKENS)))


async def _heartbeat(redis: Any, worker_id: str, *, running: int, holds_prefix: bool) -> None:
    prefixes = PrefixFilter(request_fingerprints(REQUEST) if holds_prefix else [999])
    info = WorkerInfo(worker_id=worker_id, model=MODEL, host="h", pid=1, concurrency=16,
                      jobs_running=running, prefix_filter=prefixes.encode())
    await redis.sadd(KEYS.workers, worker_id)
    await redis.set(KEYS.worker_heartbeat(worker_id), encode_worker_info(info))


async def _placed(redis: Any, holder_running: int, other_running: int) -> str | None:
    await _heartbeat(redis, "holder", running=holder_running, holds_prefix=True)
    await _heartbeat(redis, "other", running=other_running, holds_prefix=False)
    return await PrefixPlacement(redis, KEYS).queue_for(REQUEST)


async def test_the_holder_gets_the_job_while_at_most_one_job_busier(fake_redis: Any) -> None:
    holder_queue = KEYS.celery_worker_queue(MODEL, "holder")
    assert await _placed(fake_redis, 2, 5) == holder_queue
    assert await _placed(fake_redis, 5, 5) == holder_queue
    assert await _placed(fake_redis, 6, 5) == holder_queue


async def test_a_holder_two_jobs_busier_than_another_worker_leaves_it_to_the_shared_queue(
        fake_redis: Any) -> None:
    assert await _placed(fake_redis, 7, 5) is None
    # Its own queue's backlog counts as load too.
    await fake_redis.rpush(KEYS.worker_queue(MODEL, "holder"), "a", "b")
    assert await _placed(fake_redis, 5, 5) is None

"""A send whose push onto the queue was refused is retried with the same ``job_id``.

Real processes: a primary under ``min-replicas-to-write 1`` with its replica, a Celery
worker on the simulated engine, the SDK. The first send reserves the job id, then Redis
starts refusing writes (``MISCONF``, a failed snapshot) before the job reaches the queue:
the push fails, and so does giving the id back. Once Redis takes writes again, the
caller retries the same request under the same id, as a careful caller does. Before, the
retry found the id held by its own request and attached to a job no worker would ever
see: no event, ``StreamTimeout`` (chaos seed 338). Now the retry pushes it, and a send
that did reach the queue is still attached to, never pushed twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis
from helpers.refusing_redis import ReplicatedPrimary
from helpers.worker_process import WorkerProcess

import kvrelay
from kvrelay import AsyncClient
from kvrelay.enqueue import CeleryEnqueuer
from kvrelay.keys import Keyspace
from kvrelay.protocol import GenerateRequest

pytestmark = pytest.mark.integration

MODEL = "simulated"
PROMPT = "a question the simulated engine answers"
KEYS = Keyspace()


def test_a_retry_pushes_a_job_whose_first_push_was_refused(
        primary: ReplicatedPrimary, tmp_path: Path) -> None:
    worker = WorkerProcess("w", primary.url, MODEL, tmp_path, concurrency=2,
                           simulated_step_ms=5).start()
    try:
        worker.wait_ready()
        asyncio.run(_send_refused_then_retry(primary))
        with primary.client() as client:
            assert client.hget(KEYS.job_record("j-refused"), "attempts") == b"1"
        assert worker.alive()
    finally:
        worker.stop()


async def _send_refused_then_retry(primary: ReplicatedPrimary) -> None:
    celery = CeleryEnqueuer(primary.url, connect_timeout=3)

    async def refused_from_now(request: GenerateRequest) -> None:
        # The id is reserved; from here on Redis refuses writes, the push included.
        await asyncio.to_thread(primary.misconf)
        await celery(request)

    async with AsyncClient(primary.url, model=MODEL, enqueuer=refused_from_now,
                           reconnect_timeout=1, stream_timeout=10) as first:
        # A typed error, not redis-py's reply: Redis is up but would not take the push.
        with pytest.raises(kvrelay.BrokerUnavailable, match="refused writes"):
            await first.generate(PROMPT, job_id="j-refused", max_tokens=8)
    with primary.client() as client:
        assert client.hget(KEYS.job_record("j-refused"), "digest") is not None  # still held
        assert client.llen(KEYS.celery_queue(MODEL)) == 0
    await asyncio.to_thread(primary.heal_misconf)

    async with AsyncClient(primary.url, model=MODEL, stream_timeout=10) as retry:
        done = await retry.generate(PROMPT, job_id="j-refused", max_tokens=8)
        assert len(done.choices[0].token_ids) == 8
        again = await retry.generate(PROMPT, job_id="j-refused", max_tokens=8)
        assert again.choices[0].token_ids == done.choices[0].token_ids


async def test_a_retry_of_a_job_still_in_the_queue_attaches(clean_redis_url: str) -> None:
    # No worker: the job waits in the queue. The push marked its record, so a retry of
    # the same request attaches to it instead of pushing a second copy.
    async with AsyncClient(clean_redis_url, model=MODEL, require_worker=False,
                           stream_timeout=10) as client:
        async with client.stream(PROMPT, job_id="j-queued", max_tokens=8) as first:
            async with client.stream(PROMPT, job_id="j-queued", max_tokens=8) as retry:
                assert first.job_id == retry.job_id == "j-queued"
                with redis.Redis.from_url(clean_redis_url) as direct:
                    assert direct.llen(KEYS.celery_queue(MODEL)) == 1

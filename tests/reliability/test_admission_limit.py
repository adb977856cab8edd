"""The workers' queue limit holds however many clients race to fill the queue.

A real worker advertises ``KVRELAY_MAX_QUEUE`` and is then killed, so nothing consumes
the queue. Eight clients (each with its own connections and enqueue threads) then start
80 jobs at once. Each push is checked and made in one Redis call, so exactly the limit
is admitted: the rest get ``QueueFull`` with the workers' retry hint, and nothing of theirs
reaches the queue. (A check-then-push client would overshoot; before the fix nothing was
refused at all without a client-side ``max_queue``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
from helpers.worker_process import WorkerProcess

import kvrelay
from kvrelay import AsyncClient
from kvrelay.keys import Keyspace

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
LIMIT = 20
CLIENTS = 8
JOBS_EACH = 10


async def _start(client: AsyncClient) -> kvrelay.AsyncStream | kvrelay.QueueFull:
    stream = client.stream(prompt_token_ids=[7, 8, 9], max_tokens=2)
    try:
        await stream.start()
    except kvrelay.QueueFull as refused:
        return refused
    return stream


async def test_server_side_limit_holds_against_racing_clients(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    worker = start_worker("limits", concurrency=1, max_queue=LIMIT, queue_retry_after=2.5)
    worker.kill()  # its limit stays; nothing consumes the queue any more
    clients = [
        AsyncClient(clean_redis_url, model=MODEL, require_worker=False) for _ in range(CLIENTS)
    ]
    try:
        for client in clients:
            await client.connect()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(_start(c) for c in clients for _ in range(JOBS_EACH))), 60
        )
        admitted = [o for o in outcomes if isinstance(o, kvrelay.AsyncStream)]
        refused = [o for o in outcomes if isinstance(o, kvrelay.QueueFull)]
        assert len(admitted) == LIMIT
        assert len(refused) == CLIENTS * JOBS_EACH - LIMIT
        assert {r.retry_after for r in refused} == {2.5}
        assert all(r.job_id and "limit is 20" in str(r) for r in refused)
        assert await clients[0].queue_length() == LIMIT
        raw = redis.Redis.from_url(clean_redis_url)
        try:
            # Only admitted jobs are in the queue: the refused ones left no message behind.
            messages = raw.lrange(KEYS.queue(MODEL), 0, -1)
        finally:
            raw.close()
        assert len(messages) == LIMIT
        queued_ids = {s.job_id for s in admitted}
        assert all(any(j.encode() in m for m in messages) for j in queued_ids)
        assert not any(r.job_id is not None and r.job_id.encode() in m
                       for r in refused for m in messages)
        # A client's own max_queue is checked in the same call ("refuse while more wait").
        async with AsyncClient(
            clean_redis_url, model="other", require_worker=False, max_queue=1
        ) as strict:
            results = [await _start(strict) for _ in range(3)]
        assert [type(r) for r in results] == [
            kvrelay.AsyncStream, kvrelay.AsyncStream, kvrelay.QueueFull]
    finally:
        for client in clients:
            await client.aclose()
    # A refused job was never enqueued: the client had nothing to abort.
    raw = redis.Redis.from_url(clean_redis_url)
    try:
        assert not any(raw.exists(KEYS.abort_flag(r.job_id or "")) for r in refused)
    finally:
        raw.close()


async def test_a_namespace_is_admitted_under_its_own_limit_and_queue(
    clean_redis_url: str,
) -> None:
    """A tenant's pushes land in its own prefixed list, counted against its own hash."""
    acme = Keyspace("acme")
    raw = redis.Redis.from_url(clean_redis_url)
    try:
        # What a worker of namespace acme advertises (and a limit the default one lacks).
        raw.hset(acme.queue_limit(MODEL), mapping={"max_queue": "2", "retry_after": "4.0"})
        async with AsyncClient(
            clean_redis_url, model=MODEL, require_worker=False, namespace="acme"
        ) as tenant:
            results = [await _start(tenant) for _ in range(3)]
        assert [type(r) for r in results] == [
            kvrelay.AsyncStream, kvrelay.AsyncStream, kvrelay.QueueFull]
        refused = results[2]
        assert isinstance(refused, kvrelay.QueueFull)
        assert refused.retry_after == 4.0
        assert raw.llen(acme.queue(MODEL)) == 2
        assert raw.llen(KEYS.queue(MODEL)) == 0
        assert raw.llen(acme.celery_queue(MODEL)) == 0  # not the unprefixed name either
    finally:
        raw.close()

"""Client test fixtures: a fakeredis server, a scripted worker playing the event
contract, and an ``AsyncClient`` wired to both (no Celery, no real Redis); and ``raw``, a
plain client of the real Redis for tests that need one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from helpers.fake_worker import completion_events, play, remember

from kvrelay import AsyncClient, event_log
from kvrelay.keys import Keyspace
from kvrelay.protocol import GenerateRequest

KEYS = Keyspace()  # the default namespace

Behaviour = Callable[["ScriptedWorker", GenerateRequest], Awaitable[None]]


async def default_behaviour(worker: ScriptedWorker, request: GenerateRequest) -> None:
    """Answer every job with "Hello" in two deltas."""
    await play(worker.redis, request.job_id, completion_events(["Hel", "lo"]))


class ScriptedWorker:
    """Injected as the client's enqueuer: records requests, runs ``behaviour`` for each."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.requests: list[GenerateRequest] = []
        self.behaviour: Behaviour | None = default_behaviour
        self.tasks: list[asyncio.Task[None]] = []
        self.fail_enqueue: BaseException | None = None

    async def enqueue(self, request: GenerateRequest) -> None:
        if self.fail_enqueue is not None:
            raise self.fail_enqueue
        self.requests.append(request)
        remember(request)
        # As the Celery push does in the same script: the record is marked enqueued.
        record = KEYS.job_record(request.job_id)
        if await self.redis.exists(record):
            await self.redis.hset(record, event_log.ENQUEUED_FIELD, "1")
        if self.behaviour is not None:
            self.tasks.append(asyncio.create_task(self.behaviour(self, request)))

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 5)


@pytest.fixture
async def raw(clean_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the real Redis, for the test's own reads and for the fake worker."""
    client = aioredis.Redis.from_url(clean_redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def fake_redis() -> AsyncIterator[Any]:
    client = fakeredis.aioredis.FakeRedis(server=fakeredis.FakeServer())
    yield client
    await client.aclose()


@pytest.fixture
def worker(fake_redis: Any) -> ScriptedWorker:
    return ScriptedWorker(fake_redis)


@pytest.fixture
async def make_client(fake_redis: Any, worker: ScriptedWorker) -> AsyncIterator[Any]:
    """Factory of clients on fakeredis (closed after the test); kwargs override defaults."""
    clients: list[AsyncClient] = []

    def make(**kwargs: Any) -> AsyncClient:
        options: dict[str, Any] = {
            "model": "m",
            "require_worker": False,
            "stream_timeout": 3.0,
            "redis": fake_redis,
            "enqueuer": worker.enqueue,
        }
        options.update(kwargs)
        client = AsyncClient(**options)
        clients.append(client)
        return client

    yield make
    await worker.drain()
    for c in clients:
        await asyncio.wait_for(c.aclose(), 10)


@pytest.fixture
def client(make_client: Any) -> AsyncClient:
    c: AsyncClient = make_client()
    return c
